"""The bench's W14 (watchers on one prefix under a steady writer) on raftkv alone, with the members
started with the given `raftkv serve` flags. Not a test; run it by hand, alternating variants:

    python benchmarks/watch_delivery.py --rate 20                          # the default settings
    python benchmarks/watch_delivery.py --rate 20 -- --lazy-push-ms 0      # every follower eager
    PYTHONPATH=/tmp/before python benchmarks/watch_delivery.py --rate 20   # another checkout's code

(`git worktree add /tmp/before COMMIT` makes such a checkout; PYTHONPATH wins over the installed
package in the members too, which run `python -m kv serve`.) Prints the delivery latency overall
and by member, the writer's puts, and the members' CPU per event delivered.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

if importlib.util.find_spec("kv") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kv  # noqa: E402
from kv.tools.bench.processes import Registry  # noqa: E402
from kv.tools.bench.raftkv_cluster import RaftkvCluster  # noqa: E402
from kv.tools.bench.settings import Sizes  # noqa: E402
from kv.tools.bench.watch_workload import w14_watchers  # noqa: E402
from kv.tools.bench.workloads import Context  # noqa: E402

SHOWN = ("puts/s", "p50 ms", "p99 ms", "max ms", "put p50 ms", "put p99 ms", "leader CPU s", "follower CPU s",
         "members CPU us/event", "watches not exact")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/watch_delivery.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Sizes()
    parser.add_argument("--rate", type=float, default=defaults.watch_rate, help="the writer's puts a second")
    parser.add_argument("--watchers", type=int, default=defaults.watchers)
    parser.add_argument("--duration", type=float, default=defaults.watch_duration_s, help="seconds of writes")
    parser.add_argument("flags", nargs="*", help="flags for every member's `raftkv serve` (after --)")
    args = parser.parse_args(argv)
    registry = Registry()
    work = Path(tempfile.mkdtemp(prefix="raftkv-watch-delivery-"))
    cluster = RaftkvCluster(work, registry, extra_args=args.flags)
    sizes = dataclasses.replace(defaults, watch_rate=args.rate, watchers=args.watchers,
                                watch_duration_s=args.duration)
    ctx = Context(work, sizes)
    try:
        cluster.start()
        cluster.wait_healthy(sizes.healthy_timeout_s)
        metrics = {m.name: m for m in w14_watchers(cluster, ctx)}
        print(f"code: {Path(kv.__file__).resolve().parents[1]}; serve flags: {' '.join(args.flags) or '(none)'}")
        for name in SHOWN:
            print(f"  {name:22s} {metrics[name].value:.4g}")
        print(f"  {metrics['p50 ms'].note}")
        return 0
    finally:
        ctx.close()
        registry.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
