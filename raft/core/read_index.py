"""ReadIndexTracker: the leader's bookkeeping for linearizable reads (Raft thesis §6.4).

A read takes the commit index at the moment it arrives, waits for one heartbeat round, sent after
it arrived, that a majority acknowledges (proving this node was still leader), then waits until
the state machine has applied that index. One round serves every read that arrived before it was
sent; reads arriving while a round is in flight ride the next one, so under load there is always
one round in flight carrying everything that queued up behind it."""
from __future__ import annotations

from dataclasses import dataclass

from raft.core.ready import FailedRead, ReadState


@dataclass(slots=True)
class _PendingRead:
    ctx: object
    index: int
    seq: int = 0  # the heartbeat round that confirms it (set when the round is sent)


class ReadIndexTracker:
    def __init__(self) -> None:
        self._unsent: list[_PendingRead] = []  # registered, no round sent since
        self._in_round: list[_PendingRead] = []  # waiting for their round's majority
        self._confirmed: list[_PendingRead] = []  # waiting for applied >= index
        self._awaiting_commit: list[object] = []  # a new leader has not committed in its term yet

    def add(self, ctx: object, commit_index: int | None) -> None:
        if commit_index is None:
            self._awaiting_commit.append(ctx)
        else:
            self._unsent.append(_PendingRead(ctx, commit_index))

    def committed_in_term(self, commit_index: int) -> None:
        for ctx in self._awaiting_commit:
            self._unsent.append(_PendingRead(ctx, commit_index))
        self._awaiting_commit.clear()

    def wants_round(self) -> bool:
        """Reads are waiting for a round and none is in flight."""
        return bool(self._unsent) and not self._in_round

    def round_sent(self, seq: int) -> None:
        for r in self._unsent:
            r.seq = seq
        self._in_round.extend(self._unsent)
        self._unsent.clear()

    def round_confirmed(self, seq: int) -> None:
        """Every round up to seq has been acknowledged by a majority."""
        done = [r for r in self._in_round if r.seq <= seq]
        if done:
            self._in_round = [r for r in self._in_round if r.seq > seq]
            self._confirmed.extend(done)

    def has_ready(self, applied_index: int) -> bool:
        return any(r.index <= applied_index for r in self._confirmed)

    def take_ready(self, applied_index: int) -> list[ReadState]:
        ready = [ReadState(r.ctx, r.index) for r in self._confirmed if r.index <= applied_index]
        if ready:
            self._confirmed = [r for r in self._confirmed if r.index > applied_index]
        return ready

    def fail_unconfirmed(self, leader: str | None) -> list[FailedRead]:
        """Leadership is lost: reads not yet confirmed can never be. Confirmed ones stay valid."""
        failed = [FailedRead(r.ctx, leader) for r in self._unsent + self._in_round]
        failed += [FailedRead(ctx, leader) for ctx in self._awaiting_commit]
        self._unsent.clear()
        self._in_round.clear()
        self._awaiting_commit.clear()
        return failed
