"""One simulated node: the driver of one RaftCore, following raft/core/ready.py step by step.

What survives a crash (the "disk"): the MemoryLogStore and the last persisted snapshot.
What a crash loses: the core, the state machine, the applied index, anything mid-Ready."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from raft.core import (
    CoreConfig,
    DroppedProposals,
    Entry,
    EntryType,
    FailedRead,
    InstallSnapshotRequest,
    MemoryLogStore,
    Message,
    RaftCore,
    Ready,
    Role,
    SnapshotMeta,
)

from tests.sim.checkers import SimViolation

if TYPE_CHECKING:
    from tests.sim.checkers import SafetyChecker

State = dict[str, object]


def empty_state() -> State:
    return {"_n": 0, "_digest": ""}


def apply_command(state: State, payload: bytes) -> None:
    """The sim's state machine: a few keys overwritten plus a running digest of every command,
    so two states are equal only if they applied the same commands in the same order."""
    state[f"k{len(payload) % 4}"] = payload
    state["_n"] = int(state["_n"]) + 1  # type: ignore[call-overload]
    state["_digest"] = hashlib.blake2b(str(state["_digest"]).encode() + payload, digest_size=8).hexdigest()


MAX_READIES_PER_EVENT = 1000


class DriverHooks(Protocol):
    """Where a node's outputs go: the cluster implements these."""

    def send(self, msg: Message) -> None: ...
    def read_served(self, r: "ServedRead") -> None: ...
    def read_failed(self, node: "SimNode", fr: FailedRead) -> None: ...
    def proposals_dropped(self, node: "SimNode", dp: DroppedProposals) -> None: ...


class CrashNow(Exception):
    """Raised inside Ready handling to crash a node at an exact point (e.g. after the leader's
    messages left but before its own write)."""


@dataclass
class PersistedSnapshot:
    meta: SnapshotMeta
    state: State


@dataclass
class SnapshotPolicy:
    every: int | None = None  # take a snapshot every `every` applied entries; None: never
    keep: int = 3  # entries kept in the log below the snapshot index


@dataclass
class ServedRead:
    node: str
    ctx: object
    index: int
    applied: int
    at: int


@dataclass
class SimNode:
    id: str
    members: tuple[str, ...]
    config: CoreConfig
    log: MemoryLogStore
    seed: int
    policy: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    snapshot: PersistedSnapshot | None = None
    # volatile
    core: RaftCore | None = None
    state: State = field(default_factory=empty_state)
    applied: int = 0
    applied_term: int = 0  # term of the entry at `applied`, for the snapshot meta
    incarnation: int = 0
    # Local clock = cluster time - clock_offset; a paused node is not ticked and its clock stops.
    clock_offset: int = 0
    paused_at: int | None = None
    # Armed by a fault: crash inside the next Ready, after sending leader_messages.
    crash_mid_ready: bool = False

    @property
    def up(self) -> bool:
        return self.core is not None

    def local_time(self, now: int) -> int:
        return (self.paused_at if self.paused_at is not None else now) - self.clock_offset

    # --- lifecycle ---

    def start(self, now: int) -> None:
        self.incarnation += 1
        snap = self.snapshot
        self.state = dict(snap.state) if snap else empty_state()
        self.applied = snap.meta.index if snap else 0
        self.applied_term = snap.meta.term if snap else 0
        rng = random.Random(f"{self.seed}/{self.id}/{self.incarnation}")
        self.core = RaftCore(self.id, self.members, self.log, self.config, rng, self.local_time(now),
                             applied_index=self.applied)

    def crash(self) -> None:
        self.core = None
        self.state = empty_state()
        self.applied = 0
        self.crash_mid_ready = False

    def pause(self, now: int) -> None:
        if self.paused_at is None:
            self.paused_at = now

    def resume(self, now: int) -> None:
        if self.paused_at is not None:
            self.clock_offset += now - self.paused_at
            self.paused_at = None

    # --- the Ready loop ---

    def drain(self, now: int, hooks: "DriverHooks", checker: "SafetyChecker") -> None:
        """Handle Readies until the core has none, exactly in ready.py's order."""
        handled = 0
        while self.core is not None and self.core.has_ready():
            handled += 1
            if handled > MAX_READIES_PER_EVENT:
                # A core that always has another Ready would hang the simulation: fail the schedule.
                raise SimViolation("runaway", f"{self.id}: more than {MAX_READIES_PER_EVENT} Readies for one event")
            self._handle(self.core.ready(), now, hooks, checker)

    def _handle(self, rd: Ready, now: int, hooks: "DriverHooks", checker: "SafetyChecker") -> None:
        core = self.core
        assert core is not None
        # 1. the leader's messages may leave before its own write
        for m in rd.leader_messages:
            hooks.send(m)
        if self.crash_mid_ready and rd.must_persist():
            raise CrashNow(self.id)
        # 2. snapshot install
        if rd.snapshot is not None:
            self._install(rd.snapshot, rd.snapshot_data, checker)
        # 3. one durable write
        if rd.must_persist():
            checker.before_persist(self, rd)
            self.log.save(rd.hard_state, rd.truncate_from, rd.entries)
            checker.on_persist(self, rd)
        # 4. messages that depend on that write
        for m in rd.messages:
            hooks.send(m)
        # 5. apply, stream snapshots, serve reads, fail what failed
        for e in rd.committed_entries:
            self._apply(e, checker)
        for s in rd.snapshot_sends:
            if self.snapshot is not None:
                hooks.send(InstallSnapshotRequest(src=self.id, dst=s.peer, term=s.term, meta=self.snapshot.meta,
                                                  data=dict(self.snapshot.state)))
        for r in rd.reads:
            hooks.read_served(ServedRead(self.id, r.ctx, r.index, self.applied, now))
        for fr in rd.failed_reads:
            hooks.read_failed(self, fr)
        for dp in rd.failed_proposals:
            hooks.proposals_dropped(self, dp)
        # 6.
        core.advance(rd)
        if rd.committed_entries or rd.snapshot is not None:
            core.applied_to(self.applied)
        self._maybe_snapshot(checker)

    def _apply(self, e: Entry, checker: "SafetyChecker") -> None:
        if e.type == EntryType.NORMAL:
            apply_command(self.state, e.payload)
        checker.on_apply(self, e, self.state)
        self.applied = e.index
        self.applied_term = e.term

    def _install(self, meta: SnapshotMeta, data: object, checker: "SafetyChecker") -> None:
        assert isinstance(data, dict), f"{self.id}: snapshot install without data"
        checker.on_install(self, meta, data)
        self.state = dict(data)
        self.log.reset_to_snapshot(meta.index, meta.term)
        self.snapshot = PersistedSnapshot(meta, dict(data))
        self.applied = meta.index
        self.applied_term = meta.term

    def _maybe_snapshot(self, checker: "SafetyChecker") -> None:
        every = self.policy.every
        base = self.snapshot.meta.index if self.snapshot else 0
        if every is None or self.applied - base < every:
            return
        meta = SnapshotMeta(self.applied, self.applied_term, self.members)
        self.snapshot = PersistedSnapshot(meta, dict(self.state))
        checker.on_snapshot(self, meta, self.state)
        # Compact behind the snapshot, keeping a few entries, never past what is on disk.
        upto = min(self.applied - self.policy.keep, self.log.last_index())
        if upto > self.log.before_begin()[0] and self.log.term(upto) is not None:
            self.log.compact(upto)

    def role(self) -> Role | None:
        return self.core.role if self.core is not None else None
