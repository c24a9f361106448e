"""The Raft protocol as a pure, deterministic state machine: no I/O, no clock, no threads.

A driver feeds a `RaftCore` ticks (with the current time), messages from peers, proposals and read
requests, and consumes `Ready` batches: what to persist, send, apply and serve. See ready.py for
the order in which a driver must handle a Ready."""
from raft.core.config import CoreConfig
from raft.core.errors import NotLeaderError
from raft.core.log_store import LogStore, MemoryLogStore
from raft.core.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    Message,
    PushCode,
    PushRequest,
    PushResponse,
    PushType,
    TimeoutNowRequest,
    VoteRequest,
    VoteResponse,
)
from raft.core.membership import ChangeKind, Membership, MembershipChangeError
from raft.core.raft import RaftCore
from raft.core.ready import DroppedProposals, FailedRead, Ready, ReadState, SnapshotSend, SoftState
from raft.core.types import CoreStatus, Entry, EntryType, HardState, Role, SnapshotMeta

__all__ = [
    "ChangeKind", "CoreConfig", "CoreStatus", "Membership", "MembershipChangeError", "TimeoutNowRequest", "DroppedProposals", "Entry", "EntryType", "FailedRead", "HardState",
    "HeartbeatRequest", "HeartbeatResponse", "InstallSnapshotRequest", "InstallSnapshotResponse",
    "LogStore", "MemoryLogStore", "Message", "NotLeaderError", "PushCode", "PushRequest", "PushResponse",
    "PushType", "RaftCore", "ReadState", "Ready", "Role", "SnapshotMeta", "SnapshotSend", "SoftState",
    "VoteRequest", "VoteResponse",
]
