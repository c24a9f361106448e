"""A stall of this node, seen between two ticks.

A gap between ticks longer than a heartbeat interval is a stall of this node (its loop held by a
slow fsync or a GC pass, the host busy), and its timers count no more than a heartbeat interval of
it. Its loop runs timers before it reads its socket, where its leader's heartbeats (its followers'
answers) wait: counted in full, the stall would make a follower stand, or a leader step down, for
its own silence. (etcd's raft counts ticks, which a held loop drops, to the same end.) Only the
election timer (election.py), check-quorum (contact.py) and a leadership transfer's deadline
(leadership.py: a held leader would give up a transfer its target's answer is waiting to finish)
are moved on: a lease is dated by the clock itself, and a vote refused a little longer after the
leader's last contact is only safer. Decision 0074."""
from __future__ import annotations


class StallMeter:
    def __init__(self, now: int, heartbeat_interval_ms: int) -> None:
        self._last_tick = now
        self._allowed = heartbeat_interval_ms

    def held(self, now: int) -> int:
        """At a tick: the ms of the gap since the last tick beyond a heartbeat interval (0: none)."""
        held = now - self._last_tick - self._allowed
        self._last_tick = max(self._last_tick, now)
        return max(0, held)
