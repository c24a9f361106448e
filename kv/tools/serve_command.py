"""`raftkv serve`: its flags, the NodeConfig they stand for, and running the node.

The flags come in two kinds. The main ones (`raftkv serve --help`) say who the member is, where it
listens, where its data lives and the protocol's timing. The machine-tuning ones (`raftkv serve
--help-tuning`, docs/tuning.md) fit a node to its machine; they are accepted as any flag but kept
out of the main help."""
from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path
from typing import Any

from kv.tools.arguments import (
    LOG_LEVELS,
    Formatter,
    byte_size,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from raft.core.config import CoreConfig
from raft.node.cluster_id import DEFAULT_CLUSTER_TOKEN
from raft.node.config import (
    DEFAULT_DATA_DIR,
    DEFAULT_LISTEN,
    DEFAULT_NODE_ID,
    Limits,
    NodeConfig,
    Security,
    StorageConfig,
    TLSFiles,
    Tuning,
    parse_peers,
)

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

# The exit code of a member that stopped because it was removed from the cluster: a failure (it no
# longer serves) that no restart mends (its id is never a member again), so an init system must not
# restart it, and one code of its own lets a systemd unit say so (RestartPreventExitStatus=).
# sysexits' EX_CONFIG, shown by systemd as status=78/CONFIG: raftkv exits with it for nothing else.
EXIT_REMOVED = 78

_CORE, _STORAGE, _LIMITS, _TUNING, _SECURITY = CoreConfig(), StorageConfig(), Limits(), Tuning(), Security()

# (flags, argparse keywords) of the machine-tuning flags.
TUNING_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--grpc-servers",), dict(type=positive_int, default=_TUNING.grpc_servers, metavar="N",
                               help="gRPC servers sharing --listen (SO_REUSEPORT); each accepts one call at a "
                                    "time, so more take calls from many client connections in faster")),
    (("--read-hold-ms",), dict(type=non_negative_float, default=_TUNING.read_hold_ms, metavar="MS",
                               help="on a busy leader, hold a linearizable read up to MS before its ReadIndex "
                                    "round so one round serves more reads; 0: off")),
    (("--read-hold-siblings",), dict(type=non_negative_int, default=_TUNING.read_hold_siblings, metavar="N",
                                     help="hold a read only when at least N other reads are waiting (a lone "
                                          "reader is never held)")),
    (("--read-spin-us",), dict(type=non_negative_int, default=_TUNING.read_spin_us, metavar="US",
                               help="while a lone linearizable read waits for its round, and US after it is "
                                    "served, the leader polls instead of sleeping: lower latency for one "
                                    "reader, at the price of a busy core for that long; 0: off")),
    (("--follower-yield-entries",), dict(type=non_negative_int, default=_TUNING.follower_yield_entries, metavar="N",
                                         help="a follower saving or applying more than N entries at once lets other "
                                              "processes on its CPU run first, and again every N entries applied, "
                                              "so that a lazy follower's batch does not hold up the processes on a "
                                              "write's path; 0: never")),
    (("--lazy-push-ms",), dict(type=non_negative_int, default=_CORE.lazy_push_ms, metavar="MS",
                               help="thrifty replication: new entries go at once only to the followers a "
                                    "majority needs; the others get full batches, and the rest at least every "
                                    "MS; 0: every follower gets every entry at once")),
    (("--eager-timeout-ms",), dict(type=positive_int, default=_CORE.eager_timeout_ms, metavar="MS",
                                   help="a follower that leaves a batch unanswered this long loses its place "
                                        "among those sent every entry at once (what a stopped follower costs a "
                                        "write); so does one that answers more than twice as slowly as another "
                                        "and by more than a tenth of this")),
    (("--eager-trial-every-ms",), dict(type=non_negative_int, default=_CORE.eager_trial_every_ms, metavar="MS",
                                       help="this often (and once soon after an election) a lazy follower is "
                                            f"tried as the eager one for {_CORE.eager_trial_ms} ms and kept if it "
                                            "answers clearly faster; 0: no trials")),
    (("--event-loop",), dict(choices=EVENT_LOOPS, default="auto",
                             help="the node's event loop; auto: uvloop when it is installed (faster), else asyncio")),
    (("--no-fsync",), dict(dest="fsync", action="store_false",
                           help="do not fsync the log before acknowledging (benchmarks only: a crash loses "
                                "acknowledged writes)")),
]


