"""Proposals waiting for their entry to be applied: a future per log index, resolved with the
state machine's result when that index is applied with the proposal's term, and failed with a
retryable NotLeaderError when another leader's entry took the index, the core drops it, or a
snapshot installed over it leaves its result unknown.

A plain future rather than a task per proposal: awaiting it under a timeout then costs no task
(this is the hot path). A caller that gives up leaves its entry until the index is applied or
dropped; settling skips futures that are done."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from raft.core.errors import NotLeaderError
from raft.core.ready import DroppedProposals
from raft.core.types import Entry


@dataclass(slots=True)
class _Proposal:
    term: int
    future: asyncio.Future[Any]


class Proposals:
    def __init__(self) -> None:
        self._by_index: dict[int, _Proposal] = {}
        self.failed = 0  # proposals that ended in an error (etcd_server_proposals_failed_total)

    def __len__(self) -> int:
        return len(self._by_index)

    def add(self, index: int, term: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._by_index[index] = _Proposal(term, future)
        return future

    def settle(self, entry: Entry, result: Any, leader: str | None, term: int) -> None:
        """`entry` was applied with `result`; `leader` and `term` are the node's view now, for the
        error of a proposal whose index another leader's entry took."""
        proposal = self._by_index.pop(entry.index, None)
        if proposal is None or proposal.future.done():
            return
        if proposal.term == entry.term:
            proposal.future.set_result(result)
        else:  # another leader's entry took this index: ours was lost with our leadership
            self.failed += 1
            proposal.future.set_exception(NotLeaderError(leader, term))

    def dropped(self, dp: DroppedProposals, term: int) -> None:
        for index in range(dp.first, dp.last + 1):
            proposal = self._by_index.get(index)
            if proposal is not None and proposal.term == dp.term:
                del self._by_index[index]
                self.failed += 1
                if not proposal.future.done():
                    proposal.future.set_exception(NotLeaderError(dp.leader, term))

    def overtaken(self, upto: int, leader: str | None, term: int) -> None:
        """The state machine reached `upto` without these entries' results (a snapshot was
        installed over them): the outcome is unknown here, so each fails as on a loss of
        leadership (a retry in the same session learns it without applying twice)."""
        self._fail(lambda index: index <= upto, lambda: NotLeaderError(leader, term))

    def fail_uncommitted(self, commit: int, error: Callable[[], Exception]) -> None:
        """Fail every waiting proposal past `commit` (the core that knew them is gone); a committed
        one still waits for its entry to be applied."""
        self._fail(lambda index: index > commit, error)

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Fail every waiting proposal with a fresh error()."""
        self._fail(lambda index: True, error)

    def _fail(self, which: Callable[[int], bool], error: Callable[[], Exception]) -> None:
        for index in [i for i in self._by_index if which(i)]:
            proposal = self._by_index.pop(index)
            self.failed += 1
            if not proposal.future.done():
                proposal.future.set_exception(error())
