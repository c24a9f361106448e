"""What one list costs the state machine alone, without gRPC or Raft: W17's list (10,000 keys of
1 KiB under one prefix) read through etcd's Range and through the native scan, each reply
serialized as the member would send it. Not a test; run it by hand:

    python benchmarks/list_range.py [--keys 10000] [--repeat 10] [--profile]

It prints the milliseconds of CPU one list takes (the median of --repeat): a full list, keys only, one page of 500, and
the whole prefix in pages of 500 (each page counting the rest, as etcd's Range does). With
--profile, cProfile's heaviest functions of full lists (docs/performance.md, Lists (W17)).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from raft.core import Entry, EntryType
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import kv_pb2
from raftkv_proto.wire import scan_items
from statemachine.commands import encode_command, put_op
from statemachine.kv_state import KVStateMachine

PREFIX, PREFIX_END = b"/registry/pods/", b"/registry/pods0"
BATCH = 500


def load(sm: KVStateMachine, keys: int) -> None:
    for index, first in enumerate(range(0, keys, BATCH), start=1):
        ops = [put_op(PREFIX + b"%08d" % i, b"x" * 1024) for i in range(first, min(first + BATCH, keys))]
        sm.apply([Entry(index, 1, EntryType.NORMAL, encode_command(ops))])


def etcd_list(sm: KVStateMachine, **options: int) -> Callable[[], None]:
    def run() -> None:
        sm.etcd_range(pb.RangeRequest(key=PREFIX, range_end=PREFIX_END, **options)).SerializeToString()
    return run


def etcd_pages(sm: KVStateMachine, page: int) -> Callable[[], None]:
    def run() -> None:
        request = pb.RangeRequest(key=PREFIX, range_end=PREFIX_END, limit=page)
        while True:
            response = sm.etcd_range(request)
            response.SerializeToString()
            if not response.more:
                return
            request.key = response.kvs[-1].key + b"\0"
    return run


def native_list(sm: KVStateMachine, keys_only: bool) -> Callable[[], None]:
    def run() -> None:  # as KVHandler.scan pages it: at most 10,000 pairs and 4 MiB a reply
        start = PREFIX
        while True:
            items, more = sm.scan(start, PREFIX_END, 10_000, 4 << 20, keys_only)
            b"".join((*scan_items(items), kv_pb2.ScanResponse(more=more).SerializeToString()))
            if not more:
                return
            start = items[-1][0] + b"\0"
    return run


def cpu_ms(run: Callable[[], None], repeat: int) -> float:
    """The median CPU of one run: a 10 MB reply's page faults vary from run to run."""
    run()
    spent = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        spent.append(time.process_time() - started)
    return statistics.median(spent) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, KVStateMachine(Path(work) / "state", map_size=4 << 30) as sm:
        load(sm, args.keys)
        lists = {
            "etcd Range, full": etcd_list(sm),
            "etcd Range, keys only": etcd_list(sm, keys_only=1),
            "etcd Range, one page of 500": etcd_list(sm, limit=500),
            "etcd Range, all in pages of 500": etcd_pages(sm, 500),
            "native scan, full": native_list(sm, False),
            "native scan, keys only": native_list(sm, True),
        }
        for name, run in lists.items():
            print(f"{name}: {cpu_ms(run, args.repeat):.1f} ms of CPU ({args.keys} keys under the prefix)")
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(lambda: [lists["etcd Range, full"]() for _ in range(args.repeat)])
            pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
