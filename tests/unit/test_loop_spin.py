"""LoopSpin keeps an event loop polling (selecting with a zero timeout) until its deadline, then
lets it sleep again. The clock is a fake one the test moves, so nothing here depends on timing."""
from __future__ import annotations

import asyncio
import selectors
from typing import Any

from raft.node.loop_spin import LoopSpin, NextReadGuess


class RecordingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The loop's selector, noting the timeout of every select: 0 means the loop polled."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        return super().select(timeout)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_on_recording_loop(body: Any) -> None:
    selector = RecordingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    try:
        loop.run_until_complete(body(loop, selector))
    finally:
        loop.close()


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_loop_polls_until_the_deadline_then_sleeps() -> None:
    async def body(loop: asyncio.AbstractEventLoop, selector: RecordingSelector) -> None:
        clock = FakeClock()
        spin = LoopSpin(loop, clock)
        spin.keep_awake(0.001)
        selector.timeouts.clear()
        await turns(20)
        assert spin.awake
        assert selector.timeouts and all(t == 0 for t in selector.timeouts)

        clock.now += 0.002  # past the deadline: the next turn ends the spin
        await turns(2)
        assert not spin.awake
        # An idle wait now blocks in select (a positive timeout) instead of polling.
        selector.timeouts.clear()
        await asyncio.sleep(0.01)
        assert any(t is not None and t > 0 for t in selector.timeouts)

    run_on_recording_loop(body)


def test_keep_awake_extends_but_never_shortens_and_stop_ends_it() -> None:
    async def body(loop: asyncio.AbstractEventLoop, selector: RecordingSelector) -> None:
        clock = FakeClock()
        spin = LoopSpin(loop, clock)
        spin.keep_awake(1.0)
        spin.keep_awake(0.001)  # shorter: the one-second deadline stands
        clock.now += 0.5
        await turns(3)
        assert spin.awake
        spin.keep_awake(2.0)  # longer: extended
        clock.now += 1.0
        await turns(3)
        assert spin.awake
        spin.stop()
        await turns(2)
        assert not spin.awake
        spin.keep_awake(0)  # nothing to keep awake for
        assert not spin.awake

    run_on_recording_loop(body)


def test_next_read_guess_follows_the_recent_gaps_between_lone_reads() -> None:
    clock = FakeClock()
    guess = NextReadGuess(0.0005, clock)
    assert guess.served()  # no history: optimistic

    def read_after(gap_s: float) -> bool:
        clock.now += gap_s
        guess.arrived()
        clock.now += 0.0003  # the read's round
        return guess.served()

    assert all(read_after(0.0002) for _ in range(10))  # a closed loop: the next read comes at once
    sparse = [read_after(0.1) for _ in range(5)]  # a client reading now and then
    assert not any(sparse)
    busy_again = [read_after(0.0002) for _ in range(30)]
    assert busy_again[-1]  # the average comes back under the window