# NodeConfig's field names (as its errors name them) -> the flags that set them; filled as the
# serve parser is built.
FLAG_OF: dict[str, str] = {}


def _add(parser: argparse.ArgumentParser, *flags: str, **keywords: Any) -> None:
    action = parser.add_argument(*flags, **keywords)
    FLAG_OF[action.dest] = flags[0]


class _TuningHelp(argparse.Action):
    """--help-tuning: print the machine-tuning flags with their help, and exit."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="list the machine-tuning flags (docs/tuning.md) and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        shown = argparse.ArgumentParser(
            prog=f"{parser.prog}", formatter_class=Formatter, add_help=False, usage=argparse.SUPPRESS,
            description="Machine-tuning flags of `raftkv serve`: the defaults suit most machines; "
                        "docs/tuning.md says what each trades and when to change it.")
        for flags, keywords in TUNING_FLAGS:
            shown.add_argument(*flags, **keywords)
        shown.print_help()
        parser.exit()


def add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve", formatter_class=Formatter, help="run a node",
        description="Run one raftkv node until SIGINT/SIGTERM (exit code 0). With no flags: a single-node store "
                    f"in {DEFAULT_DATA_DIR} on {DEFAULT_LISTEN}. A member removed from the cluster (raftkv member "
                    f"remove) stops and exits with code {EXIT_REMOVED}, its data directory left as it is; under "
                    f"systemd with Restart=on-failure it would be started again, to exit again: list "
                    f"RestartPreventExitStatus={EXIT_REMOVED} in its unit.",
        epilog="a three-node cluster, one command per member (client ports 7001-7003, peer ports 7101-7103):\n"
               "  raftkv serve --id n1 --listen 127.0.0.1:7001 --data-dir ./data/n1 \\\n"
               "               --peers n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103")
    _add(serve, "--id", dest="node_id", default=DEFAULT_NODE_ID, help="this member's id")
    _add(serve, "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                       help="where to bind the gRPC server for clients")
    _add(serve, "--advertise-client", default=None, metavar="HOST:PORT",
                       help="where clients reach this member, told to the other members for their not-leader "
                            "hints and status (default: --listen; required when --listen binds a wildcard "
                            "address such as 0.0.0.0)")
    _add(serve, "--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="where the log, state and snapshots live")
    _add(serve, "--peers", default="", metavar="ID=HOST:PORT,...",
                       help="every member (this one included) and the PEER address where this node reaches it; "
                            "empty: a single-node cluster")
    _add(serve, "--listen-peer", default=None, metavar="HOST:PORT",
                       help="where to take the other members' connections (default: this member's address "
                            "in --peers, or with --join the one the cluster added it with)")
    _add(serve, "--join", default="", metavar="HOST:PORT,...",
                       help="join an existing cluster that added this member (raftkv member add): the client "
                            "addresses of some of its members, asked once, on the first start, for the cluster "
                            "id and the members; the data directory must be empty (see README, \"Changing the "
                            "members\")")
    _add(serve, "--strict-reconfig-check", type=_true_or_false, default=True, metavar="true|false",
                       help="refuse a membership change after which the voters the leader hears from would be "
                            "too few for a quorum (etcd's flag; false lets such a change through, and the "
                            "cluster then takes writes only once enough of its voters run)")
    _add(serve, "--cluster-id", default=None,
                       help="this cluster's id: peers refuse messages carrying another; fixed on the first start "
                            "and kept in --data-dir, after which a different one is refused (default: derived "
                            "from the member ids in --peers and --initial-cluster-token, not their addresses)")
    _add(serve, "--initial-cluster-token", default=DEFAULT_CLUSTER_TOKEN, metavar="TOKEN",
                       help="as etcd's flag: read on the first start only, when no --cluster-id is given, to "
                            "derive the cluster id; give clusters with the same member ids tokens of their own "
                            "so they refuse each other (default: etcd-cluster)")
    _add(serve, "--snapshot-threshold", type=positive_int, default=_STORAGE.snapshot_threshold,
                       metavar="N", help="take a snapshot after this many applied entries")
    _add(serve, "--election-timeout-ms", type=positive_int, default=_CORE.election_timeout_ms,
                       metavar="MS", help="election timeout T; a follower waits a random time in [T, 2T)")
    _add(serve, "--heartbeat-interval-ms", type=positive_int, default=_CORE.heartbeat_interval_ms,
                       metavar="MS", help="how often the leader heartbeats (must be below the election timeout)")
    _add(serve, "--reserve-free-bytes", type=byte_size, default=_STORAGE.reserve_free_bytes, metavar="SIZE",
         help="refuse new writes (DISK_FULL) while less than SIZE is free on --data-dir's disk, so a "
              "filling disk never leaves committed writes the state cannot take; writes resume by "
              "themselves once space is freed; 0: no check, a full disk is met by the write itself "
              "(default: 64MiB, one log segment)")
    _add(serve, "--log-max-bytes", type=byte_size, default=_STORAGE.log_max_bytes, metavar="SIZE",
         help="most space the log may take; past it writes are refused as DISK_FULL until a "
              "snapshot compacts the log (default: 8GiB)")
    _add(serve, "--state-max-bytes", type=byte_size, default=_STORAGE.state_max_bytes, metavar="SIZE",
         help="size of the state's LMDB map, the most the data may take (a sparse file: it costs "
              "only what is stored); past it writes are refused as DISK_FULL (default: 8GiB)")
    _add(serve, "--state-check-interval", type=non_negative_float, default=_STORAGE.state_check_interval_s,
         metavar="SECONDS", help="how often the members hash their states at one log index and compare: a "
              "member whose state disagrees with the majority's (or holds a value that fails its "
              "checksum) reports `corrupt` in status and stops serving; each check reads the whole "
              "state once; 0: never")
    _add(serve, "--auto-compaction-mode", choices=("periodic", "revision"), default=_STORAGE.auto_compaction_mode,
         help="what --auto-compaction-retention counts: periodic, time; revision, revisions (etcd's flag; "
              "default: periodic)")
    _add(serve, "--auto-compaction-retention", type=_retention, default=None, metavar="RETENTION",
         help="history of older key versions to keep before the leader compacts it by itself: with "
              "periodic, a duration as etcd writes them (1h, 30m, 90s) or hours as a number; with "
              "revision, a number of revisions; 0: keep it until a Compact (etcd's default). "
              "Default: 1h (raftkv's: native clients never compact)")
    _add(serve, "--lease-checkpoint-interval", type=non_negative_float, default=_STORAGE.lease_checkpoint_interval_s,
         metavar="SECONDS", help="how often the leader records the remaining TTL of leases longer than this, so "
              "that a new leader counts them from there rather than restarting them in full (etcd's "
              "--experimental-lease-checkpoint-interval); 0: never (default: 300)")
    _add(serve, "--max-value-bytes", type=positive_int, default=_LIMITS.max_value_bytes,
                       metavar="BYTES", help="largest value a client may write (a put of it must fit in --max-request-bytes)")
    _add(serve, "--max-request-bytes", type=byte_size, default=_LIMITS.max_request_bytes, metavar="SIZE",
         help="largest message a client may send (etcd's flag of the same name): gRPC refuses a larger "
              "one with RESOURCE_EXHAUSTED before reading it whole; a put of the largest key and "
              "--max-value-bytes value must fit, and so must a whole batch; at least 1MiB "
              "(default: 1572864, 1.5MiB)")
    _add_security_flags(serve)
    _add(serve, "--log-level", choices=LOG_LEVELS, default="info", help="logging verbosity")
    _add(serve, "--log-format", choices=("text", "json"), default="text",
         help="json: one object per line (time, level, member, term, logger, message) for log shippers")
    _add(serve, "--listen-metrics-urls", default="", metavar="http://HOST:PORT",
         help="as etcd's flag: serve /metrics (Prometheus), /health, /readyz and /livez there; "
              "comma-separated; default: nowhere (docs/operations.md)")
    _add(serve, "--listen-client-http-urls", default="", metavar="http://HOST:PORT",
         help="as etcd 3.5's flag: serve etcd's HTTP/JSON gateway there (what etcd 3.4 serves on its client "
              "URL: POST /v3/kv/range and the rest, the streaming /v3/watch and /v3/lease/keepalive, "
              "GET /version, /health, /metrics), for Patroni, etcd3gw, curl; gRPC (HTTP/2) sent to the same "
              "port is relayed to --listen, so `etcdctl --endpoints` can name it too. https://HOST:PORT "
              "with --cert-file (the client port's TLS and --client-cert-auth; no relay then); "
              "comma-separated; default: nowhere (docs/etcd-compatibility.md)")
    _add(serve, "--quota-backend-bytes", type=byte_size, default=_STORAGE.quota_backend_bytes, metavar="SIZE",
         help="as etcd's flag: once the state uses more, a NOSPACE alarm is raised and puts are refused "
              "cluster-wide (reads and deletes go on) until `raftkv alarm disarm`; 0: --state-max-bytes "
              "(default: 0)")
    _add(serve, "--help-tuning", action=_TuningHelp)
    for flags, keywords in TUNING_FLAGS:
        _add(serve, *flags, **{**keywords, "help": argparse.SUPPRESS})
    serve.set_defaults(run=run_serve, command_parser=serve)


def _add_security_flags(serve: argparse.ArgumentParser) -> None:
    """etcd's TLS flags, same names and meanings (docs/security.md)."""
    group = serve.add_argument_group("security (etcd's flags; docs/security.md)")
    for prefix, port in (("", "the client port (--listen)"), ("peer-", "the peer port (--listen-peer)")):
        _add(group, f"--{prefix}cert-file", type=Path, default=None, metavar="PEM",
             help=f"certificate of {port}: TLS on it (with --{prefix}key-file); plaintext without")
        _add(group, f"--{prefix}key-file", type=Path, default=None, metavar="PEM", help=f"private key of --{prefix}cert-file")
        _add(group, f"--{prefix}trusted-ca-file", type=Path, default=None, metavar="PEM",
             help="CA whose certificates are accepted from " + (
                 "clients (with --client-cert-auth)" if not prefix else
                 "the other members, both when they dial this node and when this node dials them"))
        _add(group, f"--{prefix}client-cert-auth", action="store_true",
             help="require a certificate signed by --{0}trusted-ca-file from every {1}".format(
                 prefix, "client" if not prefix else "member that dials this node; its certificate must name "
                                                     "the member id (CN or a DNS SAN) its messages claim"))
        # etcd's names: --client-crl-file for the client port (the field is TLSFiles.crl_file).
        _add(group, f"--{prefix or 'client-'}crl-file", dest=f"{prefix.replace('-', '_')}crl_file", type=Path,
             default=None, metavar="CRL",
             help="certificate revocation list (PEM or DER): a {0} whose certificate's serial it lists is refused; "
                  "read again when it changes".format("client" if not prefix else "member dialling this node"))
    _add(group, "--auth-token-ttl", type=non_negative_float, default=_SECURITY.auth_token_ttl_s, metavar="SECONDS",
         help="how long a token from `raftkv auth` login stays valid, when authentication is enabled")


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_DURATION_UNITS_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
# What --auto-compaction-retention means when not given, by mode.
_DEFAULT_RETENTION = {"periodic": 3600.0, "revision": 10_000.0}


