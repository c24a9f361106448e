"""The `raftkv` command (also `python -m kv`): run a node, talk to a cluster, start a local one."""
from __future__ import annotations

import argparse
import base64
import importlib.metadata
import itertools
import json
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from kv.tools.grpc_io import prefer_polling_io_manager

# Before the imports below pull in grpc: gRPC reads its I/O manager choice when first imported.
POLLING_IO_CHOSEN = prefer_polling_io_manager()

from kv.client.client import CONSISTENCY, Client, parse_endpoints, to_bytes  # noqa: E402  (after the gRPC runtime choice)
from kv.errors import RaftKVError
from kv.tools.spark import cli as spark_cli
from snapshot.errors import SnapshotError
from kv.tools.arguments import (LOG_LEVELS, Formatter, default_endpoints, endpoints_help, non_negative_int, port,
                                positive_float, positive_int)
from kv.tools.serve_command import add_serve_parser
from raft.log import LogStoreError
from raft.node.config import DEFAULT_LISTEN, DEFAULT_NODE_ID, parse_peers
from raftkv_proto.key_ranges import prefix_end

DEFAULT_ENDPOINTS = DEFAULT_LISTEN
DISTRIBUTION = "raftkv"  # [project] name in pyproject.toml
# Exit codes: 1 for a failed request or an absent key (argparse exits 2 for a bad command line).
EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftkv", formatter_class=Formatter,
        description="raftkv: a replicated key-value store on Raft (DLedger style), LMDB and gRPC.",
        epilog="examples:\n  raftkv serve                       a single-node store in ./raftkv-data on 127.0.0.1:7001\n"
               "  raftkv cluster up --nodes 3         a local three-node cluster\n"
               "  raftkv cluster restart n1           start its member n1 again after it died\n"
               "  raftkv put user/1 alice\n  raftkv get user/1\n  raftkv status --endpoints 127.0.0.1:7001,127.0.0.1:7002\n"
               "  export RAFTKV_ENDPOINTS=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003\n"
               "  raftkv endpoint health              exit 1 when a member is unhealthy")
    parser.add_argument("--version", action="version", version=f"raftkv {package_version()}",
                        help="print raftkv's version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_serve_parser(commands)
    client_options = _client_options()
    _add_put(commands, client_options)
    _add_get(commands, client_options)
    _add_delete(commands, client_options)
    _add_scan(commands, client_options)
    _add_status(commands, client_options)
    _add_endpoint(commands, client_options)
    _add_cluster(commands)
    _add_snapshot(commands)
    spark_cli.add_parsers(commands)  # export / import (pyarrow is imported only when they run)
    _add_bench(commands)
    return parser


def package_version() -> str:
    """The installed distribution's version; from a source checkout that was never installed
    (PYTHONPATH=...), the version its pyproject.toml declares, so --version still says something
    true."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown (not installed)"


# How long a command that talks to a cluster tries, retries included, unless --timeout says.
# (etcdctl's --command-timeout is 5 s; a snapshot streams the whole state.)
COMMAND_TIMEOUT_S = 5.0
SNAPSHOT_SAVE_TIMEOUT_S = 600.0


def _client_options(timeout: float = COMMAND_TIMEOUT_S) -> argparse.ArgumentParser:
    """--endpoints / --timeout, for the commands that talk to a cluster. A parent parser's options
    are shared by every command built from it (set_defaults on one would change them all), so a
    command with another default timeout gets a parent of its own."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--endpoints", default=default_endpoints(DEFAULT_ENDPOINTS), metavar="HOST:PORT,...",
                         help=endpoints_help(DEFAULT_ENDPOINTS))
    options.add_argument("--timeout", type=positive_float, default=timeout, metavar="SECONDS",
                         help="give up (and exit 1) after this long, retries included")
    return options


def _add_put(commands: Any, client_options: argparse.ArgumentParser) -> None:
    put = commands.add_parser(
        "put", parents=[client_options], formatter_class=Formatter, help="write a value",
        description="Write VALUE under KEY; prints the raft index. The value can also come from stdin\n"
                    "(VALUE '-') or from a file (--value-file), as bytes, unchanged: binary data and\n"
                    "trailing newlines are kept. To write a literal '-', put it in a file and use\n"
                    "--value-file.",
        epilog="examples:\n  raftkv put user/1 alice\n  gzip -c report.txt | raftkv put reports/1 -\n"
               "  raftkv put config/app --value-file app.yaml")
    put.add_argument("key", metavar="KEY", help="the key (UTF-8, at most 511 bytes)")
    put.add_argument("value", metavar="VALUE", nargs="?", default=None,
                     help="the value (UTF-8); '-' reads it from stdin")
    put.add_argument("--value-file", type=Path, default=None, metavar="PATH",
                     help="read the value from this file instead of VALUE")
    _add_json(put, '{"key": KEY, "index": N}')
    put.set_defaults(run=_run_put, command_parser=put)


