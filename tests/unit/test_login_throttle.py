"""Logins slowed per user name (kv/server/login_throttle.py), on a clock and a sleep of the test's:
a guesser's attempts wait longer and longer, in line, while the right password still gets in and
other names are not slowed."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kv.server import login_throttle
from kv.server.login_throttle import BASE_S, FREE_FAILURES, MAX_S, QUIET_S, LoginThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def refused() -> Callable[[], Awaitable[str | None]]:
    async def check() -> str | None:
        return None
    return check


def test_failures_in_a_row_slow_the_next_attempts_then_a_success_clears_them() -> None:
    async def main() -> None:
        clock = Clock()
        throttle = LoginThrottle(clock, clock.sleep)
        for _ in range(FREE_FAILURES + 8):
            assert await throttle.attempt("root", refused()) is None
        expected = [min(MAX_S, BASE_S * 2 ** n) for n in range(8)]
        assert clock.slept == expected  # none for the first, then doubling to the cap
        assert throttle.delay("root") == MAX_S and throttle.delay("alice") == 0.0  # other names as before

        async def right() -> str | None:
            return "token"
        assert await throttle.attempt("root", right) == "token"  # still gets in, after its wait
        assert throttle.delay("root") == 0.0
        clock.now += QUIET_S + 1  # failures long ago are forgotten
        for _ in range(FREE_FAILURES):
            await throttle.attempt("bob", refused())
        clock.now += QUIET_S + 1
        assert throttle.delay("bob") == 0.0
    asyncio.run(main())


def test_attempts_on_one_name_wait_in_line() -> None:
    async def main() -> None:
        clock = Clock()
        throttle = LoginThrottle(clock, clock.sleep)
        running = 0
        most = 0

        async def slow_refusal() -> str | None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0)
            running -= 1
            return None
        await asyncio.gather(*(throttle.attempt("root", slow_refusal) for _ in range(10)))
        assert most == 1  # parallel guesses take no free checks
        assert len(clock.slept) == 10 - FREE_FAILURES
    asyncio.run(main())


def test_names_kept_are_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(login_throttle, "MAX_NAMES", 5)

    async def main() -> None:
        clock = Clock()
        throttle = LoginThrottle(clock, clock.sleep)
        for i in range(50):
            await throttle.attempt(f"made-up-{i}", refused())
        assert len(throttle._names) == 5
    asyncio.run(main())
