"""An asyncio event loop on a virtual clock, for running the real driver (raft/node) in the
simulator: time moves only when nothing is ready to run, and then jumps straight to the next timer.

asyncio's loop asks its selector to wait `timeout` seconds for I/O whenever it has no callback
ready; the virtual selector never waits, it moves the clock forward by `timeout` instead (so a
`sleep(0.01)` costs no wall time), and calls `on_idle` first: that is the moment every event of
the current instant has been handled, where the simulator runs its per-step checks. Nothing here
reads a real clock, and callbacks run in asyncio's own deterministic order, so one seed gives one
run."""
from __future__ import annotations

import asyncio
import math
import selectors
from typing import Any, Callable


class _VirtualSelector(selectors.SelectSelector):
    """Registers file objects as usual (the loop's own wake-up pipe) but never waits for them."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise RuntimeError("the simulated loop has nothing scheduled: it would wait forever")
        if timeout > 0:
            self.loop.idle(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now_us = 0
        # Called, with the loop, each time the loop has handled everything due at this instant
        # and is about to move the clock. It may stop the loop (then the clock stays).
        self.on_idle: Callable[[VirtualClockLoop], None] = lambda loop: None
        self._clock_resolution = 1e-7

    def time(self) -> float:
        return self._now_us / 1e6

    @property
    def now_ms(self) -> int:
        return self._now_us // 1000

    def idle(self, timeout: float) -> None:
        self.on_idle(self)
        if not self._stopping:  # type: ignore[attr-defined]
            self._now_us += max(1, math.ceil(timeout * 1e6 - 1e-3))

    def run_for(self, ms: int) -> None:
        """Run until the clock reads `ms` later (everything due by then handled)."""
        self.run_until_complete(asyncio.sleep(ms / 1000))

    def run_until(self, stop: asyncio.Future[Any]) -> Any:
        return self.run_until_complete(stop)
