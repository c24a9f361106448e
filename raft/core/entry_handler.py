"""EntryHandler: a follower's side of replication, as DLedger's EntryHandler, answering the
leader's COMPARE, TRUNCATE, APPEND and COMMIT pushes.

The caller has already checked the term (stale requests never get here — DLedger obeys stale
TRUNCATE and COMPARE requests; we do not). Rules that keep acknowledged data safe:
- TRUNCATE removes the suffix from truncate_index only if the entry there conflicts with the
  leader's (its term is neither the leader's term at that index nor the request's term), and
  never at or below the commit index: so a duplicated or delayed TRUNCATE cannot remove an entry
  the leader holds and may have counted toward a quorum.
- APPEND never deletes: an entry that conflicts with ours answers INCONSISTENT, and the leader
  goes back to COMPARE / TRUNCATE.
- An APPEND that starts past our end (batches can overtake each other) is held for a short while
  in case the gap fills, and only then answered INCONSISTENT.
- The commit index learned from a leader is capped at `verified_index`: the end of the prefix of
  our log known to match this leader's (entries past it may be stale ones from an older term)."""
from __future__ import annotations

from dataclasses import dataclass

from raft.core.config import CoreConfig
from raft.core.messages import PushCode, PushRequest, PushResponse, PushType
from raft.core.raft_log import RaftLog

MAX_HELD_BATCHES = 64


@dataclass(slots=True)
class _Held:
    request: PushRequest
    deadline: int


class EntryHandler:
    def __init__(self, log: RaftLog, config: CoreConfig) -> None:
        self.log = log
        self.config = config
        self.verified_index = 0
        self._held: dict[int, _Held] = {}  # pre_index -> batch waiting for the gap before it

    def reset(self) -> None:
        """A new leader (term): nothing is verified against it yet."""
        self.verified_index = 0
        self._held.clear()

    def matched_through(self, index: int) -> None:
        self.verified_index = max(self.verified_index, index)

    def commit_bound(self, leader_commit: int) -> int:
        return min(leader_commit, self.verified_index)

    def handle(self, req: PushRequest, now: int, commit_index: int) -> list[PushResponse]:
        if req.type == PushType.COMPARE:
            return [self._compare(req)]
        if req.type == PushType.TRUNCATE:
            return [self._truncate(req, commit_index)]
        if req.type == PushType.APPEND:
            return self._append(req, now)
        return [self._reply(req, PushCode.SUCCESS, index=self.verified_index)]  # COMMIT

    def expire_held(self, now: int) -> list[PushResponse]:
        expired = [k for k, h in self._held.items() if h.deadline <= now]
        return [self._reply(self._held.pop(k).request, PushCode.INCONSISTENT) for k in sorted(expired)]

    # --- handlers ---

    def _reply(self, req: PushRequest, code: PushCode, **fields: int) -> PushResponse:
        return PushResponse(src=req.dst, dst=req.src, term=req.term, type=req.type, code=code,
                            pre_index=req.pre_index, end_index=self.log.last_index(), **fields)

    def _compare(self, req: PushRequest) -> PushResponse:
        before_index, _ = self.log.before_begin()
        if req.pre_index <= before_index:
            # Compacted entries are committed, and committed entries match every later leader's.
            self.matched_through(req.pre_index)
            return self._reply(req, PushCode.SUCCESS)
        ours = self.log.term(req.pre_index)
        if ours is None:
            return self._reply(req, PushCode.INCONSISTENT)  # our log ends before pre_index
        if ours == req.pre_term:
            self.matched_through(req.pre_index)
            return self._reply(req, PushCode.SUCCESS)
        first = self.log.first_index_of_term(ours)
        return self._reply(req, PushCode.INCONSISTENT, x_term=ours, x_index=first if first is not None else req.pre_index)

    def _truncate(self, req: PushRequest, commit_index: int) -> PushResponse:
        at = req.truncate_index
        ours = self.log.term(at)
        before_index, _ = self.log.before_begin()
        if at <= before_index or ours is None or ours in (req.truncate_term, req.term):
            return self._reply(req, PushCode.SUCCESS)  # nothing there conflicts with the leader
        if at <= commit_index or (req.truncate_term == 0 and at <= req.commit_index):
            # Cannot happen under the protocol's invariants (the leader holds every committed
            # entry, so it knows its term there); refuse rather than lose committed data.
            return self._reply(req, PushCode.REFUSED)
        self.log.truncate_from(at)
        self.verified_index = min(self.verified_index, at - 1)
        for key in [k for k in self._held if k >= at]:
            del self._held[key]
        return self._reply(req, PushCode.SUCCESS)

    def _append(self, req: PushRequest, now: int) -> list[PushResponse]:
        if req.pre_index > self.log.last_index():
            if len(self._held) >= MAX_HELD_BATCHES:
                return [self._reply(req, PushCode.INCONSISTENT)]
            self._held[req.pre_index] = _Held(req, now + self.config.out_of_order_hold_ms)
            return []
        responses = [self._append_now(req)]
        # The batch may have filled the gap that held ones were waiting for.
        while True:
            ready = sorted(k for k in self._held if k <= self.log.last_index())
            if not ready:
                return responses
            for key in ready:
                responses.append(self._append_now(self._held.pop(key).request))

    def _append_now(self, req: PushRequest) -> PushResponse:
        before_index, _ = self.log.before_begin()
        entries = [e for e in req.entries if e.index > before_index]  # the rest are committed here
        pre_index, pre_term = req.pre_index, req.pre_term
        if pre_index < before_index:
            pre_index, pre_term = before_index, self.log.term(before_index)
            if entries and entries[0].index != before_index + 1:
                return self._reply(req, PushCode.INCONSISTENT)
        if self.log.term(pre_index) != pre_term:
            return self._reply(req, PushCode.INCONSISTENT)
        fresh = []
        for e in entries:
            ours = self.log.term(e.index)
            if ours is None:
                fresh.append(e)
            elif ours != e.term:
                return self._reply(req, PushCode.INCONSISTENT)
        if fresh:
            self.log.append(fresh)
        last = req.entries[-1].index if req.entries else req.pre_index
        self.matched_through(last)
        return self._reply(req, PushCode.SUCCESS, index=last)
