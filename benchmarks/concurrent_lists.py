"""The leader's CPU per list when several clients list at once: a local three-node cluster holding
W17's keys (10,000 of 1 KiB under one prefix), N clients on threads of their own, each listing the
prefix 6 times (after one untimed list), whole and in pages of 500. Not a test; run it by hand:

    python benchmarks/concurrent_lists.py --api etcd --clients 4
    python benchmarks/concurrent_lists.py --api native --clients 1

Prints lists/s and the leader's CPU time per list (user + system, from /proc) for each variant.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from kv.tools.bench.cpu import process_cpu_s  # noqa: E402
from kv.tools.bench.list_workload import load_list_set  # noqa: E402
from kv.tools.bench.processes import Registry  # noqa: E402
from kv.tools.bench.raftkv_cluster import RaftkvCluster  # noqa: E402
from kv.tools.bench.settings import Sizes  # noqa: E402
from kv.tools.bench.systems import APIS  # noqa: E402
from kv.tools.bench.workloads import Context  # noqa: E402

LISTS_PER_CLIENT = 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", choices=APIS, default="etcd")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    registry, work = Registry(), Path(tempfile.mkdtemp(prefix="raftkv-lists-", dir="."))
    cluster = RaftkvCluster(work, registry, api=args.api)
    ctx = Context(work, Sizes())
    try:
        cluster.start()
        leader = cluster.pid(cluster.wait_healthy(60))
        assert leader is not None
        prefix = load_list_set(cluster, ctx)
        targets = [ctx.target(cluster) for _ in range(args.clients)]
        for page in (0, 500):
            for target in targets:
                target.list_prefix(prefix, False, page)

            def lists(target, page=page):  # type: ignore[no-untyped-def]
                for _ in range(LISTS_PER_CLIENT):
                    target.list_prefix(prefix, False, page)
            threads = [threading.Thread(target=lists, args=(t,)) for t in targets]
            cpu, started = process_cpu_s(leader), time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            done = LISTS_PER_CLIENT * args.clients
            print(f"{args.api} API, {args.clients} clients, {'whole' if not page else f'pages of {page}'}: "
                  f"{done / (time.perf_counter() - started):.1f} lists/s, leader CPU "
                  f"{(process_cpu_s(leader) - cpu) / done * 1000:.0f} ms per list")
    finally:
        ctx.close()
        registry.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
