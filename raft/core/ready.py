"""The batch of work the core hands its driver, in the spirit of etcd raft's `Ready`.

The driver handles one Ready completely, in this order, before it asks for the next:
1. send `leader_messages` (they may go before the local write: Raft thesis §10.2.1);
2. install `snapshot` if set (state machine swapped, log reset to begin after it);
3. persist in one fsynced transaction: `hard_state` (if set), drop entries >= `truncate_from`
   (if set), append `entries`;
4. send `messages` (they depend on what step 3 made durable: votes, acknowledgements);
5. apply `committed_entries` in order, start streaming a snapshot to each of `snapshot_sends`,
   serve `reads`, fail `failed_proposals` and `failed_reads`;
6. call `core.advance(ready)`.

While a Ready is being handled (its apply or install runs on a worker thread), the driver may
send what `core.take_early_messages()` returns at once rather than in the next Ready: the
messages that depend on no write of this node, so that a long apply does not silence it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from raft.core.messages import Message
from raft.core.types import Entry, HardState, Role, SnapshotMeta


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state the driver reports and logs on change (elected, stepped down, caught up
    after rejoining)."""

    role: Role
    leader: str | None
    term: int
    rejoining: bool = False


@dataclass(frozen=True, slots=True)
class ReadState:
    """A read that may now be served: it was registered when the commit index was `index`, a
    quorum has since confirmed this node still leads, and the state machine has applied `index`."""

    ctx: object
    index: int


@dataclass(frozen=True, slots=True)
class DroppedProposals:
    """Proposals at indexes [first, last] of `term` that will never commit from this node: it lost
    leadership. They are retryable; `leader` is the new leader when known."""

    term: int
    first: int
    last: int
    leader: str | None


@dataclass(frozen=True, slots=True)
class FailedRead:
    ctx: object
    leader: str | None


@dataclass(frozen=True, slots=True)
class SnapshotSend:
    """Stream the newest snapshot to `peer`, then step the core an InstallSnapshotResponse."""

    peer: str
    term: int


@dataclass(slots=True)
class Ready:
    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    truncate_from: int | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: SnapshotMeta | None = None
    leader_messages: list[Message] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    committed_entries: list[Entry] = field(default_factory=list)
    reads: list[ReadState] = field(default_factory=list)
    failed_reads: list[FailedRead] = field(default_factory=list)
    failed_proposals: list[DroppedProposals] = field(default_factory=list)
    snapshot_sends: list[SnapshotSend] = field(default_factory=list)

    def must_persist(self) -> bool:
        return self.hard_state is not None or self.truncate_from is not None or bool(self.entries)
