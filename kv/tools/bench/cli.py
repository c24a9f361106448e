"""The command line of `raftkv bench` (for now `python -m kv.tools.bench`). kv/tools/cli.py wires it in with
`add_arguments` on its "bench" subparser and `run` as the handler."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from kv.tools.bench import machine
from kv.tools.bench.etcd import INSTALL_HINT, etcd_version
from kv.tools.bench import stopping
from kv.tools.bench.processes import Registry
from kv.tools.bench.report import ETCD, RAFTKV, api_line, format_markdown, format_table, summarize, to_json
from kv.tools.bench.runner import RunOptions, run as run_rounds
from kv.tools.bench.settings import (NATIVE_ONLY, OPTIONAL_WORKLOADS, QUICK, REVISION_WORKLOADS, WORKLOADS, Sizes,
                                     with_overrides)
from kv.tools.bench.systems import APIS, ETCD_API, NATIVE_API

DEFAULT_JSON = "raftkv-bench.json"
DEFAULTS = Sizes()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compare", choices=[ETCD], default=None,
                        help="also run a three-member etcd cluster and print raftkv/etcd ratios")
    parser.add_argument("--api", choices=APIS, default=NATIVE_API,
                        help="what drives raftkv: its native client kv.Client (native, the default), or etcd's v3 "
                             "API through the very client etcd is driven with (etcd: EtcdTarget's unary "
                             "Put/Range/Txn, starting at the leader), for a like-for-like comparison. Under "
                             "--api etcd: W5 runs serializable reads only (etcd's API has no lease reads), W6 "
                             "loads with Txns of up to 128 puts (as etcd's), W8 (snapshot save/restore), W10 "
                             "and W11 (Spark) are native-only and refused, and the default workloads are "
                             "W1..W7,W9,W12,W13")
    parser.add_argument("--rounds", type=_positive_int, default=3,
                        help="rounds, alternating the systems' order; the table shows medians (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and one round: checks that the bench works, measures nothing")
    parser.add_argument("--workloads", default=None, metavar="W1,W2,...",
                        help="which workloads to run (default: W1..W9; under --api etcd, W1..W7,W9,W12,W13); "
                             "W10,W11 are the Spark pipeline's, run when named, with the spark extra installed; "
                             "W12 (linearizable reads at a past revision) and W13 (compare-and-swap Txns: one "
                             "compare on the mod revision, one put) run when named, on raftkv and etcd alike; "
                             "so do W14 (watchers on one prefix under a steady writer: delivery latency) and W15 "
                             "(leases kept alive: leader CPU per keep-alive), through etcd's Watch and Lease "
                             "services whatever --api says; W16 (membership change: a learner n4 added, started "
                             "with --join, caught up and promoted on a store of --membership-keys keys, then "
                             "removed; the longest stall of a sequential writer over --transfers MoveLeader "
                             "calls) runs when named, on raftkv only: --compare etcd measures no etcd side; W17 "
                             "(lists as Kubernetes makes them: --list-keys keys of 1 KiB under one prefix, listed "
                             "whole, keys-only, and in pages of --list-page, with the members' peak memory) runs "
                             "when named, through either API")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help=f"measured window of each load W1..W5, W12, W13 and of each W17 variant (default "
                             f"{DEFAULTS.duration_s})")
    parser.add_argument("--clients", type=_positive_int, default=None,
                        help=f"concurrent clients of W2, W4, W5, W12, W13 (default {DEFAULTS.clients})")
    parser.add_argument("--bulk-keys", type=_positive_int, default=None, metavar="N",
                        help=f"keys W6 loads (default {DEFAULTS.bulk_keys:,})")
    parser.add_argument("--bulk-batch", type=_positive_int, default=None, metavar="N",
                        help=f"keys per batch request in W6 (default {DEFAULTS.bulk_batch}; etcd caps at 128)")
    parser.add_argument("--failover-trials", type=_positive_int, default=None, metavar="N",
                        help=f"leader kills in W7 (default {DEFAULTS.failover_trials})")
    parser.add_argument("--watchers", type=_positive_int, default=None, metavar="N",
                        help=f"W14: watches on one prefix (default {DEFAULTS.watchers:,})")
    parser.add_argument("--watch-streams", type=_positive_int, default=None, metavar="N",
                        help=f"W14: Watch streams carrying them, one client each, round-robin over the members "
                             f"(default {DEFAULTS.watch_streams})")
    parser.add_argument("--watch-rate", type=_positive_float, default=None, metavar="PUTS_PER_S",
                        help=f"W14: the writer's puts a second (default {DEFAULTS.watch_rate:,.0f})")
    parser.add_argument("--watch-duration", type=_positive_float, default=None, metavar="SECONDS",
                        help=f"W14: how long the writer writes (default {DEFAULTS.watch_duration_s:.0f})")
    parser.add_argument("--leases", type=_positive_int, default=None, metavar="N",
                        help=f"W15: leases kept alive (default {DEFAULTS.leases:,})")
    parser.add_argument("--lease-ttl", type=_positive_int, default=None, metavar="SECONDS",
                        help=f"W15: their TTL; each is kept alive every TTL/3 (default {DEFAULTS.lease_ttl_s})")
    parser.add_argument("--lease-streams", type=_positive_int, default=None, metavar="N",
                        help=f"W15: keep-alive streams to the leader (default {DEFAULTS.lease_streams})")
    parser.add_argument("--lease-duration", type=_positive_float, default=None, metavar="SECONDS",
                        help=f"W15: the measured window (default {DEFAULTS.lease_duration_s:.0f})")
    parser.add_argument("--membership-keys", type=_positive_int, default=None, metavar="N",
                        help=f"W16: keys in the store when the learner joins; W16 loads its own up to this many "
                             f"when the store holds fewer (default {DEFAULTS.membership_keys:,})")
    parser.add_argument("--transfers", type=_positive_int, default=None, metavar="N",
                        help=f"W16: MoveLeader calls under the writer (default {DEFAULTS.transfers})")
    parser.add_argument("--list-keys", type=_positive_int, default=None, metavar="N",
                        help=f"W17: keys of 1 KiB under the listed prefix, every one in every list (default "
                             f"{DEFAULTS.list_keys:,}: about 10 MB a list with values)")
    parser.add_argument("--list-clients", type=_positive_int, default=None, metavar="N",
                        help=f"W17: clients listing at once, each one list after another (default "
                             f"{DEFAULTS.list_clients}, fewer than --clients: the clients run in the bench's one "
                             f"Python process, and 16 lists of 10 MB in flight would measure that process)")
    parser.add_argument("--list-page", type=_positive_int, default=None, metavar="N",
                        help=f"W17: keys per page of the paged list (default {DEFAULTS.list_page})")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the members keep their data (default: a new directory under the current "
                             "one, on the disk being measured; removed afterwards unless --keep)")
    parser.add_argument("--tls", action="store_true",
                        help="run raftkv with TLS on its client and peer ports (as `raftkv cluster up --tls`) and "
                             "its clients with TLS, to measure what TLS costs (compare with a run without)")
    parser.add_argument("--keep", action="store_true", help="keep data directories and member logs")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    parser.add_argument("--json", type=Path, default=Path(DEFAULT_JSON), metavar="FILE",
                        help=f"where to write the results as JSON (default {DEFAULT_JSON})")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _workloads(text: str | None, api: str = NATIVE_API) -> tuple[str, ...]:
    """The workloads named (None: the API's default set); ValueError for an unknown one, or for one
    only the native API can drive under --api etcd."""
    if text is None:
        if api == ETCD_API:
            return tuple(w for w in WORKLOADS if w not in NATIVE_ONLY) + REVISION_WORKLOADS
        return WORKLOADS
    chosen = tuple(dict.fromkeys(t.strip().upper() for t in text.split(",") if t.strip()))
    known = WORKLOADS + OPTIONAL_WORKLOADS
    unknown = [t for t in chosen if t not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown workloads {unknown}; choose from {','.join(known)}")
    refused = [t for t in chosen if api == ETCD_API and t in NATIVE_ONLY]
    if refused:
        why = "; ".join(f"{t}: {NATIVE_ONLY[t]}" for t in refused)
        raise ValueError(f"{','.join(refused)} cannot run under --api etcd: raftkv's native API only ({why}); "
                         f"run with --api native, or leave out {','.join(refused)}")
    return chosen


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    sizes = with_overrides(QUICK if args.quick else Sizes(), duration_s=args.duration, clients=args.clients,
                           bulk_keys=args.bulk_keys, bulk_batch=args.bulk_batch,
                           failover_trials=args.failover_trials, watchers=args.watchers,
                           watch_streams=args.watch_streams, watch_rate=args.watch_rate,
                           watch_duration_s=args.watch_duration, leases=args.leases, lease_ttl_s=args.lease_ttl,
                           lease_streams=args.lease_streams, lease_duration_s=args.lease_duration,
                           membership_keys=args.membership_keys, transfers=args.transfers,
                           list_keys=args.list_keys, list_clients=args.list_clients, list_page=args.list_page)
    api = getattr(args, "api", NATIVE_API)
    workloads = _workloads(args.workloads, api)
    systems: tuple[str, ...] = (RAFTKV,)
    version = etcd_version()
    if args.compare == ETCD:
        if version is None:
            print(f"{INSTALL_HINT}\nrunning raftkv only.", file=sys.stderr)
        else:
            systems = (RAFTKV, ETCD)
    rounds = 1 if args.quick else args.rounds
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="raftkv-bench-", dir="."))
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    options = RunOptions(systems, workloads, rounds, sizes, work_dir, args.keep, args.tls, api)
    registry = Registry()
    try:
        with stopping.handling_signals():
            described = machine.describe(work_dir, version)
            print(f"machine: {machine.summary_line(described)}", file=sys.stderr)
            results = run_rounds(options, registry)
    except KeyboardInterrupt:
        print("interrupted: every process the bench started has been stopped", file=sys.stderr)
        return 130
    finally:
        registry.stop_all()
        if not args.keep and args.work_dir is None:
            _remove_tree(work_dir)
    rows = summarize(results, api)
    command = _command_line(sys.argv)
    args.json.write_text(json.dumps(to_json(described, command, asdict(sizes), results, rows, api), indent=2) + "\n")
    render = format_markdown if args.markdown else format_table
    print(render(rows, with_etcd=ETCD in systems, api=api))
    tls = "  raftkv with TLS" if args.tls else ""
    print(f"\nmachine: {machine.summary_line(described)}\nrounds: {rounds} (medians)  json: {args.json}{tls}"
          f"\n{api_line(api)}")
    failed = [f"round {r.round} {r.system}: {r.error}" for r in results if r.error]
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


def _command_line(argv: Sequence[str]) -> str:
    """How this run was started, as `raftkv bench ...` (from `raftkv bench` or `python -m kv.tools.bench`)."""
    rest = list(argv[1:])
    if "bench" in rest:
        rest = rest[rest.index("bench") + 1:]
    return shlex.join(["raftkv", "bench", *rest])


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftkv bench",
        description="Start a local three-node raftkv cluster (fsync on, as shipped) and run the standard "
                    "workloads W1..W9; with --compare etcd, also a three-member etcd cluster, side by side; "
                    "with --api etcd, raftkv is driven through etcd's API by the client etcd is driven with.")
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args, parser)
    except KeyboardInterrupt:  # before run() took over the signals
        return 130
    except ValueError as error:
        parser.error(str(error))
        return 2
