"""`raftkv lease grant|revoke|keep-alive|timetolive|list`: etcd's leases, printed as etcdctl 3.4's
`lease` commands print them, with lease ids in hex as etcdctl writes and reads them (`raftkv put
KEY VALUE --lease ID` attaches a key). -w json prints etcdctl's JSON objects without the fields
of the response header (cluster_id, member_id, revision, raft_term), which kv.Client's lease
calls do not return: the same names, nesting and values otherwise."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from kv.errors import NotFoundError, RaftKVError
from kv.tools.arguments import Formatter
from kv.tools.client_options import b64, client_of
from kv.tools.write_out import JSON, SIMPLE, add_write_out

# etcd's answer to a keep-alive of a lease that is gone, as etcdctl's keep-alive --once tells it.
LEASE_NOT_FOUND = "etcdserver: requested lease not found"
# After a keep-alive fails (no member reachable), try again this soon while the lease may live.
RETRY_PAUSE_S = 0.5
# etcd's clients renew a lease every third of its TTL.
RENEW_FRACTION = 3

_HEX = re.compile(r"[+-]?[0-9a-fA-F]+")


def lease_id(text: str) -> int:
    """An argparse type: a lease id in hex, as etcdctl reads it (strconv.ParseInt(s, 16, 64))."""
    value = int(text, 16) if _HEX.fullmatch(text) else None
    if value is None or not -(1 << 63) <= value < 1 << 63:
        raise argparse.ArgumentTypeError(f"bad lease ID ({text!r}), expecting ID in hex")
    return value


def hex_id(value: int) -> str:
    """A lease id as etcdctl prints it (%016x)."""
    return f"{value:016x}"


def add_lease_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    lease = commands.add_parser(
        "lease", formatter_class=Formatter, help="grant, revoke, keep alive and list leases (etcdctl lease)",
        description="Leases, as etcdctl's lease commands: a key put with --lease ID is deleted when its lease\n"
                    "is revoked or expires (no keep-alive for its TTL). Ids are in hex, as etcdctl prints\n"
                    "and reads them. A TTL below the cluster's minimum (1.5 election timeouts, rounded up\n"
                    "to a second) is raised to it.",
        epilog="examples:\n  raftkv lease grant 30                 lease 694d7a1e0f4a2c05 granted with TTL(30s)\n"
               "  raftkv put service/a 10.0.0.1 --lease 694d7a1e0f4a2c05\n"
               "  raftkv lease keep-alive 694d7a1e0f4a2c05    renews it until Ctrl-C\n"
               "  raftkv lease timetolive 694d7a1e0f4a2c05 --keys\n"
               "  raftkv lease revoke 694d7a1e0f4a2c05    its keys are deleted, in one revision")
    actions = lease.add_subparsers(dest="action", metavar="ACTION", required=True)

    grant = _action(actions, client_options, "grant", "grant a lease of TTL seconds",
                    "Grant a lease of TTL seconds; prints \"lease ID granted with TTL(Ns)\", N the TTL the\n"
                    "cluster granted (at least its minimum).")
    grant.add_argument("ttl", metavar="TTL", type=int, help="its time to live, in seconds")
    add_write_out(grant, SIMPLE, simple="lease ID granted with TTL(Ns)", table=None,
                  json='{"ID": ID, "TTL": N, "Error": ""}, ID in decimal')

    revoke = _action(actions, client_options, "revoke", "revoke a lease: its keys are deleted",
                     "Revoke the lease: its keys are deleted at once, in one revision. Prints \"lease ID\n"
                     "revoked\"; a lease that does not exist (expired, revoked) is an error (exit 1).")
    revoke.add_argument("id", metavar="ID", type=lease_id, help="the lease's id, in hex")
    add_write_out(revoke, SIMPLE, simple="lease ID revoked", table=None,
                  json="{} (etcdctl's object is its header alone)")

    keep_alive = _action(actions, client_options, "keep-alive", "renew a lease until Ctrl-C (--once: once)",
                         "Renew the lease every third of its TTL, as etcd's clients do, printing \"lease ID\n"
                         "keepalived with TTL(N)\" for each renewal, until Ctrl-C (exit 0) or until the lease is\n"
                         "gone (\"lease ID expired or revoked.\", exit 0). When no member can be reached for\n"
                         "longer than the TTL, it stops with that error (exit 1). --once renews it once; a lease\n"
                         "that is gone is then an error (exit 1), as in etcdctl.")
    keep_alive.add_argument("id", metavar="ID", type=lease_id, help="the lease's id, in hex")
    keep_alive.add_argument("--once", action="store_true", help="renew it once and exit")
    add_write_out(keep_alive, SIMPLE, simple="lease ID keepalived with TTL(N) a renewal, then lease ID expired "
                                             "or revoked.", table=None,
                  json='{"ID": ID, "TTL": N} a line per renewal, ID in decimal')

    time_to_live = _action(actions, client_options, "timetolive", "a lease's TTL, time left and keys",
                           "Print \"lease ID granted with TTL(Gs), remaining(Rs)\" (with --keys, then \", attached\n"
                           "keys([K1 K2 ...])\"), or \"lease ID already expired\" when it does not exist.")
    time_to_live.add_argument("id", metavar="ID", type=lease_id, help="the lease's id, in hex")
    time_to_live.add_argument("--keys", action="store_true", help="list the keys attached to it too")
    add_write_out(time_to_live, SIMPLE, simple="etcdctl's line", table=None,
                  json='{"id": ID, "ttl": R (-1: gone), "granted-ttl": G, "keys": [KEY, ...] in base64, or null}')

    listing = _action(actions, client_options, "list", "list the leases",
                      "Print \"found N leases\", then each lease's id, a line each.")
    add_write_out(listing, SIMPLE, simple="found N leases, then the ids", table=None,
                  json='{"leases": [{"id": ID}, ...]}, ids in decimal')

    for parser, run in ((grant, _run_grant), (revoke, _run_revoke), (keep_alive, _run_keep_alive),
                        (time_to_live, _run_time_to_live), (listing, _run_list)):
        parser.set_defaults(run=run, command_parser=parser)


def _action(actions: Any, client_options: argparse.ArgumentParser, name: str, help: str,
            description: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = actions.add_parser(name, parents=[client_options], formatter_class=Formatter,
                                                         help=help, description=description)
    return parser


def _print_json(value: Any) -> None:
    print(json.dumps(value, separators=(",", ":")), flush=True)  # as Go's encoding/json writes it


def _run_grant(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        granted, ttl = client.lease_grant(args.ttl)
    if args.write_out == JSON:
        _print_json({"ID": granted, "TTL": ttl, "Error": ""})
    else:
        print(f"lease {hex_id(granted)} granted with TTL({ttl}s)")
    return 0


def _run_revoke(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.lease_revoke(args.id)
    if args.write_out == JSON:
        _print_json({})
    else:
        print(f"lease {hex_id(args.id)} revoked")
    return 0


def _run_time_to_live(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        found = client.lease_time_to_live(args.id, keys=args.keys)
    keys: list[bytes] = found["keys"]
    if args.write_out == JSON:
        _print_json({"id": found["id"], "ttl": found["ttl"], "granted-ttl": found["granted_ttl"],
                     "keys": [b64(key) for key in keys] or None})
        return 0
    if found["granted_ttl"] == 0 and found["ttl"] == -1:
        print(f"lease {hex_id(found['id'])} already expired")
        return 0
    line = f"lease {hex_id(found['id'])} granted with TTL({found['granted_ttl']}s), remaining({found['ttl']}s)".encode()
    if args.keys:
        line += b", attached keys([" + b" ".join(keys) + b"])"  # Go's %v of the keys, as they are
    sys.stdout.buffer.write(line + b"\n")
    sys.stdout.buffer.flush()
    return 0


def _run_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        ids = client.leases()
    if args.write_out == JSON:
        _print_json({"leases": [{"id": found} for found in ids]})
    else:
        print(f"found {len(ids)} leases")
        for found in ids:
            print(hex_id(found))
    return 0


def _run_keep_alive(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        with client_of(args) as client:
            if args.once:
                ttl = client.lease_keep_alive(args.id)
                if ttl <= 0:  # gone: an error, as etcdctl's keep-alive --once tells it (exit 1)
                    raise NotFoundError(LEASE_NOT_FOUND)
                _print_renewal(args, ttl)
                return 0
            _keep_alive(client, args)
    except KeyboardInterrupt:  # Ctrl-C: the way a keep-alive ends
        return 0
    return 0


def _keep_alive(client: Any, args: argparse.Namespace) -> None:
    """Renew now, then every third of the TTL, until the lease is gone; a failed renewal is tried
    again until the TTL of the last good one has passed (then the error ends the command)."""
    renewed, ttl = time.monotonic(), None
    while True:
        try:
            answer = client.lease_keep_alive(args.id)
        except RaftKVError:
            if ttl is None or time.monotonic() - renewed >= ttl:
                raise
            time.sleep(RETRY_PAUSE_S)
            continue
        if answer <= 0:
            if args.write_out == SIMPLE:  # etcdctl's last line, in its simple form only
                print(f"lease {hex_id(args.id)} expired or revoked.", flush=True)
            return
        renewed, ttl = time.monotonic(), answer
        _print_renewal(args, answer)
        time.sleep(answer / RENEW_FRACTION)


def _print_renewal(args: argparse.Namespace, ttl: int) -> None:
    if args.write_out == JSON:
        _print_json({"ID": args.id, "TTL": ttl})
    else:
        print(f"lease {hex_id(args.id)} keepalived with TTL({ttl})", flush=True)
