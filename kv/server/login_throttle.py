"""Logins slowed per user name, on each member, so that a password guesser gets slow answers while
the right password still gets in.

A name's failed logins in a row (forgotten once QUIET_S pass without one) make its next attempt
wait before it is checked: nothing for the first FREE_FAILURES, then BASE_S, doubling up to MAX_S.
Attempts on one name take their turn, one at a time, so guesses sent in parallel wait in line
rather than each taking a free check. A success clears the name. Names are kept for at most
MAX_NAMES at once (the oldest forgotten first), so guessing under made-up names costs the member
bounded memory. What a name's failures cost is only time on that name: other names log in as
before."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

FREE_FAILURES = 3
BASE_S = 0.1
MAX_S = 3.0
QUIET_S = 300.0
MAX_NAMES = 10_000


@dataclass(slots=True)
class _Name:
    failures: int = 0
    last_failure: float = 0.0
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)


class LoginThrottle:
    def __init__(self, clock: Callable[[], float], sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._names: OrderedDict[str, _Name] = OrderedDict()

    def delay(self, name: str) -> float:
        """How long the next attempt on `name` waits before it is checked."""
        entry = self._names.get(name)
        if entry is None or self._clock() - entry.last_failure > QUIET_S:
            return 0.0
        over = entry.failures - FREE_FAILURES
        return 0.0 if over < 0 else min(MAX_S, BASE_S * 2 ** min(over, 32))

    async def attempt(self, name: str, check: Callable[[], Awaitable[T | None]]) -> T | None:
        """Run `check` (a login: its token, or None when refused) in `name`'s turn, after its delay;
        count a refusal, clear the name on a success."""
        entry = self._entry(name)
        async with entry.turn:
            wait = self.delay(name)
            if wait:
                await self._sleep(wait)
            result = await check()
            if result is None:
                if self._clock() - entry.last_failure > QUIET_S:
                    entry.failures = 0
                entry.failures += 1
                entry.last_failure = self._clock()
            else:
                entry.failures = 0
            return result

    def _entry(self, name: str) -> _Name:
        entry = self._names.get(name)
        if entry is None:
            entry = self._names[name] = _Name()
            while len(self._names) > MAX_NAMES:
                oldest, kept = next(iter(self._names.items()))
                if kept.turn.locked():
                    break  # in use: forget it later
                del self._names[oldest]
        else:
            self._names.move_to_end(name)
        return entry
