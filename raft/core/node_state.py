"""NodeState: what the core (raft.py) and its parts (election.py, leadership.py) share of one node:
who it is, its configuration and log, the time, its term and the vote it cast (the hard state),
its role and the leader it follows, and the commit index. Each part reads and changes it in place,
so no part keeps a copy that could fall behind."""
from __future__ import annotations

from dataclasses import dataclass

from raft.core.config import CoreConfig
from raft.core.raft_log import RaftLog
from raft.core.types import Role

NEVER = -(1 << 62)


@dataclass(slots=True)
class NodeState:
    """`hard_dirty`: the term or the vote changed since the last Ready (which must persist them
    before any answer that depends on them leaves). `leader_contact`: when this node last heard
    from the leader it follows. `now`: the driver's time; it never moves backwards. A leader's
    dispatchers read it as their LeaderView (dispatcher.py)."""

    id: str
    config: CoreConfig
    log: RaftLog
    now: int
    term: int
    voted_for: str | None
    commit_index: int
    hard_dirty: bool = False
    role: Role = Role.FOLLOWER
    leader: str | None = None
    leader_contact: int = NEVER

    def new_term(self, term: int) -> None:
        self.term, self.voted_for, self.hard_dirty = term, None, True

    def vote(self, candidate: str) -> None:
        self.voted_for, self.hard_dirty = candidate, True

    def committed_in_term(self) -> bool:
        """Is the entry at the commit index of this node's term? (A leader's own entries commit
        only then; reads and membership changes wait for it.)"""
        return self.log.term(self.commit_index) == self.term
