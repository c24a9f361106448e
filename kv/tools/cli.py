"""The `raftkv` command (also `python -m kv`): run a node, talk to a cluster, start a local one.
The commands live beside it: data_commands (put, get, delete, scan, compact, revision),
txn_command (txn), watch_command (watch), lease_commands (lease grant|revoke|...), cluster_commands
(status, endpoint health, cluster up/restart), member_commands (member list|add|remove|promote,
leader transfer), snapshot_commands, serve_command, spark/cli, bench/cli."""
from __future__ import annotations

import argparse
import importlib.metadata
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kv.tools.grpc_io import prefer_polling_io_manager

# Before the imports below pull in grpc: gRPC reads its I/O manager choice when first imported.
POLLING_IO_CHOSEN = prefer_polling_io_manager()

# noqa: E402 below: these come after the gRPC runtime choice.
from kv.errors import RaftKVError  # noqa: E402
from kv.tools.alarm_commands import add_alarm_commands  # noqa: E402
from kv.tools.arguments import Formatter  # noqa: E402
from kv.tools.auth_commands import add_auth_commands  # noqa: E402
from kv.tools.certs import add_certs_command  # noqa: E402
from kv.tools.client_options import EXIT_FAILED, client_options, describe  # noqa: E402
from kv.tools.cluster_commands import add_cluster_commands  # noqa: E402
from kv.tools.data_commands import add_data_commands  # noqa: E402
from kv.tools.lease_commands import add_lease_commands  # noqa: E402
from kv.tools.member_commands import add_member_commands  # noqa: E402
from kv.tools.serve_command import add_serve_parser  # noqa: E402
from kv.tools.snapshot_commands import add_snapshot_commands  # noqa: E402
from kv.tools.txn_command import add_txn_command  # noqa: E402
from kv.tools.watch_command import add_watch_command  # noqa: E402
from kv.tools.spark import cli as spark_cli  # noqa: E402
from raft.log import LogStoreError  # noqa: E402
from snapshot.errors import SnapshotError  # noqa: E402

DISTRIBUTION = "raftkv"  # [project] name in pyproject.toml


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftkv", formatter_class=Formatter,
        description="raftkv: a replicated key-value store on Raft (DLedger style), LMDB and gRPC.",
        epilog="examples:\n  raftkv serve                       a single-node store in ./raftkv-data on 127.0.0.1:7001\n"
               "  raftkv cluster up --nodes 3         a local three-node cluster\n"
               "  raftkv cluster restart n1           start its member n1 again after it died\n"
               "  raftkv put user/1 alice\n  raftkv get user/1\n  raftkv scan --prefix user/ -w table  -w/--write-out simple|table|json\n"
               "  raftkv get user/1 --rev 42          the value as of revision 42 (raftkv revision: now)\n"
               "  raftkv txn < txn.txt                a transaction in etcdctl's txn format (raftkv txn --help)\n"
               "  raftkv compact 42                   drop the history below revision 42\n"
               "  raftkv watch --prefix user/         print each change as it happens (Ctrl-C ends it)\n"
               "  raftkv lease grant 30               a lease; raftkv put KEY VALUE --lease ID attaches a key\n"
               "  raftkv status --endpoints 127.0.0.1:7001,127.0.0.1:7002\n"
               "  export RAFTKV_ENDPOINTS=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003\n"
               "  raftkv endpoint health              exit 1 when a member is unhealthy\n"
               "  raftkv member list -w table         voters and learners (raftkv member --help: add, remove, promote)\n"
               "  raftkv leader transfer --to n2      hand the leadership to n2")
    parser.add_argument("--version", action="version", version=f"raftkv {package_version()}",
                        help="print raftkv's version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_serve_parser(commands)
    options = client_options()
    add_data_commands(commands, options)
    add_txn_command(commands, options)
    add_watch_command(commands, options)
    add_lease_commands(commands, options)
    add_cluster_commands(commands, options)
    add_member_commands(commands, options)
    add_auth_commands(commands, options)
    add_alarm_commands(commands, options)
    add_snapshot_commands(commands)
    add_certs_command(commands)
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


# ---- entry point ---------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int] = args.run
    try:
        return run(args, args.command_parser)
    except (RaftKVError, SnapshotError, LogStoreError, ValueError, TypeError, OSError) as error:
        print(f"raftkv {args.command}: error: {describe(error)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
