"""The commands about the members themselves: `raftkv status`, `endpoint health`, and the local
cluster of `cluster up` / `cluster restart`."""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kv.client.client import Client
from kv.client.router import parse_endpoints
from kv.client.tls import TLS
from kv.errors import RaftKVError
from kv.tools.arguments import LOG_LEVELS, Formatter, port, positive_int
from kv.tools.client_options import EXIT_FAILED, client_of, describe, tls_of
from kv.tools.write_out import JSON, SIMPLE, TABLE, add_write_out, print_table


def add_cluster_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    _add_status(commands, client_options)
    _add_endpoint(commands, client_options)
    _add_cluster(commands)


def _add_status(commands: Any, client_options: argparse.ArgumentParser) -> None:
    status = commands.add_parser("status", parents=[client_options], formatter_class=Formatter,
                                 help="show each member's role and indexes",
                                 description="Ask every endpoint for its status and print what answered; an "
                                             "endpoint that did not answer shows its error, and the exit code "
                                             "is then 1.")
    add_write_out(status, TABLE, simple="one line per endpoint, the table's cells separated by ', ' (as etcdctl)",
                  table="one row per endpoint, and an ERROR column when one did not answer",
                  json="a list with one object per endpoint (address, id, role, term, leader, commit_index, "
                       "applied_index, snapshot_index, peers on the leader; error when it did not answer)")
    status.set_defaults(run=_run_status, command_parser=status)


def _add_endpoint(commands: Any, client_options: argparse.ArgumentParser) -> None:
    endpoint = commands.add_parser("endpoint", formatter_class=Formatter, help="check the health of each endpoint",
                                   description="Check the cluster members named by --endpoints one by one.")
    actions = endpoint.add_subparsers(dest="action", metavar="ACTION", required=True)
    health = actions.add_parser(
        "health", parents=[client_options], formatter_class=Formatter,
        help="check that each endpoint serves linearizable reads",
        description="For each endpoint, in parallel: a linearizable read through it (a quorum must\n"
                    "answer), then the member's own health, the rule of its /health: a leader heard from\n"
                    "within the election timeout, no alarm raised (NOSPACE, CORRUPT), not rejoining after\n"
                    "lost data, not stopped. One line per endpoint, as etcdctl:\n"
                    "  ADDRESS is healthy: took X ms\n"
                    "  ADDRESS is unhealthy: REASON\n"
                    "Exit code 1 when any endpoint is unhealthy.")
    add_write_out(health, SIMPLE, simple="the lines above", table="ENDPOINT, HEALTH, TOOK and ERROR (as etcdctl)",
                  json="a list with one object per endpoint: endpoint, health (true or false), took_ms, and "
                       "error when unhealthy")
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
    up.add_argument("--tls", action="store_true",
                    help="TLS on every member's client and peer ports, with a CA and certificates made in "
                         "DATA_DIR/certs (one per member, and a client certificate 'root'); prints the "
                         "RAFTKV_CACERT/RAFTKV_CERT/RAFTKV_KEY export lines for the CLI (docs/security.md)")
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


def _run_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        statuses = client.status()
    if args.write_out == JSON:
        print(json.dumps(statuses, indent=2))
    else:
        _print_rows(args.write_out, *status_rows(statuses))
    # An operator (or a script) asking for every member's status wants to know that one is missing.
    return EXIT_FAILED if any("error" in s for s in statuses) else 0


# etcdctl reads the key "health" for its check; a read, so it changes nothing.
HEALTH_KEY = b"health"


def _run_endpoint_health(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    addresses, tls = parse_endpoints(args.endpoints), tls_of(args)
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        reports = list(pool.map(lambda address: check_health(address, args.timeout, tls), addresses))
    if args.write_out == JSON:
        print(json.dumps(reports, indent=2))
    elif args.write_out == TABLE:
        print_table(("ENDPOINT", "HEALTH", "TOOK", "ERROR"),
                    [(r["endpoint"], str(r["health"]).lower(), f"{r['took_ms']:.1f} ms", r.get("error", ""))
                     for r in reports])
    else:
        for report in reports:
            verdict = f"healthy: took {report['took_ms']:.1f} ms" if report["health"] else f"unhealthy: {report['error']}"
            print(f"{report['endpoint']} is {verdict}")
    return 0 if all(report["health"] for report in reports) else EXIT_FAILED


def check_health(address: str, timeout: float, tls: TLS | None = None) -> dict[str, Any]:
    """One endpoint's health: {"endpoint", "health", "took_ms"} and "error" when unhealthy."""
    began = time.monotonic()
    with Client([address], timeout=timeout, tls=tls) as client:
        error = _health_problem(client)
    report: dict[str, Any] = {"endpoint": address, "health": error is None,
                              "took_ms": round((time.monotonic() - began) * 1000, 3)}
    if error is not None:
        report["error"] = error
    return report


def _health_problem(client: Client) -> str | None:
    """Why the client's one endpoint is unhealthy, or None. The read goes first: it proves a quorum
    answers through this endpoint, and its error names its kind (UNAVAILABLE, TIMEOUT, ...). Then
    the member's own verdict (status `unhealthy`), by the rule its /health and gRPC health service
    follow (kv/server/health.py)."""
    try:
        client.get(HEALTH_KEY, consistency="linearizable")
    except RaftKVError as error:
        return describe(error)
    (status,) = client.status()
    if "error" in status:
        return f"status: {status['error']}"
    return status.get("unhealthy")


STATUS_COLUMNS = ("address", "id", "role", "term", "leader", "commit_index", "applied_index", "snapshot_index")


def _cell(status: dict[str, Any], column: str) -> str:
    """A status field as the table shows it: a learner's role is "learner" (a follower that counts
    in no quorum; `-w json` keeps the role and lists the learners)."""
    if column == "role" and status["id"] in status.get("learners", ()):
        return "learner"
    return str(status[column])


def status_rows(statuses: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The header and one row per endpoint; an ERROR column only when an endpoint did not answer
    (its other cells are then '-')."""
    columns = [*STATUS_COLUMNS, *(("error",) if any("error" in s for s in statuses) else ())]
    rows = [[s["address"], *("-" if s.get(c) is None else _cell(s, c) for c in columns[1:])] for s in statuses]
    return [c.upper() for c in columns], rows


def _print_rows(write_out: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table, or etcdctl's simple lines: the cells of each row separated by ', '."""
    if write_out == TABLE:
        print_table(header, rows)
    else:
        for row in rows:
            print(", ".join(row))


# ---- cluster up ----------------------------------------------------------------------------

def _run_cluster_up(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from kv.tools import cluster_up

    extra = ["--log-level", args.log_level] + ([] if args.fsync else ["--no-fsync"])
    try:
        cluster_up.local_specs(args.nodes, args.base_port, args.data_dir, extra, args.base_peer_port)
    except ValueError as bad:
        parser.error(str(bad))  # exits 2 with the usage line
    try:
        return cluster_up.run(args.nodes, args.base_port, args.data_dir, extra, base_peer_port=args.base_peer_port,
                              tls=args.tls)
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


