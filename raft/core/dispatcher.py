"""Dispatcher: the leader's replication to one follower, as DLedger's EntryDispatcher.

States (each transition happens here and nowhere else, in `_change_state`):
  COMPARE          find the highest index where the follower's log matches ours, probing
                   (pre_index, pre_term) downwards with the fast backup: the follower answers its
                   end index, or x_term (its term at pre_index) and x_index (the first index of
                   x_term); when we hold x_term too we jump only to our last entry of it, so
                   entries that match are neither deleted nor resent.
  TRUNCATE         the follower holds entries past the match point, and they conflict: ask it to
                   drop them (it obeys only if its entry there really differs from ours).
  APPEND           pipelined batches from next_index; a batch unanswered for push_timeout_ms is
                   sent again from match + 1; INCONSISTENT goes back to COMPARE.
  INSTALL_SNAPSHOT the follower needs entries we compacted: the driver streams the newest snapshot.
A lazy dispatcher (thrifty replication, raft/core/eager_set.py) sends APPEND batches only when
they are full, or once lazy_push_ms has passed since it last sent the log's tail.
The commit index rides on every push; when there is nothing to append and an eager follower's
commit is behind, a COMMIT push carries it at the next tick (a lazy one learns it from its next
batch or heartbeat). Not at once: under load the next APPEND carries it anyway, and for a lone
write an immediate COMMIT push would cost every node a message on that write's path (the leader
answers its client once it has applied; followers only need the commit index for their own
apply)."""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from raft.core.config import CoreConfig
from raft.core.messages import InstallSnapshotResponse, Message, PushCode, PushRequest, PushResponse, PushType
from raft.core.raft_log import LogCompactedError, RaftLog
from raft.core.ready import SnapshotSend


class LeaderView(Protocol):
    """What a dispatcher may read of its leader."""

    @property
    def id(self) -> str: ...
    @property
    def term(self) -> int: ...
    @property
    def commit_index(self) -> int: ...
    log: RaftLog
    config: CoreConfig


class DispatchState(enum.Enum):
    COMPARE = "compare"
    TRUNCATE = "truncate"
    APPEND = "append"
    INSTALL_SNAPSHOT = "install_snapshot"


@dataclass(slots=True)
class Inflight:
    pre_index: int
    last_index: int
    sent_at: int
    # Sent eager, with only entries appended since the follower became eager: its round trip is
    # what a write waits for (a catch-up batch or a lazy one is larger, and says less).
    timed: bool


Outgoing = Message | SnapshotSend


