"""Micro-benchmark of the log's save: entries/s and syncs/s (one durable write per save) for
batches of 1, 16 and 256 entries of 300 bytes on the write-ahead log (WalLogStore), and the p50 of
a save. Not a test; run it by hand:

    python benchmarks/log_store_bench.py [--seconds 2] [--dir /path/on/the/disk/to/measure] [--no-fsync]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from raft.core.types import Entry, HardState  # noqa: E402
from raft.log import WalLogStore  # noqa: E402

PAYLOAD = b"v" * 300
BATCHES = (1, 16, 256)


@dataclass(frozen=True, slots=True)
class Result:
    batch: int
    saves: int
    seconds: float
    p50_ms: float

    @property
    def saves_per_second(self) -> float:
        return self.saves / self.seconds

    @property
    def entries_per_second(self) -> float:
        return self.saves * self.batch / self.seconds


def measure(directory: Path, batch: int, seconds: float, fsync: bool) -> Result:
    with WalLogStore(directory, fsync=fsync) as store:
        next_index, saves, took = 1, 0, []
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            entries = [Entry(next_index + k, 1, payload=PAYLOAD) for k in range(batch)]
            before = time.perf_counter()
            store.save(HardState(1, "n1") if saves == 0 else None, None, entries)
            took.append(time.perf_counter() - before)
            next_index += batch
            saves += 1
        return Result(batch, saves, time.perf_counter() - started, 1000 * sorted(took)[len(took) // 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per batch size")
    parser.add_argument("--dir", type=Path, default=None, help="where to create the stores (default: a temp dir)")
    parser.add_argument("--no-fsync", action="store_true", help="open with fsync=False, to see what fsync costs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        print(f"store under {root}, fsync={'off' if args.no_fsync else 'on'}, payload {len(PAYLOAD)} B")
        per_save = "commits/s" if args.no_fsync else "fsyncs/s"  # one commit per save, fsynced when on
        print(f"{'batch':>6} {'saves':>8} {per_save:>10} {'entries/s':>11} {'p50 ms':>7}")
        for batch in BATCHES:
            r = measure(Path(root) / f"wal-{batch}", batch, args.seconds, fsync=not args.no_fsync)
            print(f"{r.batch:>6} {r.saves:>8} {r.saves_per_second:>10.0f} {r.entries_per_second:>11.0f} {r.p50_ms:>7.3f}")


if __name__ == "__main__":
    main()
