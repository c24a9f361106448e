"""LoopSpin: keep an event loop polling instead of sleeping, until a deadline.

Why: on a virtual machine a process that sleeps is expensive to wake. Two Python processes
exchanging 300 bytes over loopback take 68 µs a round trip when each blocks in `recv`, 13 µs when
each polls (README, "Where the time goes"): each wake-up costs about 28 µs, and a lone reader's
linearizable get meets several (the client's request, the follower's answer to the heartbeat
round). While the loop has a callback ready it polls its sockets without blocking, so a callback
that schedules itself again keeps the loop awake: a message that arrives meanwhile is read at the
next turn, with no wake-up. Go's scheduler does the same when it spins briefly before it parks an
idle thread.

The price is CPU: the loop burns its core until the deadline. RaftNode therefore spins only for a
lone linearizable read, while its round is in flight and for a moment after it is served (when
the same client's next request is likely on its way), never under load, when the loop has work
anyway (`LoneReadSpin`, the policy). Tuning.read_spin_us sets the moment; 0 turns spinning
off. `NextReadGuess` skips the moment after a read when lone reads have lately come further apart
than that: a client that reads now and then costs the round's spin only.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable


class LoopSpin:
    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = loop
        self._clock = clock
        self._until = 0.0
        self._handle: asyncio.Handle | None = None

    @property
    def awake(self) -> bool:
        """Whether the loop is being kept awake (a spin callback is scheduled)."""
        return self._handle is not None

    def keep_awake(self, seconds: float) -> None:
        """Keep the loop polling for at least `seconds` from now (never shortens a spin)."""
        if seconds <= 0:
            return
        self._until = max(self._until, self._clock() + seconds)
        if self._handle is None:
            self._handle = self._loop.call_soon(self._turn)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._until = 0.0

    def _turn(self) -> None:
        if self._clock() < self._until:
            self._handle = self._loop.call_soon(self._turn)
        else:
            self._handle = None


class NextReadGuess:
    """Whether the next lone read is likely to arrive within `window_s` of the last one served:
    a moving average of the recent gaps (each new gap weighs `weight`), starting optimistic."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic, weight: float = 0.25) -> None:
        self._window = window_s
        self._clock = clock
        self._weight = weight
        self._served_at: float | None = None
        self._gap = 0.0

    def arrived(self) -> None:
        """A lone read arrived."""
        if self._served_at is not None:
            gap = self._clock() - self._served_at
            self._gap += self._weight * (gap - self._gap)
            self._served_at = None

    def served(self) -> bool:
        """A lone read was served; whether to keep polling for the next one."""
        self._served_at = self._clock()
        return self._gap <= self._window


class LoneReadSpin:
    """The read spin's policy on one leader: poll while a lone read's round is in flight, and for
    `span_s` after it is served while `NextReadGuess` expects the next lone read within it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, span_s: float) -> None:
        self._spin = LoopSpin(loop)
        self._span = span_s
        self._next = NextReadGuess(span_s)
        self._ctx: object = None  # the lone read in flight, if any

    @property
    def awake(self) -> bool:
        return self._spin.awake

    def started(self, ctx: object) -> None:
        """A read arrived on the leader with no other read waiting."""
        self._ctx = ctx
        self._next.arrived()
        self._spin.keep_awake(self._span)

    def served(self, ctx: object) -> None:
        """A read was served (any read: only the lone one in flight counts)."""
        if ctx is not None and ctx == self._ctx:
            self._ctx = None
            if self._next.served():
                self._spin.keep_awake(self._span)

    def stop(self) -> None:
        self._spin.stop()