def _retention(text: str) -> str:
    """--auto-compaction-retention as given: checked here, read by mode in _retention_for."""
    text = text.strip()
    if not re.fullmatch(r"\d+(\.\d+)?", text) and not re.fullmatch(f"({_DURATION_PART.pattern})+", text):
        raise argparse.ArgumentTypeError(f"invalid retention {text!r}: a number, or a duration such as 1h, 30m, 90s")
    return text


def _retention_for(mode: str, text: str | None) -> float:
    """Seconds (periodic: a plain number is hours, as etcd reads it) or revisions (revision)."""
    if text is None:
        return _DEFAULT_RETENTION[mode]
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text) * (3600.0 if mode == "periodic" else 1.0)
    if mode == "revision":
        raise SystemExit(f"raftkv serve: error: --auto-compaction-retention {text}: a number of revisions "
                         "with --auto-compaction-mode revision")
    return sum(float(number) * _DURATION_UNITS_S[unit] for number, unit in _DURATION_PART.findall(text))


def _true_or_false(text: str) -> bool:
    """etcd's boolean flag values: --strict-reconfig-check=false."""
    if text.lower() in ("true", "1"):
        return True
    if text.lower() in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: give true or false")


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The NodeConfig `raftkv serve` flags stand for. Raises ValueError on inconsistent flags."""
    election = args.election_timeout_ms
    # The lease must stay below the election timeout; keep the default's 90 % ratio when T changes.
    core = CoreConfig(election_timeout_ms=election, heartbeat_interval_ms=args.heartbeat_interval_ms,
                      lease_ms=min(_CORE.lease_ms, election * 9 // 10), lazy_push_ms=args.lazy_push_ms,
                      eager_timeout_ms=args.eager_timeout_ms, eager_trial_every_ms=args.eager_trial_every_ms)
    config = NodeConfig(
        node_id=args.node_id, listen=args.listen, advertise_client=args.advertise_client,
        peers=parse_peers(args.peers), join=bool(args.join), listen_peer=args.listen_peer, data_dir=args.data_dir,
        cluster_id=args.cluster_id, initial_cluster_token=args.initial_cluster_token, core=core,
        strict_reconfig_check=args.strict_reconfig_check,
        storage=StorageConfig(fsync=args.fsync, snapshot_threshold=args.snapshot_threshold,
                              reserve_free_bytes=args.reserve_free_bytes, log_max_bytes=args.log_max_bytes,
                              state_max_bytes=args.state_max_bytes, quota_backend_bytes=args.quota_backend_bytes,
                              state_check_interval_s=args.state_check_interval,
                              lease_checkpoint_interval_s=args.lease_checkpoint_interval,
                              auto_compaction_mode=args.auto_compaction_mode,
                              auto_compaction_retention=_retention_for(args.auto_compaction_mode,
                                                                       args.auto_compaction_retention)),
        limits=Limits(max_value_bytes=args.max_value_bytes, max_request_bytes=args.max_request_bytes),
        tuning=Tuning(grpc_servers=args.grpc_servers, read_hold_ms=args.read_hold_ms,
                      read_hold_siblings=args.read_hold_siblings, read_spin_us=args.read_spin_us,
                      follower_yield_entries=args.follower_yield_entries),
        security=Security(
            client=TLSFiles(args.cert_file, args.key_file, args.trusted_ca_file, args.client_cert_auth,
                            args.crl_file),
            peer=TLSFiles(args.peer_cert_file, args.peer_key_file, args.peer_trusted_ca_file,
                          args.peer_client_cert_auth, args.peer_crl_file),
            auth_token_ttl_s=args.auth_token_ttl),
        listen_metrics_urls=args.listen_metrics_urls, listen_client_http_urls=args.listen_client_http_urls)
    config.validate_addresses()
    config.security.check_files()
    return config


def in_flags(message: str) -> str:
    """A configuration error as the command line says it: field names become the flags that set
    them (NodeConfig's errors name fields, as embedded users set fields)."""
    flags = {field: flag for field, flag in FLAG_OF.items() if field != "help_tuning"}
    names = re.compile(r"\b(" + "|".join(sorted(map(re.escape, flags), key=len, reverse=True)) + r")\b")
    return names.sub(lambda m: flags[m.group(1)], message)


def run_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        config = node_config(args)
    except ValueError as bad:
        parser.error(in_flags(str(bad)))  # exits 2 with the usage line
    from kv.server.log_format import configure_logging  # no dependency beyond the standard library
    configure_logging(args.log_level, args.log_format, config.node_id)
    try:
        # Imported here: the client commands do not need the server's dependencies.
        from kv.server.server import serve
    except ImportError as missing:
        print(f"raftkv serve: error: the server cannot start: {missing}", file=sys.stderr)
        return 1
    if args.join:
        from kv.server.join import JoinError, joined_config
        from kv.server.tls import member_channel_credentials
        try:
            config = joined_config(config, [e.strip() for e in args.join.split(",") if e.strip()],
                                   member_channel_credentials(config.security))
        except (JoinError, ValueError) as e:
            print(f"raftkv serve: error: cannot join: {e}", file=sys.stderr)
            return 1
    if not serve(config, args.event_loop):
        return 0
    logging.getLogger(__name__).error(
        "node %s exits with code %d: it was removed from the cluster; its data directory %s is left as it is; "
        "a systemd unit should list RestartPreventExitStatus=%d, else Restart=on-failure starts it again "
        "only for it to exit again", config.node_id, EXIT_REMOVED, config.data_dir, EXIT_REMOVED)
    return EXIT_REMOVED
