"""Closed-loop load: N worker threads, each with its own Target, each issuing one operation after
another for a fixed time after a warm-up; throughput and latency percentiles over that window."""
from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv.tools.bench import stopping

# An operation of worker w: called with the worker's running operation number.
Operation = Callable[[int], None]


@dataclass
class LoadResult:
    ops: int
    seconds: float
    latencies_s: list[float] = field(repr=False)
    # What closed_loop's `probe` returned at the start and at the end of the measured window.
    probes: tuple[Any, Any] | None = None

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, p: float) -> float:
        return percentile(self.latencies_s, p) * 1000.0


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100.0 * len(ordered))))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class _Worker:
    operation: Operation
    latencies: list[float] = field(default_factory=list)
    error: BaseException | None = None


def closed_loop(operations: list[Operation], duration_s: float, warmup_s: float,
                probe: Callable[[], Any] | None = None) -> LoadResult:
    """Run every operation in its own thread, back to back, for warmup_s + duration_s; count the
    operations that started and finished inside the measured window. A worker's exception stops
    all and is raised. `probe` (say, the processes' CPU times) is called as the measured window
    opens and as it closes."""
    workers = [_Worker(op) for op in operations]
    stop = threading.Event()
    start_line = threading.Barrier(len(workers) + 1)
    window: list[float] = []

    def run(worker: _Worker) -> None:
        start_line.wait()
        begin, end = window
        i = 0
        try:
            while not stop.is_set() and not stopping.stop_requested.is_set():
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                worker.operation(i)
                t1 = time.perf_counter()
                if t0 >= begin and t1 <= end:
                    worker.latencies.append(t1 - t0)
                i += 1
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            worker.error = error
            stop.set()

    threads = [threading.Thread(target=run, args=(w,), daemon=True, name=f"bench-{i}") for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    now = time.perf_counter()
    window.extend([now + warmup_s, now + warmup_s + duration_s])
    start_line.wait()
    probes: tuple[Any, Any] | None = None
    try:
        if probe is not None:
            _wait_until(window[0], stop)
            first = probe()
            _wait_until(window[1], stop)
            probes = (first, probe())
        for thread in threads:
            stopping.join(thread)
    finally:
        stop.set()
    stopping.check()
    for worker in workers:
        if worker.error is not None:
            raise worker.error
    latencies = [lat for w in workers for lat in w.latencies]
    return LoadResult(len(latencies), duration_s, latencies, probes)


def _wait_until(instant: float, stop: threading.Event) -> None:
    """Until time.perf_counter() reaches `instant`, or a worker failed, or Ctrl-C."""
    while (left := instant - time.perf_counter()) > 0 and not stop.is_set():
        stopping.stop_requested.wait(min(left, 0.1))
        stopping.check()
