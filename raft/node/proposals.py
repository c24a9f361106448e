"""Proposals waiting for their entry to be applied: a future per log index, resolved with the
state machine's result when that index is applied with the proposal's term, and failed with a
retryable NotLeaderError when another leader's entry took the index or the core drops it.

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
            proposal.future.set_exception(NotLeaderError(leader, term))

    def dropped(self, dp: DroppedProposals, term: int) -> None:
        for index in range(dp.first, dp.last + 1):
            proposal = self._by_index.get(index)
            if proposal is not None and proposal.term == dp.term:
                del self._by_index[index]
                if not proposal.future.done():
                    proposal.future.set_exception(NotLeaderError(dp.leader, term))

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Fail every waiting proposal with a fresh error()."""
        proposals, self._by_index = list(self._by_index.values()), {}
        for proposal in proposals:
            if not proposal.future.done():
                proposal.future.set_exception(error())
