"""Which refused peer connections the listener logs.

A misconfigured member (another cluster id, an unknown member id, the wrong address) dials again
every few tens of milliseconds for as long as it runs, and each attempt is refused. The first
refusal of a source for a reason is logged at once; the ones after it, for one window (60 s),
are only counted, and the first refusal after the window is logged with that count. A source
that stays refused thus costs one line a minute, and the line says how often it kept trying.

Times are the caller's (the event loop's clock), so the limiter reads no clock of its own."""
from __future__ import annotations

from dataclasses import dataclass

# At most one line per source and reason in this many seconds.
WINDOW_S = 60.0
# Sources remembered; past it all are forgotten (each is then logged once more), which keeps a
# flood of distinct sources from growing the table without end.
MAX_REMEMBERED = 1000


@dataclass(slots=True)
class _Window:
    logged_at: float  # when the last line for this source and reason was logged
    suppressed: int = 0  # refusals since then that were not logged


@dataclass(frozen=True, slots=True)
class Say:
    """Log this refusal; `suppressed` refusals of the same source and reason went unlogged in the
    `elapsed` seconds since the last line about them (0 and 0.0 for a first one)."""

    suppressed: int = 0
    elapsed: float = 0.0

    def suffix(self) -> str:
        """What to append to the log line: the count of refusals not logged since the last one."""
        if not self.suppressed:
            return ""
        times = "time" if self.suppressed == 1 else "times"
        return f" (refused {self.suppressed} more {times} in the last {self.elapsed:.0f} s)"


class RefusalLog:
    """`note(source, reason, now)` for each refusal: a Say when it is to be logged, else None."""

    def __init__(self, window_s: float = WINDOW_S, max_remembered: int = MAX_REMEMBERED) -> None:
        self.window_s = window_s
        self.max_remembered = max_remembered
        self._sources: dict[str, dict[str, _Window]] = {}

    def note(self, source: str, reason: str, now: float) -> Say | None:
        reasons = self._sources.get(source)
        if reasons is None:
            if len(self._sources) >= self.max_remembered:
                self._sources.clear()
            reasons = self._sources[source] = {}
        window = reasons.get(reason)
        if window is None:
            reasons[reason] = _Window(now)
            return Say()
        if now - window.logged_at < self.window_s:
            window.suppressed += 1
            return None
        say = Say(window.suppressed, now - window.logged_at)
        reasons[reason] = _Window(now)
        return say

    def forget(self, source: str) -> None:
        """The source was accepted: its next refusal is news, logged at once."""
        self._sources.pop(source, None)
