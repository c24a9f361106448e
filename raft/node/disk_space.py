"""DiskSpacePolicy: what a node does when its disk runs short. A full disk refuses writes; reads
go on.

Two conditions refuse new writes (nothing of a refused write is stored):
- a store is full: a write of entries to the log, or an apply to the state machine, failed for
  space; the refusal lasts until a write to that store succeeds again;
- the data directory's disk is below StorageConfig.reserve_free_bytes (--reserve-free-bytes),
  checked before each write: the reserve is kept for what must still be written then (the
  entries already proposed, a NOSPACE alarm proposed `within_reserve`).

A leader that runs short gives way: its core is rebuilt from what is durable, as a crash would
leave it, so a member with space leads. A follower whose state machine is full keeps its
committed entries and has them handed out again every APPLY_RETRY_S until they apply."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raft.core.errors import NotLeaderError
from raft.core.types import Role
from raft.node.errors import DiskFullError
from raft.node.ports import DiskSpace

if TYPE_CHECKING:
    from raft.node.node import RaftNode

log = logging.getLogger(__name__)

# How often a state machine that ran out of space is handed its committed entries again.
APPLY_RETRY_S = 1.0


class DiskSpacePolicy:
    def __init__(self, node: RaftNode, disk: DiskSpace | None,
                 fsm_full_errors: tuple[type[Exception], ...]) -> None:
        """`disk`: where new writes are checked against the reserve (none: never).
        `fsm_full_errors`: what the state machine raises when it is out of space."""
        self._node = node
        self._disk = disk
        self.fsm_full_errors = fsm_full_errors
        self._short_of_space = False  # below the reserve at the last write (logged once per episode)
        self._full_stores: dict[str, str] = {}  # "log" / "state machine" -> why it refused a write

    @property
    def full(self) -> str | None:
        """Why writes are refused, while a store is full (None when none is)."""
        return next(iter(self._full_stores.values()), None)

    def check_write(self, payload_bytes: int, *, within_reserve: bool = False) -> None:
        """Refuse a new write (DiskFullError; nothing of it stored) while a store is full or, unless
        it is `within_reserve`, the disk is below its reserve."""
        if self.full is not None:
            raise DiskFullError(self.full)
        if within_reserve:
            return
        free = self._free_below_reserve(payload_bytes)
        node = self._node
        if free is None:
            if self._short_of_space:
                log.info("node %s: space is free again on the data directory's disk: it accepts writes", node.id)
                self._short_of_space = False
            return
        why = (f"node {node.id} refuses writes: {free / 2**20:.1f} MiB free on the data directory's disk, below "
               f"the {node.config.storage.reserve_free_bytes / 2**20:.0f} MiB it keeps in reserve "
               "(--reserve-free-bytes); writes resume once space is freed")
        if not self._short_of_space:
            log.error("%s", why)
            self._short_of_space = True
            if node.core.role is Role.LEADER:
                self._give_way()
        raise DiskFullError(why)

    def short_of_space(self) -> str | None:
        """Why this member refuses writes for space now (a full store, or its disk below the
        reserve), or None."""
        if self.full is not None:
            return self.full
        free = self._free_below_reserve()
        if free is None:
            return None
        return (f"node {self._node.id}: {free / 2**20:.1f} MiB free on the data directory's disk, below the "
                f"{self._node.config.storage.reserve_free_bytes / 2**20:.0f} MiB reserve (--reserve-free-bytes)")

    def _free_below_reserve(self, payload_bytes: int = 0) -> int | None:
        """The free bytes when they are short of the reserve plus `payload_bytes`, else None."""
        reserve = self._node.config.storage.reserve_free_bytes
        if self._disk is None or reserve == 0:
            return None
        free = self._disk.free_bytes()
        return free if free < reserve + payload_bytes else None

    # ---- what the Ready handler reports --------------------------------------------------------

    def on_log_full(self, e: Exception) -> None:
        """A write to the log failed for space. The Ready cannot be completed, so the core
        restarts from what is durable - exactly what a crash here would do, which Raft tolerates -
        and writes are refused until a write of entries succeeds again."""
        self._note_full("log", e)
        self._give_way()

    def on_state_full(self, e: Exception) -> None:
        """The state machine could not apply committed entries for space. A leader gives way (a
        member with space can serve writes and reads). Otherwise the entries stay committed and
        the core hands them out again every APPLY_RETRY_S until they apply; new writes are refused
        meanwhile, stale reads go on, a linearizable read here waits for them."""
        node = self._node
        if self._note_full("state machine", e) and node.core.role is Role.LEADER:
            self._give_way()
            return
        node.core.apply_stopped(node.fsm.applied_index, hold=True)
        asyncio.get_running_loop().call_later(APPLY_RETRY_S, self._retry_apply)

    def store_accepts_writes(self, store: str) -> None:
        """A write of entries to the log, or an apply, succeeded after the store was full."""
        if self._full_stores.pop(store, None) is not None:
            log.info("node %s: the %s accepts writes again", self._node.id, store)

    def _give_way(self) -> None:
        """Restart the core from what is durable, as a crash would (a leader becomes a follower;
        its peers' election timers started before its new one, so one of them usually stands first
        and leads with space). Reads fail, and so do writes not yet committed, as on any loss of
        leadership: their entries may be on followers and be committed by the next leader, so the
        outcome is unknown (a retry with the same session is applied at most once), not "refused".
        A committed write waits for its entry to be applied here (or fails so when a snapshot is
        installed over it)."""
        node = self._node
        not_leader = lambda: NotLeaderError(None, node.core.term)  # noqa: E731
        node.proposals.fail_uncommitted(node.core.commit_index, not_leader)
        node.reads.fail_all(not_leader)
        node.restart_core()

    def _retry_apply(self) -> None:
        self._node.core.resume_apply()
        self._node.poke()

    def _note_full(self, store: str, e: Exception) -> bool:
        """Refuse writes for a full store; True when this starts an episode."""
        first = self.full is None
        if store not in self._full_stores:  # logged once per episode, not once per retry
            log.error("node %s refuses writes: its %s is out of space: %s", self._node.id, store, e)
        self._full_stores[store] = f"node {self._node.id} is out of space: {e}"
        return first
