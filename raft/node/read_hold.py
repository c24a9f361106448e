"""ReadHold: on a busy leader, hold new linearizable reads for a moment before they join a
ReadIndex round, so that one round serves more of them (PostgreSQL's commit_delay and
commit_siblings, applied to read rounds).

Why: the core already sends one round at a time, and every read that arrives while it is in
flight rides the next. But on a loaded node each round costs one heartbeat written to and read
from each follower it asks (about 0.1 ms of CPU per message on this project's bench machine),
and under a closed loop the round carries only the reads that happened to arrive during the last
one: 16 clients' gets shared a round 3.4 at a time. Holding reads for up to `delay_s` when at
least `siblings` other reads are already waiting made the rounds bigger and their cost per read
smaller (16 clients: about +20% gets/s, followers' CPU per get halved; Tuning.read_hold_ms
says why the default is 1 ms). A read waits at most `delay_s` longer; a read with fewer than
`siblings` others waiting (one client, a lightly loaded node) is never held, so a lone reader's
latency is unchanged.

The hold only decides *when* a read is handed to the core. The core takes the read's commit index
then, later than the read arrived, so the read is still linearizable: it sees at least everything
committed before it arrived.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ReadHold:
    delay_s: float  # 0 turns holding off
    siblings: int  # hold only when at least this many other reads are waiting
    _held: list[int] = field(default_factory=list)

    def hold(self, ctx: int, others_waiting: int) -> bool:
        """Whether to hold the read `ctx` (True: the caller releases it later; it must arm its
        timer when this is the first held read, see `first_held`). Once one read is held, later
        ones queue behind it so that reads reach the core in arrival order."""
        if self.delay_s <= 0 or (not self._held and others_waiting < self.siblings):
            return False
        self._held.append(ctx)
        return True

    @property
    def first_held(self) -> bool:
        return len(self._held) == 1

    def release(self) -> list[int]:
        """The held reads, oldest first; the hold is empty after."""
        held, self._held = self._held, []
        return held