class Dispatcher:
    def __init__(self, peer: str, leader: LeaderView) -> None:
        self.peer = peer
        self.leader = leader
        self.match_index = 0
        self.next_index = 0  # APPEND: the next entry to send
        self.follower_end: int | None = None
        self.state = DispatchState.COMPARE
        self._probe = 0  # COMPARE: the pre_index being asked about
        self._awaiting_since: int | None = None  # a COMPARE / TRUNCATE / snapshot unanswered since
        self._inflight: deque[Inflight] = deque()
        self._commit_sent = -1
        self._idle_until = 0  # after a failed snapshot stream or a compare without progress: pause
        self._eager = True  # gets new entries at once (eager_set.py decides, at the leader's ticks)
        self._eager_from = leader.log.last_index()  # the log's end when it last became eager
        # How long this follower takes to answer an APPEND batch, moving averages (None until the
        # first answer): over all its batches, and over its timed ones (Inflight.timed) only.
        # eager_set.py compares them.
        self.answer_ms: float | None = None
        self.eager_answer_ms: float | None = None
        self.timed_answer_at: int | None = None  # when the newest timed batch was answered
        self._tail_due = 0  # lazy: when a batch that is not full may go (lazy_push_ms after the last)
        # lazy: the unsent tail's bytes as far as they were added up, [_tail_from, _tail_through]
        # (_tail_fills_batch keeps the sum as the tail grows instead of reading it whole at each poll)
        self._tail_from = 0
        self._tail_through = -1
        self._tail_bytes = 0

    def start(self, now: int) -> list[Outgoing]:
        """A new leader begins by finding where the follower's log matches its own."""
        return self._change_state(DispatchState.COMPARE, now, probe=self.leader.log.last_index())

    # --- events ---

    def on_push_response(self, resp: PushResponse, now: int) -> list[Outgoing]:
        self.follower_end = resp.end_index
        if resp.type == PushType.APPEND:
            return self._on_append_response(resp, now)
        if resp.type == PushType.COMPARE and self.state == DispatchState.COMPARE and resp.pre_index == self._probe:
            return self._on_compare_response(resp, now)
        if resp.type == PushType.TRUNCATE and self.state == DispatchState.TRUNCATE and resp.pre_index == self.match_index:
            if resp.code == PushCode.SUCCESS:
                return self._change_state(DispatchState.APPEND, now)
            return self._change_state(DispatchState.COMPARE, now, probe=self._start_probe())
        return self.poll(now)  # a stale or duplicate answer (COMMIT answers land here too)

    def on_snapshot_response(self, resp: InstallSnapshotResponse, now: int) -> list[Outgoing]:
        if self.state != DispatchState.INSTALL_SNAPSHOT:
            return []
        self.follower_end = resp.end_index
        if resp.success:
            self.match_index = max(self.match_index, resp.index)
            return self._change_state(DispatchState.COMPARE, now, probe=self.match_index)
        # The stream failed (peer down, link cut): do not hammer it; compare again a little later.
        self._idle_until = now + self.leader.config.push_timeout_ms
        return self._change_state(DispatchState.COMPARE, now, probe=self._start_probe())

    def on_heartbeat_response(self, end_index: int) -> None:
        self.follower_end = end_index

    def follower_lost_entries(self, end_index: int, now: int) -> list[Outgoing]:
        """The follower holds less than it acknowledged (its disk was lost, or replaced by an older
        copy): find the match point again from its end, at once. Its log still matches ours that
        far: what it acknowledged matched ours, and what is left of it is a prefix of that."""
        self.match_index = min(self.match_index, end_index)
        self.follower_end = end_index
        self._idle_until = 0
        return self._change_state(DispatchState.COMPARE, now, probe=self.match_index)

    @property
    def eager(self) -> bool:
        return self._eager

    @eager.setter
    def eager(self, value: bool) -> None:
        if value and not self._eager:
            self._eager_from = self.leader.log.last_index()
        self._eager = value

    def keeping_up(self, now: int) -> bool:
        """Appending, with no batch unanswered for eager_timeout_ms: able to help commit a write now."""
        if self.state != DispatchState.APPEND:
            return False
        return not self._inflight or now - self._inflight[0].sent_at < self.leader.config.eager_timeout_ms

    def tick(self, now: int) -> list[Outgoing]:
        cfg = self.leader.config
        if self.state == DispatchState.APPEND:
            if self._inflight and now - self._inflight[0].sent_at >= cfg.push_timeout_ms:
                # Lost or very late: resend everything from the last acknowledged point.
                self._inflight.clear()
                self.next_index = self.match_index + 1
        elif self._awaiting_since is not None:
            limit = cfg.snapshot_timeout_ms if self.state == DispatchState.INSTALL_SNAPSHOT else cfg.push_timeout_ms
            if now - self._awaiting_since >= limit:
                if self.state == DispatchState.INSTALL_SNAPSHOT:
                    return self._change_state(DispatchState.COMPARE, now, probe=self._start_probe())
                self._awaiting_since = None  # ask again
        return self.poll(now) or (self._commit_push() if self.eager else [])

    def poll(self, now: int) -> list[Outgoing]:
        """Send whatever the current state allows now."""
        if self.state == DispatchState.APPEND:
            return self._send_appends(now)
        if self._awaiting_since is not None or now < self._idle_until:
            return []
        if self.state == DispatchState.COMPARE:
            return self._send_compare(now)
        if self.state == DispatchState.TRUNCATE:
            return self._send_truncate(now)
        self._awaiting_since = now
        return [SnapshotSend(self.peer, self.leader.term)]

    # --- the state machine ---

    def _change_state(self, state: DispatchState, now: int, probe: int = 0) -> list[Outgoing]:
        self.state = state
        self._awaiting_since = None
        self._inflight.clear()
        if state == DispatchState.COMPARE:
            self._probe = max(probe, self.match_index)
            if self._probe < self.leader.log.before_begin()[0]:
                return self._change_state(DispatchState.INSTALL_SNAPSHOT, now)
        elif state == DispatchState.APPEND:
            self.next_index = self.match_index + 1
        return self.poll(now)

    def _start_probe(self) -> int:
        last = self.leader.log.last_index()
        return last if self.follower_end is None else min(last, self.follower_end)

    def _push(self, type_: PushType, **fields: object) -> PushRequest:
        return PushRequest(src=self.leader.id, dst=self.peer, term=self.leader.term, type=type_,
                           commit_index=self.leader.commit_index, **fields)  # type: ignore[arg-type]

    def _send_compare(self, now: int) -> list[Outgoing]:
        term = self.leader.log.term(self._probe)
        if term is None:  # compacted meanwhile
            return self._change_state(DispatchState.INSTALL_SNAPSHOT, now)
        self._awaiting_since = now
        return [self._push(PushType.COMPARE, pre_index=self._probe, pre_term=term)]

    def _on_compare_response(self, resp: PushResponse, now: int) -> list[Outgoing]:
        if resp.code == PushCode.SUCCESS:
            self.match_index = max(self.match_index, resp.pre_index)
            if resp.end_index > self.match_index:
                return self._change_state(DispatchState.TRUNCATE, now)
            return self._change_state(DispatchState.APPEND, now)
        if resp.code != PushCode.INCONSISTENT:
            return []
        if resp.pre_index <= self.match_index:
            # It lacks (or holds another term at) an index it acknowledged: it lost entries. A
            # shorter log is a prefix of what it had; a different one is searched from the start.
            self.match_index = min(self.match_index, resp.end_index) if resp.x_term == 0 else 0
        probe = max(self._backup(resp), self.match_index)
        if probe == self._probe:
            # No progress (a duplicated answer, or a follower that lost entries): ask again only
            # after a pause, or duplicates would multiply compares.
            self._idle_until = now + self.leader.config.push_timeout_ms
        return self._change_state(DispatchState.COMPARE, now, probe=probe)

    def _backup(self, resp: PushResponse) -> int:
        """The next index to compare at after an INCONSISTENT answer about resp.pre_index."""
        if resp.x_term == 0:
            return min(resp.end_index, resp.pre_index - 1)
        ours = self.leader.log.last_index_of_term(resp.x_term)
        if ours is not None:
            return min(ours, resp.pre_index - 1)
        return resp.x_index - 1

    def _send_truncate(self, now: int) -> list[Outgoing]:
        at = self.match_index + 1
        if at <= self.leader.log.last_index() and self.leader.log.term(at) is None:
            # We compacted past the match point since the compare: we can no longer tell the
            # follower our term there, and "no entry" would be a lie that deletes committed data.
            return self._change_state(DispatchState.INSTALL_SNAPSHOT, now)
        self._awaiting_since = now
        return [self._push(PushType.TRUNCATE, pre_index=self.match_index,
                           pre_term=self.leader.log.term(self.match_index) or 0,
                           truncate_index=at, truncate_term=self.leader.log.term(at) or 0)]

    def _send_appends(self, now: int) -> list[Outgoing]:
        cfg, log = self.leader.config, self.leader.log
        out: list[Outgoing] = []
        last = log.last_index()
        while len(self._inflight) < cfg.max_inflight_batches and self.next_index <= last:
            pre = self.next_index - 1
            pre_term = log.term(pre)
            if pre_term is None or pre < log.before_begin()[0]:
                return out + self._change_state(DispatchState.INSTALL_SNAPSHOT, now)
            try:
                if not self.eager and now < self._tail_due and not self._tail_fills_batch(last):
                    break  # a lazy follower's tail waits until it is due or fills a batch
                batch = log.entries(self.next_index, min(last + 1, self.next_index + cfg.max_batch_entries),
                                    cfg.max_batch_bytes)
            except LogCompactedError:  # compacted since we looked
                return out + self._change_state(DispatchState.INSTALL_SNAPSHOT, now)
            if batch[-1].index == last and len(batch) < cfg.max_batch_entries:  # not a full batch
                self._tail_due = now + cfg.lazy_push_ms
            out.append(self._push(PushType.APPEND, pre_index=pre, pre_term=pre_term, entries=batch))
            self._inflight.append(Inflight(pre, batch[-1].index, now, timed=self._eager and pre >= self._eager_from))
            self.next_index = batch[-1].index + 1
        if out:
            self._commit_sent = self.leader.commit_index
        return out

    def _tail_fills_batch(self, last: int) -> bool:
        """Whether next_index..last makes a full batch: max_batch_entries entries, or two or more
        past max_batch_bytes (what log.entries would cut short). The byte sum grows with the tail:
        a lazy tail is checked at every poll, and reading it whole each time (up to lazy_push_ms of
        writes) took a tenth of the leader's CPU under load. Raises LogCompactedError."""
        cfg = self.leader.config
        count = last - self.next_index + 1
        if count >= cfg.max_batch_entries:
            return True
        if self._tail_from != self.next_index or self._tail_through > last:
            self._tail_from, self._tail_through, self._tail_bytes = self.next_index, self.next_index - 1, 0
        if self._tail_through < last:
            self._tail_bytes += sum(e.size() for e in self.leader.log.entries(self._tail_through + 1, last + 1))
            self._tail_through = last
        return count >= 2 and self._tail_bytes > cfg.max_batch_bytes

    def _commit_push(self) -> list[Outgoing]:
        """(At a tick) a COMMIT push for a follower whose commit index is behind while nothing is
        in flight to it."""
        commit = self.leader.commit_index
        if (self.state != DispatchState.APPEND or self._inflight or commit <= self._commit_sent
                or self.match_index == 0):
            return []
        self._commit_sent = commit
        return [self._push(PushType.COMMIT)]

    def _on_append_response(self, resp: PushResponse, now: int) -> list[Outgoing]:
        if self.state != DispatchState.APPEND:
            return []
        if resp.code == PushCode.SUCCESS:
            self.match_index = max(self.match_index, resp.index)
            while self._inflight and self._inflight[0].last_index <= self.match_index:
                self._note_answer_time(now, self._inflight.popleft())
            return self._send_appends(now)
        if resp.code == PushCode.INCONSISTENT and any(f.pre_index == resp.pre_index for f in self._inflight):
            return self._change_state(DispatchState.COMPARE, now, probe=self._start_probe())
        return []

    def _note_answer_time(self, now: int, batch: Inflight) -> None:
        ms = now - batch.sent_at
        self.answer_ms = _moving_average(self.answer_ms, ms)
        if batch.timed:
            self.eager_answer_ms = _moving_average(self.eager_answer_ms, ms)
            self.timed_answer_at = now


def _moving_average(average: float | None, sample: int) -> float:
    """A weight of 1/8: a few dozen answers move it, one late answer does not."""
    return float(sample) if average is None else average + (sample - average) / 8
