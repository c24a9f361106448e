"""A/B two raftkv configurations on a noisy machine: both run as live three-node clusters at once,
and the loads alternate between them in short windows, so that the host's drift (the same code
measured 2,263 and 3,317 puts/s half an hour apart on this VM) hits both alike. The idle cluster
costs little (heartbeats). Not a test; run it by hand:

    python benchmarks/ab_clusters.py --a "thrifty=" --b "all=--lazy-push-ms 0" --loads puts1,puts16
    python benchmarks/ab_clusters.py --a "spin=--read-spin-us 500" --b "nospin=--read-spin-us 0" --loads gets1

A configuration is NAME=FLAGS (flags for `raftkv serve`), optionally NAME=FLAGS@VAR=V,VAR=V to
set environment variables for its members (for experiments switched by a variable). Loads:
putsN / getsN, N closed-loop clients (256-byte values, 16-byte keys, as the bench's W1-W4).
Each window prints ops/s, p50, p99 and the three members' CPU per operation; the end prints the
medians and in how many windows A beat B.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from kv.bench.cpu import process_cpu_s  # noqa: E402
from kv.bench.measure import closed_loop  # noqa: E402
from kv.bench.processes import Registry  # noqa: E402
from kv.bench.raftkv_cluster import RaftkvCluster  # noqa: E402
from kv.bench.workloads import key, value_of  # noqa: E402

PRELOADED_KEYS = 2000


@dataclass
class Config:
    name: str
    flags: list[str]
    env: dict[str, str]
    windows: dict[str, list[tuple[float, float, float, float]]] = field(default_factory=dict)

    @staticmethod
    def parse(spec: str) -> "Config":
        name, _, rest = spec.partition("=")
        flags, _, env = rest.partition("@")
        return Config(name, shlex.split(flags), dict(kv.split("=", 1) for kv in env.split(",") if kv))


def start(config: Config, work: Path, registry: Registry) -> RaftkvCluster:
    saved = dict(os.environ)
    os.environ.update(config.env)  # the members' environment is taken when they are defined
    try:
        cluster = RaftkvCluster(work / config.name, registry, extra_args=config.flags)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    cluster.start()
    cluster.wait_healthy(30)
    target = cluster.target(5.0)
    for i in range(PRELOADED_KEYS):
        target.put(key("R", 0, i), value_of(256))
    target.close()
    return cluster


def window(cluster: RaftkvCluster, load: str, tag: str, seconds: float) -> tuple[float, float, float, float]:
    kind, clients = load[:4], int(load[4:])
    value = value_of(256)
    targets = [cluster.target(5.0) for _ in range(clients)]

    def operation(w: int):
        t = targets[w]
        if kind == "puts":
            return lambda i: t.put(key(tag, w, i), value)
        return lambda i: t.get(key("R", 0, (w * 7919 + i) % PRELOADED_KEYS))

    pids = [child.pid for child in cluster.children.values()]
    cpu: list[float] = []
    try:
        result = closed_loop([operation(w) for w in range(clients)], seconds, 0.5,
                             probe=lambda: cpu.append(sum(process_cpu_s(p) for p in pids)))
    finally:
        for t in targets:
            t.close()
    ops = result.ops_per_s * seconds
    return (result.ops_per_s, result.percentile_ms(50), result.percentile_ms(99),
            (cpu[-1] - cpu[0]) * 1000 / ops if ops else 0.0)


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
    registry, work = Registry(), Path(tempfile.mkdtemp(prefix="ab-clusters-", dir=args.work_dir))
    clusters: dict[str, RaftkvCluster] = {}
    try:
        for c in configs:
            clusters[c.name] = start(c, work, registry)
        for r in range(args.rounds):
            for load in loads:
                for c in configs if r % 2 == 0 else configs[::-1]:  # each goes first in half the rounds
                    w = window(clusters[c.name], load, f"{load}-{r}", args.seconds)
                    c.windows.setdefault(load, []).append(w)
                    print(f"round {r} {c.name:10s} {load:8s} {w[0]:7.0f}/s  p50 {w[1]:.2f}  p99 {w[2]:.2f} ms  "
                          f"members' CPU {w[3]:.3f} ms/op", flush=True)
        print("medians:")
        a, b = configs
        for load in loads:
            for c in configs:
                ws = c.windows[load]
                print(f"  {c.name:10s} {load:8s} {statistics.median(w[0] for w in ws):7.0f}/s  "
                      f"p50 {statistics.median(w[1] for w in ws):.2f}  p99 {statistics.median(w[2] for w in ws):.2f} ms  "
                      f"members' CPU {statistics.median(w[3] for w in ws):.3f} ms/op")
            wins = sum(x[0] > y[0] for x, y in zip(a.windows[load], b.windows[load]))
            print(f"  {a.name} faster than {b.name} in {wins} of {args.rounds} windows")
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
