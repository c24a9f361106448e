"""RaftCore: one node's protocol state machine. (Implementation in progress; the public API below
is the contract drivers and the simulator code against.)"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from raft.core.config import CoreConfig
from raft.core.log_store import LogStore
from raft.core.messages import Message
from raft.core.ready import Ready
from raft.core.types import Role


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


class RaftCore:
    """Inputs: tick(now), step(message), propose(payloads), read_index(ctx), applied_to(index).
    Outputs: ready() -> Ready, handled by the driver, then advance(ready).

    `members` includes this node. `log` is read, never written, by the core. `applied_index` is
    what the state machine already holds on (re)start: the core will not hand those entries out
    again. `rng` supplies the election timeout jitter, so a seeded generator makes runs repeatable."""

    def __init__(self, node_id: str, members: Sequence[str], log: LogStore, config: CoreConfig,
                 rng: random.Random, now: int, applied_index: int = 0) -> None:
        raise NotImplementedError

    def status(self) -> CoreStatus: ...
    def tick(self, now: int) -> None: ...
    def step(self, msg: Message) -> None: ...
    def propose(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        """Append commands to the leader's log. Returns (first index, term); the i-th payload gets
        index first + i. Raises NotLeaderError."""
        ...
    def read_index(self, ctx: object) -> None:
        """Register a linearizable read; it comes back in Ready.reads (or Ready.failed_reads).
        Raises NotLeaderError."""
        ...
    def lease_valid(self) -> bool:
        """True while this leader heard from a quorum within lease_ms (opt-in lease reads)."""
        ...
    def applied_to(self, index: int) -> None: ...
    def has_ready(self) -> bool: ...
    def ready(self) -> Ready: ...
    def advance(self, ready: Ready) -> None: ...

    @property
    def role(self) -> Role: ...
    @property
    def term(self) -> int: ...
    @property
    def leader(self) -> str | None: ...
    @property
    def commit_index(self) -> int: ...