def _add_get(commands: Any, client_options: argparse.ArgumentParser) -> None:
    get = commands.add_parser("get", parents=[client_options], formatter_class=Formatter,
                              help="read a value", description="Print the value under KEY; exit 1 when it is absent.")
    get.add_argument("key", metavar="KEY", help="the key")
    _add_consistency(get)
    _add_json(get, '{"key": KEY, "value": VALUE or null, "found": true or false}')
    get.set_defaults(run=_run_get, command_parser=get)


def _add_delete(commands: Any, client_options: argparse.ArgumentParser) -> None:
    delete = commands.add_parser("delete", parents=[client_options], formatter_class=Formatter,
                                 help="delete a key", description="Delete KEY; prints whether it existed.")
    delete.add_argument("key", metavar="KEY", help="the key")
    _add_json(delete, '{"key": KEY, "deleted": true or false}')
    delete.set_defaults(run=_run_delete, command_parser=delete)


def _add_scan(commands: Any, client_options: argparse.ArgumentParser) -> None:
    scan = commands.add_parser(
        "scan", parents=[client_options], formatter_class=Formatter, help="list keys in order",
        description="Print KEY<TAB>VALUE lines in key order: keys starting with --prefix, or in\n"
                    "[--start, --end). Keys and values are escaped as in a Python bytes literal\n"
                    "(\\t, \\n, \\r, \\\\, \\xNN for other unprintable bytes and invalid UTF-8),\n"
                    "so a line is always one pair; printable UTF-8 is kept as it is. When --limit\n"
                    "cuts the listing short, stderr says so.")
    scan.add_argument("--prefix", default=None, help="only keys starting with this")
    scan.add_argument("--start", default=None, help="first key of the range (inclusive)")
    scan.add_argument("--end", default=None, help="end of the range (exclusive; default: the last key)")
    scan.add_argument("--limit", type=non_negative_int, default=100, metavar="N",
                      help="at most N pairs; 0: all of them, fetched a page at a time")
    _add_consistency(scan)
    _add_json(scan, '{"kvs": [{"key": KEY, "value": VALUE}, ...], "count": N, "more": true when --limit '
                    'cut it short}')
    scan.set_defaults(run=_run_scan, command_parser=scan)


def _add_status(commands: Any, client_options: argparse.ArgumentParser) -> None:
    status = commands.add_parser("status", parents=[client_options], formatter_class=Formatter,
                                 help="show each member's role and indexes",
                                 description="Ask every endpoint for its status and print what answered; an "
                                             "endpoint that did not answer shows its error, and the exit code "
                                             "is then 1.")
    status.add_argument("--json", action="store_true",
                        help="print a JSON list with one object per endpoint (id, role, term, leader, "
                             "commit_index, applied_index, snapshot_index, peers on the leader)")
    status.set_defaults(run=_run_status, command_parser=status)


def _add_endpoint(commands: Any, client_options: argparse.ArgumentParser) -> None:
    endpoint = commands.add_parser("endpoint", formatter_class=Formatter, help="check the health of each endpoint",
                                   description="Check the cluster members named by --endpoints one by one.")
    actions = endpoint.add_subparsers(dest="action", metavar="ACTION", required=True)
    health = actions.add_parser(
        "health", parents=[client_options], formatter_class=Formatter,
        help="check that each endpoint serves linearizable reads",
        description="For each endpoint, in parallel: a linearizable read through it (a quorum must\n"
                    "answer), then its status, which must know a leader and raise no alarm (corrupt\n"
                    "state, full disk, rejoining after lost data). One line per endpoint, as etcdctl:\n"
                    "  ADDRESS is healthy: took X ms\n"
                    "  ADDRESS is unhealthy: REASON\n"
                    "Exit code 1 when any endpoint is unhealthy.")
    health.add_argument("--json", action="store_true",
                        help="print a JSON list with one object per endpoint: endpoint, health (true or "
                             "false), took_ms, and error when unhealthy")
    health.set_defaults(run=_run_endpoint_health, command_parser=health)


