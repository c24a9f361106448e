"""A token bucket: limits the bytes per second of a snapshot stream so that sending a large
snapshot to a follower (or to `raftkv snapshot save`) does not starve heartbeats and appends."""
from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`take(n)` returns once n more bytes may go out at `rate` bytes/second, with bursts up to
    `capacity` bytes. A request larger than the bucket is allowed and paid for by waiting (the
    bucket goes into debt), so any chunk size works with any rate."""

    def __init__(self, rate: float, capacity: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError(f"rate and capacity must be positive, got {rate} and {capacity}")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._sleep = sleep
        self._tokens = capacity  # full: the first burst goes out at once
        self._last = clock()

    def take(self, amount: int) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= amount
        if self._tokens < 0:
            # The wait IS the throttle; the next take() sees the refill that happened meanwhile.
            self._sleep(-self._tokens / self.rate)
