"""A/B two raftkv configurations on a noisy machine: both run as live three-node clusters at once,
and the loads alternate between them in short windows, so that the host's drift (the same code
measured 2,263 and 3,317 puts/s half an hour apart on this VM) hits both alike. The idle cluster
costs little (heartbeats). Not a test; run it by hand:

    python benchmarks/ab_clusters.py --a "thrifty=" --b "all=--lazy-push-ms 0" --loads puts1,puts16
    python benchmarks/ab_clusters.py --a "spin=--read-spin-us 500" --b "nospin=--read-spin-us 0" --loads gets1

A configuration is NAME=FLAGS (flags for `raftkv serve`), optionally NAME=FLAGS@VAR=V,VAR=V to
set environment variables for its members (for experiments switched by a variable). Loads:
putsN / getsN run the bench's own W1-W4 code (kv/tools/bench/workloads.py) with N clients. Each window
prints ops/s, p50, p99 and the CPU per operation of the leader, a follower (the mean of the two)
and the client; the end prints the medians and in how many windows A beat B.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from kv.tools.bench.processes import Registry  # noqa: E402
from kv.tools.bench.raftkv_cluster import RaftkvCluster  # noqa: E402
from kv.tools.bench.settings import Sizes  # noqa: E402
from kv.tools.bench.workloads import (  # noqa: E402
    Context, Metric, load_read_set, w1_sequential_puts, w2_concurrent_puts, w3_sequential_gets, w4_concurrent_gets,
)

# What a window reports, in this order: the bench's own metrics of W1-W4.
SHOWN = ("ops/s", "p50 ms", "p99 ms", "leader CPU ms/op", "follower CPU ms/op", "client CPU ms/op")


@dataclass
class Config:
    name: str
    flags: list[str]
    env: dict[str, str]
    windows: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    @staticmethod
    def parse(spec: str) -> "Config":
        name, _, rest = spec.partition("=")
        flags, _, env = rest.partition("@")
        return Config(name, shlex.split(flags), dict(kv.split("=", 1) for kv in env.split(",") if kv))


def start(config: Config, work: Path, registry: Registry, sizes: Sizes) -> RaftkvCluster:
    saved = dict(os.environ)
    os.environ.update(config.env)  # the members' environment is taken when they are defined
    try:
        cluster = RaftkvCluster(work / config.name, registry, extra_args=config.flags)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    cluster.start()
    cluster.wait_healthy(sizes.healthy_timeout_s)
    ctx = Context(work, sizes)
    try:
        load_read_set(cluster, ctx)
    finally:
        ctx.close()
    return cluster


def window(cluster: RaftkvCluster, load: str, work: Path, sizes: Sizes) -> dict[str, float]:
    """One window of the bench's W1 / W2 (putsN) or W3 / W4 (getsN) with N clients."""
    kind, clients = load[:4], int(load[4:])
    one, many = (w1_sequential_puts, w2_concurrent_puts) if kind == "puts" else (w3_sequential_gets, w4_concurrent_gets)
    ctx = Context(work, replace(sizes, clients=clients))
    try:
        metrics: list[Metric] = (one if clients == 1 else many)(cluster, ctx)
    finally:
        ctx.close()
    return {m.name: m.value or 0.0 for m in metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="NAME=FLAGS[@VAR=V,...]")
    parser.add_argument("--b", required=True, help="NAME=FLAGS[@VAR=V,...]")
    parser.add_argument("--loads", default="puts1,puts16")
    parser.add_argument("--rounds", type=int, default=8, help="windows per load and configuration")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured length of a window")
    parser.add_argument("--work-dir", type=Path, default=Path("."))
    args = parser.parse_args()
    configs = [Config.parse(args.a), Config.parse(args.b)]
    loads = args.loads.split(",")
    sizes = Sizes(duration_s=args.seconds, warmup_s=0.5)
    registry, work = Registry(), Path(tempfile.mkdtemp(prefix="ab-clusters-", dir=args.work_dir))
    clusters: dict[str, RaftkvCluster] = {}
    try:
        for c in configs:
            clusters[c.name] = start(c, work, registry, sizes)
        for r in range(args.rounds):
            for load in loads:
                for c in configs if r % 2 == 0 else configs[::-1]:  # each goes first in half the rounds
                    w = window(clusters[c.name], load, work, sizes)
                    c.windows.setdefault(load, []).append(w)
                    print(f"round {r} {c.name:10s} {load:8s} {_figures(w)}", flush=True)
        print("medians:")
        a, b = configs
        for load in loads:
            for c in configs:
                ws = c.windows[load]
                print(f"  {c.name:10s} {load:8s} {_figures({m: statistics.median(w[m] for w in ws) for m in SHOWN})}")
            wins = sum(x["ops/s"] > y["ops/s"] for x, y in zip(a.windows[load], b.windows[load]))
            print(f"  {a.name} faster than {b.name} in {wins} of {args.rounds} windows")
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def _figures(w: dict[str, float]) -> str:
    return (f"{w['ops/s']:7.0f}/s  p50 {w['p50 ms']:.2f}  p99 {w['p99 ms']:.2f} ms  CPU ms/op: leader "
            f"{w['leader CPU ms/op']:.3f}, follower {w['follower CPU ms/op']:.3f}, client {w['client CPU ms/op']:.3f}")


if __name__ == "__main__":
    main()
