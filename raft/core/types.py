"""Plain data the protocol is made of: log entries, hard state, roles, snapshot metadata."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class EntryType(enum.IntEnum):
    """What an entry's payload is. NOOP is the entry a new leader appends in its term."""

    NORMAL = 0
    NOOP = 1
    # A configuration: the whole membership after one change (raft/core/membership.py). The
    # state machine records it (it is part of every snapshot) and otherwise treats it as a NOOP.
    CONFIG = 2


# What an entry costs beyond its payload in batch-size limits (index, term, type, framing).
ENTRY_OVERHEAD = 24


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    type: EntryType = EntryType.NORMAL
    payload: bytes = b""

    def size(self) -> int:
        """Approximate bytes on the wire, used for batch limits."""
        return len(self.payload) + ENTRY_OVERHEAD


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be on disk before any reply that depends on it leaves the node."""

    term: int = 0
    voted_for: str | None = None


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Identity of a snapshot: the last entry it includes, and the configuration in force there
    (Membership.encode(); empty for a snapshot of a cluster whose log never recorded one, whose
    members are the bootstrap ones)."""

    index: int
    term: int
    membership: bytes = b""


@dataclass(frozen=True, slots=True)
class CoreStatus:
    id: str
    role: Role
    term: int
    leader: str | None
    commit_index: int
    applied_index: int
    last_index: int
    snapshot_index: int  # the log's before_begin index
    peers: dict[str, int] = field(default_factory=dict)  # leader only: member -> match index
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    # Whether a leadership transfer is under way, and to whom.
    transferring_to: str | None = None
