"""Where does a loaded leader spend its time? Start a local raftkv cluster, put it under one of the
bench's loads, and sample the leader (and a follower) with py-spy (`pip install py-spy`).

    python -m kv.tools.bench.profile --load puts --seconds 10 --out ./profile [--api etcd]
    -> profile/leader.txt, profile/follower.txt (collapsed stacks, flamegraph.pl / speedscope input)
       and a summary of the heaviest functions, self and inclusive, on stdout.
"""
from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kv.tools.bench.list_workload import LIST_PREFIX, load_list_set
from kv.tools.bench.measure import closed_loop
from kv.tools.bench.processes import Registry
from kv.tools.bench.raftkv_cluster import RaftkvCluster
from kv.tools.bench.settings import Sizes
from kv.tools.bench.systems import APIS, LINEARIZABLE, NATIVE_API
from kv.tools.bench.workloads import Context, key, load_read_set, value_of, READ_PREFIX

LOADS = ("puts", "gets", "bulk", "lists", "pages")  # lists: W17's whole lists of its prefix; pages: in pages of 500


def summarize_collapsed(path: Path, top: int = 25) -> str:
    """The heaviest frames of a py-spy collapsed-stack file: self samples and inclusive samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{path.name}: {total} samples", "  self%  function"]
    lines += [f"  {100 * n / total:5.1f}  {frame}" for frame, n in own.most_common(top)]
    lines += ["  incl%  function"]
    lines += [f"  {100 * n / total:5.1f}  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


def _load(cluster: RaftkvCluster, ctx: Context, kind: str, clients: int, stop: threading.Event) -> None:
    value = value_of(ctx.sizes.value_bytes)

    def operation(worker: int):  # type: ignore[no-untyped-def]
        target = ctx.target(cluster)
        if kind == "puts":
            return lambda i: target.put(key("pf", worker, i), value)
        if kind == "gets":
            return lambda i: target.get(key(READ_PREFIX, 0, i % ctx.sizes.read_keys), LINEARIZABLE)
        if kind == "lists":
            return lambda i: target.list_prefix(LIST_PREFIX.encode())
        if kind == "pages":
            return lambda i: target.list_prefix(LIST_PREFIX.encode(), False, 500)
        small = value_of(16)
        return lambda i: target.bulk_put([(key("pb", worker, i * 1000 + j), small) for j in range(1000)])

    while not stop.is_set():
        closed_loop([operation(w) for w in range(clients)], duration_s=1.0, warmup_s=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kv.tools.bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", choices=LOADS, default="puts")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--api", choices=APIS, default=NATIVE_API,
                        help="the API the load drives the members through (as raftkv bench --api)")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("profile"))
    parser.add_argument("--native", action="store_true", help="include native (C) frames")
    parser.add_argument("--gil", action="store_true",
                        help="sample only the thread holding the GIL: Python CPU time, without idle threads")
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    registry = Registry()
    work = Path(tempfile.mkdtemp(prefix="raftkv-profile-", dir="."))
    cluster = RaftkvCluster(work, registry, api=args.api)
    ctx = Context(work, Sizes())
    stop = threading.Event()
    try:
        cluster.start()
        leader = cluster.wait_healthy(60)
        follower = next(m for m in cluster.members if m != leader)
        if args.load == "gets":
            load_read_set(cluster, ctx)
        if args.load in ("lists", "pages"):
            load_list_set(cluster, ctx)
        loader = threading.Thread(target=_load, args=(cluster, ctx, args.load, args.clients, stop), daemon=True)
        loader.start()
        recorders = {}
        for role, member in (("leader", leader), ("follower", follower)):
            command = ["py-spy", "record", "-p", str(cluster.pid(member)), "-d", str(args.seconds), "-r", "200",
                       "-f", "raw", "-o", str(args.out / f"{role}.txt"), "--threads"]
            recorders[role] = subprocess.Popen(command + (["--native"] if args.native else []) + (["--gil"] if args.gil else []),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for role, recorder in recorders.items():
            _, err = recorder.communicate()
            if recorder.returncode != 0:
                print(f"py-spy on the {role} failed: {err.decode()}", file=sys.stderr)
                return 1
        stop.set()
        loader.join()
        for role in recorders:
            print(summarize_collapsed(args.out / f"{role}.txt"))
        return 0
    finally:
        stop.set()
        ctx.close()
        registry.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