def _add_cluster(commands: Any) -> None:
    cluster = commands.add_parser("cluster", formatter_class=Formatter, help="run a local cluster",
                                  description="Run a local cluster of raftkv nodes for trying raftkv out.")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up", formatter_class=Formatter, help="start a local cluster and wait for Ctrl-C",
        description="Start N `raftkv serve` processes on 127.0.0.1 (n1 takes clients on --base-port and peers\n"
                    "on --base-peer-port, n2 on the next ports, ...), print their endpoints, and watch them.\n"
                    "A member that dies (kill -9 the leader to try failover) is reported once on stderr with\n"
                    "its log and the command that starts it again, `raftkv cluster restart ID`; the others\n"
                    "keep running. Ctrl-C or SIGTERM stops every member, those started again by\n"
                    "`cluster restart` too, and exits 0. It exits 1 when it cannot start or when no member\n"
                    "is left running. DATA_DIR/cluster.json names the members' commands and pids while it\n"
                    "runs.",
        epilog="example, failover:\n  raftkv cluster up --nodes 3\n"
               "  (in another terminal) raftkv status --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003\n"
               "  kill -9 <the leader's pid>          cluster up reports it; the others elect a new leader\n"
               "  raftkv cluster restart <its id>     it starts again and catches up")
    up.add_argument("--nodes", type=positive_int, default=3, help="how many members")
    up.add_argument("--base-port", type=port, default=7001, help="n1's client port; the others follow")
    up.add_argument("--base-peer-port", type=port, default=None,
                    help="n1's peer port; the others follow (default: --base-port + 100)")
    up.add_argument("--data-dir", type=Path, default="./raftkv-cluster",
                    help="each member keeps its data in DATA_DIR/<id> and logs to DATA_DIR/<id>.log")
    up.add_argument("--no-fsync", dest="fsync", action="store_false", help="pass --no-fsync to every member")
    up.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="the members' logging verbosity")
    up.set_defaults(run=_run_cluster_up, command_parser=up)
    restart = actions.add_parser(
        "restart", formatter_class=Formatter, help="start a member of a running `cluster up` again",
        description="Start member ID of the `raftkv cluster up` running with --data-dir again, with the\n"
                    "command it was first started with, detached, appending to its log. It catches up\n"
                    "from the others. Refused while that member runs (its data directory is held) and\n"
                    "when no `cluster up` runs there. `cluster up` reports the new pid and stops the\n"
                    "member on Ctrl-C with the others.")
    restart.add_argument("node_id", metavar="ID", help="the member, as `cluster up` named it (n1, n2, ...)")
    restart.add_argument("--data-dir", type=Path, default="./raftkv-cluster",
                         help="the --data-dir that `cluster up` was given")
    restart.set_defaults(run=_run_cluster_restart, command_parser=restart)


def _add_snapshot(commands: Any) -> None:
    snap = commands.add_parser("snapshot", formatter_class=Formatter, help="save, inspect and restore snapshots",
                               description="Back up a cluster to a snapshot file, check one, or seed a new "
                                           "cluster from one.")
    actions = snap.add_subparsers(dest="action", metavar="ACTION", required=True)
    save = actions.add_parser("save", parents=[_client_options(SNAPSHOT_SAVE_TIMEOUT_S)], formatter_class=Formatter,
                              help="stream a consistent snapshot from the leader to FILE",
                              description="Ask the leader for a snapshot holding every write acknowledged "
                                          "before this command (confirmed by a ReadIndex round), stream it to "
                                          "FILE and verify its size and sha256.")
    save.add_argument("file", type=Path, metavar="FILE")
    save.set_defaults(run=_run_snapshot_save, command_parser=save)
    inspect = actions.add_parser("inspect", formatter_class=Formatter,
                                 help="print a snapshot's manifest and key count, verify its checksum",
                                 description="Exit code 1 when the file does not verify.")
    inspect.add_argument("file", type=Path, metavar="FILE")
    inspect.set_defaults(run=_run_snapshot_inspect, command_parser=inspect)
    restore = actions.add_parser(
        "restore", formatter_class=Formatter, help="prepare a data directory for a new cluster from FILE",
        description="Create --data-dir (which must be empty or absent) so that `raftkv serve` with the same "
                    "--id, --peers and --data-dir starts a NEW cluster holding the snapshot's data. The new "
                    "cluster gets a new cluster id, so it cannot be confused with the old one; for a multi-node "
                    "cluster restore every member from the same file with the same --cluster-id.",
        epilog="example, three members:\n"
               "  raftkv snapshot restore backup.snap --data-dir ./data/n1 --id n1 --peers $PEERS --cluster-id c-restored\n"
               "  (same for n2 and n3), then raftkv serve --id n1 --data-dir ./data/n1 --peers $PEERS")
    restore.add_argument("file", type=Path, metavar="FILE")
    restore.add_argument("--data-dir", type=Path, required=True, help="the new member's data directory")
    restore.add_argument("--id", dest="node_id", default=DEFAULT_NODE_ID, help="the new member's id")
    restore.add_argument("--peers", default="", metavar="ID=HOST:PORT,...",
                         help="the new cluster's members and their peer addresses, as `raftkv serve --peers` "
                              "will name them (default: this one alone)")
    restore.add_argument("--cluster-id", default=None, help="the new cluster's id (default: a new random one)")
    restore.set_defaults(run=_run_snapshot_restore, command_parser=restore)


