"""A member's own memory while a test attacks it: the peak of its anonymous resident memory
(RssAnon in /proc/PID/status), sampled every few milliseconds. Not VmRSS or VmHWM: those count
the pages of the LMDB file a read maps in, which the kernel takes back when it needs them."""
from __future__ import annotations

import threading
from types import TracebackType

SAMPLE_S = 0.005


def anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError(f"no RssAnon for process {pid}")


class AnonPeak:
    """`with AnonPeak(pid) as peak:` ...; then `peak.growth_mib`: the highest RssAnon seen over
    the one at the start."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_kib = anon_kib(pid)
        self.peak_kib = self.start_kib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, anon_kib(self.pid))

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak_kib = max(self.peak_kib, anon_kib(self.pid))

    @property
    def growth_mib(self) -> float:
        return (self.peak_kib - self.start_kib) / 1024
