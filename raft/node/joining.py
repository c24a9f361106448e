"""Joining: how a node whose data directory is empty takes its place in its cluster, and how it
rejoins after losing its data.

A member of a cluster of several that starts with nothing on disk (no entry, no snapshot, no
vote) cannot tell by itself whether its cluster is new (every member starts empty: it is one of
its founders) or already has a log (its disk was lost, or replaced by an empty one). A founder
votes as any member; a member rejoining must not vote for just anyone, or its empty log would
help elect a candidate that lacks entries its lost copy held. So such a node holds (it drops what
peers send) and asks its peers (PeerTransport.probe) for their term and the end of their log,
until enough have answered that any majority less one member, this one, includes one of them:
all but a majority less two of its peers, two of three, three of five. At a cluster's first start
it therefore waits until that many are up.

Anything committed is on a majority, so on at least a majority less one of its peers, whether or
not its own lost disk was one of them: one of them answered. If every log that answered is empty,
nothing was ever committed and it is a founder. Otherwise it rejoins: until it has caught up it
never stands and votes only for a candidate at least as up to date as the best log that answered,
its rejoin floor (a candidate that is holds everything committed; RaftCore's `rejoin_floor`). The
floor is asked again every election timeout and lowered when the best log now is less up to date
(the node that held it lost its disk too, with nothing committed on it), so a floor no log reaches
any more cannot stall the cluster. Either way it takes the highest term reported (a first start:
0), marked as voted in, so it cannot vote again in a term it voted in before it lost its data, nor
acknowledge a leader it had outgrown; and it raises no term: a leader a majority follows goes on
leading it (one above the highest term would depose that leader at its first answer). What its
peers cannot tell is a vote the lost disk cast in an election none of them has seen; a member
replaced under a new id (membership change) has no such gap."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raft.core.log_store import LogStore
from raft.core.quorum import majority
from raft.core.types import HardState
from raft.node.ports import RejoinRecord

if TYPE_CHECKING:
    from raft.node.node import RaftNode

log = logging.getLogger(__name__)

# How often the peers are asked again while too few have answered.
PROBE_PAUSE_S = 0.2
# A log's end: (last term, last index); (0, 0) for an empty log.
LogEnd = tuple[int, int]
# The floor while the node does not yet know what its cluster holds: no log is that up to date,
# so it votes for no one meanwhile.
HOLD: LogEnd = (1 << 62, 1 << 62)


def disk_state(log_store: LogStore) -> tuple[int, int, int]:
    """This node's term and the end of its log (compacted entries count), as on its disk: what
    it answers a probe."""
    last = log_store.last_index()
    return log_store.hard_state().term, log_store.term(last) or 0, last


def starts_empty(log_store: LogStore, applied_index: int, has_snapshot: bool) -> bool:
    """Nothing on disk: no entry, no snapshot, no applied state, no term, no vote."""
    return (log_store.hard_state() == HardState() and log_store.last_index() == 0 and applied_index == 0
            and not has_snapshot)


class Joining:
    """The join of one node: made with the node, it says the floor the core starts with, then
    `run` (a task of the node) finds what the cluster holds and keeps the floor fresh."""

    def __init__(self, node: RaftNode, record: RejoinRecord, empty: bool) -> None:
        self._node = node
        self._record = record
        self._members = node.config.members
        self.holding = empty and len(self._members) > 1  # the node drops what peers send meanwhile
        self.floor: LogEnd | None = HOLD if self.holding else record.load()

    @property
    def needed(self) -> bool:
        return self.holding or self.floor is not None

    async def run(self) -> None:
        node = self._node
        if self.holding:
            term, floor = await self._ask()
            if floor is not None:
                log.warning("node %s starts with an empty data directory in a cluster that has a log: it rejoins "
                            "at term %d and votes only for a candidate at least as up to date as %s until it has "
                            "caught up", node.id, term, floor)
            self._set_floor(floor)  # on disk before the node takes the term
            node.core.join(term, floor)
            self.holding = False
            node.poke()
        pause = node.config.core.election_timeout_ms / 1000
        while self.floor is not None:
            await asyncio.sleep(pause)
            if not node.core.rejoining:
                return
            _, best = await self._ask()
            if self.floor is not None and best is not None and best < self.floor:
                log.info("node %s lowers its rejoin floor from %s to %s: the log that reached it is gone",
                         node.id, self.floor, best)
                self._set_floor(best)
                node.core.refloor(best)
            elif self.floor is not None and best is None:
                self._set_floor(None)
                node.core.refloor(None)

    def caught_up(self) -> None:
        """The core votes again: forget the floor, durably."""
        if self.floor is not None:
            self._set_floor(None)

    def _set_floor(self, floor: LogEnd | None) -> None:
        self._record.save(floor)
        self.floor = floor

    async def _ask(self) -> tuple[int, LogEnd | None]:
        """Ask the peers until enough have answered: (the highest term they hold, 0 if none; the
        best end of their logs, None when all are empty)."""
        node = self._node
        need = len(self._members) - majority(len(self._members)) + 1
        waited = False
        while True:
            answers = await node.transport.probe()
            if len(answers) >= need:
                terms = [term for term, _, _ in answers.values()]
                best = max((last_term, last_index) for _, last_term, last_index in answers.values())
                return max(terms), (None if best == (0, 0) else best)
            if not waited and self.holding:
                log.info("node %s starts empty: waiting for %d more member(s) to answer before it joins",
                         node.id, need - len(answers))
                waited = True
            await asyncio.sleep(PROBE_PAUSE_S)