def _add_bench(commands: Any) -> None:
    from kv.tools.bench.cli import add_arguments
    bench = commands.add_parser("bench", formatter_class=Formatter,
                                help="benchmark a local cluster, optionally against etcd",
                                description="Start a local three-node raftkv cluster (fsync on) and run the standard "
                                            "workloads W1..W9; --compare etcd runs a three-member etcd cluster side "
                                            "by side and prints raftkv / etcd ratios.")
    add_arguments(bench)
    bench.set_defaults(run=_run_bench, command_parser=bench)


def _run_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from kv.tools.bench.cli import run
    return run(args, parser)


def _add_json(parser: argparse.ArgumentParser, shape: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print JSON, keys and values in base64 (as etcdctl): {shape}")


def _add_consistency(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consistency", choices=tuple(CONSISTENCY), default="linearizable",
                        help="linearizable: confirmed by a quorum; lease: the leader's lease; stale: any node's local state")


# ---- client commands -----------------------------------------------------------------------

def _client(args: argparse.Namespace) -> Client:
    return Client(args.endpoints, timeout=args.timeout)


def _write_line(data: bytes, out: TextIO) -> None:
    """Values are bytes: write them as they are, not as Python's repr."""
    out.flush()
    out.buffer.write(data + b"\n")
    out.buffer.flush()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _run_put(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    value = _put_value(args, parser)
    with _client(args) as client:
        index = client.put(args.key, value)
    print(json.dumps({"key": _b64(to_bytes(args.key)), "index": index}) if args.json else f"OK index={index}")
    return 0


STDIN_VALUE = "-"


def _put_value(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | bytes:
    """VALUE as given, or the bytes of stdin ('-') or of --value-file, undecoded: a value may be
    binary, and a trailing newline is part of it."""
    if args.value is not None and args.value_file is not None:
        parser.error("give VALUE or --value-file, not both")
    if args.value_file is not None:
        return args.value_file.read_bytes()  # OSError: one error line, exit 1 (main)
    if args.value is None:
        parser.error("the following arguments are required: VALUE (or '-' for stdin, or --value-file PATH)")
    if args.value == STDIN_VALUE:
        return sys.stdin.buffer.read()
    return args.value


def _run_get(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with _client(args) as client:
        value = client.get(args.key, consistency=args.consistency)
    if args.json:
        print(json.dumps({"key": _b64(to_bytes(args.key)), "value": None if value is None else _b64(value),
                          "found": value is not None}))
    if value is None:
        print(f"not found: {args.key}", file=sys.stderr)
        return EXIT_FAILED
    if not args.json:
        _write_line(value, sys.stdout)
    return 0


def _run_delete(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with _client(args) as client:
        existed = client.delete(args.key)
    if args.json:
        print(json.dumps({"key": _b64(to_bytes(args.key)), "deleted": existed}))
    else:
        print("deleted" if existed else "not found (nothing to delete)")
    return 0


def _run_scan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.prefix is not None and (args.start is not None or args.end is not None):
        parser.error("give either --prefix or --start/--end, not both")
    with _client(args) as client:
        if args.limit:
            page = _scan_page(client, args)
            pairs: Iterable[Pair] = page[:args.limit]
            more = len(page) > args.limit
        else:
            pairs, more = itertools.chain.from_iterable(_scan_pages(client, args)), False
        shown = _print_scan_json(pairs, more) if args.json else _print_scan_lines(pairs)
    if more:
        print(f"raftkv scan: {shown} keys shown, more exist; --limit 0 shows all", file=sys.stderr)
    return 0


Pair = tuple[bytes, bytes]
# --limit 0 lists everything in pages of this many pairs, printed as they come (each page is
# consistent on its own, as every page of a scan is).
SCAN_ALL_PAGE = 1000


def _scan_page(client: Client, args: argparse.Namespace) -> list[Pair]:
    """Up to --limit pairs and one more: the extra one tells that the limit cut the listing short."""
    return client.scan(prefix=args.prefix, start=args.start, end=args.end, limit=args.limit + 1,
                       consistency=args.consistency)


def _scan_pages(client: Client, args: argparse.Namespace) -> Iterator[list[Pair]]:
    """Every pair in the range, a page at a time, so that listing a large store holds one page."""
    if args.prefix is not None:
        start, end = to_bytes(args.prefix), prefix_end(to_bytes(args.prefix))  # b"": to the last key
    else:
        start, end = to_bytes(args.start or b""), to_bytes(args.end or b"")
    while True:
        page = client.scan(start=start, end=end or None, limit=SCAN_ALL_PAGE, consistency=args.consistency)
        yield page
        if len(page) < SCAN_ALL_PAGE:
            return
        start = page[-1][0] + b"\x00"  # the smallest key after the last one listed


def _print_scan_lines(pairs: Iterable[Pair]) -> int:
    """KEY<TAB>VALUE lines, escaped; returns how many."""
    shown = 0
    for key, value in pairs:
        _write_line(escape(key) + b"\t" + escape(value), sys.stdout)
        shown += 1
    return shown


def _print_scan_json(pairs: Iterable[Pair], more: bool) -> int:
    kvs = [{"key": _b64(key), "value": _b64(value)} for key, value in pairs]
    print(json.dumps({"kvs": kvs, "count": len(kvs), "more": more}))
    return len(kvs)


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape(data: bytes) -> bytes:
    """`data` as the body of a Python bytes literal would spell it, except that printable UTF-8
    stays as it is: a tab, newline or binary byte in a key or value cannot break scan's lines, and
    codecs.escape_decode gives the bytes back."""
    if data.isascii() and data.decode("ascii").isprintable() and b"\\" not in data:
        return data  # the common case, untouched
    return "".join(_escape_char(c) for c in data.decode("utf-8", "surrogateescape")).encode("utf-8")


def _escape_char(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if "\udc80" <= char <= "\udcff":  # a byte that is not UTF-8, as surrogateescape keeps it
        return f"\\x{ord(char) - 0xdc00:02x}"
    if char.isprintable():
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8"))


def _run_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with _client(args) as client:
        statuses = client.status()
    print(json.dumps(statuses, indent=2) if args.json else format_status_table(statuses))
    # An operator (or a script) asking for every member's status wants to know that one is missing.
    return EXIT_FAILED if any("error" in s for s in statuses) else 0


# etcdctl reads the key "health" for its check; a read, so it changes nothing.
HEALTH_KEY = b"health"


def _run_endpoint_health(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    addresses = parse_endpoints(args.endpoints)
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        reports = list(pool.map(lambda address: check_health(address, args.timeout), addresses))
    if args.json:
        print(json.dumps(reports, indent=2))
    for report in reports if not args.json else ():
        verdict = f"healthy: took {report['took_ms']:.1f} ms" if report["health"] else f"unhealthy: {report['error']}"
        print(f"{report['endpoint']} is {verdict}")
    return 0 if all(report["health"] for report in reports) else EXIT_FAILED


def check_health(address: str, timeout: float) -> dict[str, Any]:
    """One endpoint's health: {"endpoint", "health", "took_ms"} and "error" when unhealthy."""
    began = time.monotonic()
    with Client([address], timeout=timeout) as client:
        error = _health_problem(client)
    report: dict[str, Any] = {"endpoint": address, "health": error is None,
                              "took_ms": round((time.monotonic() - began) * 1000, 3)}
    if error is not None:
        report["error"] = error
    return report


def _health_problem(client: Client) -> str | None:
    """Why the client's one endpoint is unhealthy, or None. The read goes first: it proves a quorum
    answers through this endpoint, and its error names its kind (UNAVAILABLE, TIMEOUT, ...)."""
    try:
        client.get(HEALTH_KEY, consistency="linearizable")
    except RaftKVError as error:
        return _describe(error)
    (status,) = client.status()
    if "error" in status:
        return f"status: {status['error']}"
    for alarm, reason in (("corrupt", "corrupt state: {}"), ("disk_full", "disk full (writes are refused)"),
                          ("rejoining", "rejoining after losing its data (still catching up)")):
        if status.get(alarm):
            return reason.format(status[alarm])
    return None if status.get("leader") else "no leader known"


STATUS_COLUMNS = ("address", "id", "role", "term", "leader", "commit_index", "applied_index", "snapshot_index")


def format_status_table(statuses: Sequence[dict[str, Any]]) -> str:
    """One row per endpoint; an unreachable one shows its error instead."""
    header = [c.upper() for c in STATUS_COLUMNS]
    rows = [["-" if s.get(c) is None else str(s[c]) for c in STATUS_COLUMNS] for s in statuses if "error" not in s]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(STATUS_COLUMNS))]
    widths[0] = max([widths[0]] + [len(s["address"]) for s in statuses if "error" in s])
    lines = []
    next_row = iter(rows)  # the rows of the answering endpoints, in order
    for status in statuses:
        if "error" in status:
            lines.append(f"{status['address'].ljust(widths[0])}  error: {status['error']}")
        else:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(next(next_row), widths)).rstrip())
    return "\n".join(["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), *lines])


# ---- snapshots -----------------------------------------------------------------------------

def _run_snapshot_save(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    def progress(received: int, total: int) -> None:
        if sys.stderr.isatty() or received == total:
            width = 30
            done = width * received // max(total, 1)
            print(f"\r[{'#' * done}{'.' * (width - done)}] {received / 1e6:8.1f} / {total / 1e6:.1f} MB",
                  end="" if received < total else "\n", file=sys.stderr, flush=True)

    with _client(args) as client:
        manifest = client.save_snapshot(args.file, timeout=args.timeout, progress=progress)
    size = args.file.stat().st_size
    print(f"saved {args.file}: index {manifest['index']} term {manifest['term']}, {manifest['key_count']} keys, "
          f"{size} bytes, payload sha256 {manifest['sha256']}")
    return 0


def _run_snapshot_inspect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    report = Client.inspect_snapshot(args.file)
    print(json.dumps(report, indent=2, default=str))
    return 0 if report.get("checksum_ok") and not report.get("error") else EXIT_FAILED


def _run_snapshot_restore(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    peers = parse_peers(args.peers) if args.peers else {args.node_id: DEFAULT_LISTEN}
    cluster_id = Client.restore_snapshot(args.file, args.data_dir, args.node_id, peers, args.cluster_id)
    peer_flag = f" --peers {args.peers}" if args.peers else ""
    print(f"restored {args.file} into {args.data_dir} (new cluster id {cluster_id}); start it with:\n"
          f"  raftkv serve --id {args.node_id} --data-dir {args.data_dir}{peer_flag} --cluster-id {cluster_id}")
    return 0


# ---- cluster up ----------------------------------------------------------------------------

def _run_cluster_up(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from kv.tools import cluster_up

    extra = ["--log-level", args.log_level] + ([] if args.fsync else ["--no-fsync"])
    try:
        cluster_up.local_specs(args.nodes, args.base_port, args.data_dir, extra, args.base_peer_port)
    except ValueError as bad:
        parser.error(str(bad))  # exits 2 with the usage line
    try:
        return cluster_up.run(args.nodes, args.base_port, args.data_dir, extra, base_peer_port=args.base_peer_port)
    except cluster_up.ClusterError as error:
        print(f"raftkv cluster up: error: {error}", file=sys.stderr)
        return EXIT_FAILED


def _run_cluster_restart(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from kv.tools import cluster_up

    try:
        return cluster_up.restart(args.node_id, args.data_dir)
    except cluster_up.ClusterError as error:
        print(f"raftkv cluster restart: error: {error}", file=sys.stderr)
        return EXIT_FAILED


# ---- entry point ---------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int] = args.run
    try:
        return run(args, args.command_parser)
    except (RaftKVError, SnapshotError, LogStoreError, ValueError, TypeError, OSError) as error:
        print(f"raftkv {args.command}: error: {_describe(error)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _describe(error: Exception) -> str:
    kind = getattr(error, "kind", None)
    return f"{kind}: {error}" if kind else str(error)


if __name__ == "__main__":
    raise SystemExit(main())
