"""One simulated node's disk, as the real driver sees it through raft/node/ports.py: the log
(a MemoryLogStore), the state machine and the snapshot files, with the storage faults a real disk
has.

What survives a crash: everything the log's `save` returned from, the snapshot files, and the
state machine as it was (a process crash keeps the page cache) or, on a power loss, as it was
when last synced (it skips fsync: the log is durable). Faults:
- `crash_in_save`: the node crashes inside its next log write, after `torn` of its entries (and
  its hard state, when `torn` > 0) reached the disk: a torn write, never acknowledged;
- `crash_after_install`: the node crashes right after its next snapshot install swapped the
  state, before the log was reset to begin after it;
- a rotten snapshot: a byte of the newest snapshot file changes (SimSnapshots.rot_newest);
- `full`: the log and the state machine refuse writes for space (ENOSPC) until it is cleared;
  `state_full`: only the state machine does (its own store filled up);
- `batch_ends_every`: the state machine applies only part of some batches (the driver must hand
  it the rest again);
- a lost disk: SimNode.lose_disk gives the node a new, empty one, and it rejoins."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from raft.core import Entry, EntryType, HardState, MemoryLogStore, SnapshotMeta
from raft.log.errors import LogFullError
from raft.node.ports import SnapshotInfo

from tests.sim.checkers import SimViolation

if TYPE_CHECKING:
    from tests.sim.node import SimNode

State = dict[str, object]


def empty_state() -> State:
    return {"_n": 0, "_digest": ""}


# A payload the sim's state machine cannot apply, as a key LMDB cannot store is to the KV state
# machine (statemachine/apply_batch.py): applied as a refusal that changes nothing, the batch ending
# after it, so that the driver hands out the rest again.
POISON = b"poison"
# A command whose apply costs more than its size says (a range deletion of many keys): the state
# machine says so (in_proportion), and the apply thread takes SLOW_APPLY_MS for it.
SLOW = b"slow"
SLOW_APPLY_MS = 1000


def apply_cost_ms(*args: object) -> int:
    """The apply thread's extra time for a call's entries (its one list argument): SLOW ones."""
    entries = next((a for a in args if isinstance(a, list)), [])
    return sum(SLOW_APPLY_MS for e in entries if e.type == EntryType.NORMAL and e.payload.startswith(SLOW))


@dataclass(frozen=True)
class RefusedAtApply:
    """The result of a poison entry: what its proposer is answered with."""

    index: int
    payload: bytes


def apply_command(state: State, payload: bytes) -> None:
    """The sim's state machine: a few keys overwritten plus a running digest of every command,
    so two states are equal only if they applied the same commands in the same order."""
    state[f"k{len(payload) % 4}"] = payload.decode("latin-1")
    state["_n"] = int(state["_n"]) + 1  # type: ignore[call-overload]
    state["_digest"] = hashlib.blake2b(str(state["_digest"]).encode() + payload, digest_size=8).hexdigest()


class SimCrash(BaseException):
    """Raised out of a log write the node crashes in (a BaseException: the driver must not catch
    it as it catches errors)."""


class StateFullError(Exception):
    """The simulated state machine is out of space."""


def _watched(node: SimNode, check: Callable[[], None]) -> None:
    """Run a checker call from inside the driver: a violation is recorded for the cluster to
    raise (the driver would otherwise catch it as a store error)."""
    try:
        check()
    except SimViolation as violation:
        node.violation(violation)


class SimLogStore(MemoryLogStore):
    def __init__(self, node: SimNode) -> None:
        super().__init__()
        self._node = node

    def adopt(self, log: MemoryLogStore) -> None:
        """Take the contents of a prepared log (scenarios start from hand-made logs)."""
        self._hard_state = log.hard_state()
        self._before_index, self._before_term = log.before_begin()
        begin, last = log.before_begin()[0] + 1, log.last_index()
        self._entries = log.entries(begin, last + 1) if last >= begin else []

    def save(self, hard_state: HardState | None, truncate_from: int | None, entries: Sequence[Entry]) -> None:
        node, disk = self._node, self._node.disk
        if disk.full:
            raise LogFullError("sim:" + node.id, "no space left on device")
        _watched(node, lambda: node.checker.before_persist(node, truncate_from, entries))
        if disk.crash_in_save is not None:
            torn = min(disk.crash_in_save, len(entries))
            disk.crash_in_save = None
            if torn:
                super().save(hard_state, truncate_from, entries[:torn])
                _watched(node, lambda: node.checker.on_persist(node, hard_state, entries[:torn]))
            node.cluster.crash(node.id)
            raise SimCrash(node.id)
        super().save(hard_state, truncate_from, entries)
        _watched(node, lambda: node.checker.on_persist(node, hard_state, entries))


class SimStateMachine:
    """The StateMachine port: a dict, its applied index and term, and the last configuration
    applied; `durable` is what a power loss leaves (the state as last synced)."""

    def __init__(self, node: SimNode) -> None:
        self._node = node
        self.state = empty_state()
        self.applied_index = 0
        self.applied_term = 0
        self.membership = b""
        self.durable: tuple[State, int, int, bytes] = (empty_state(), 0, 0, b"")

    @staticmethod
    def in_proportion(entries: Sequence[Entry]) -> bool:
        return not apply_cost_ms(list(entries))

    def apply(self, entries: Sequence[Entry]) -> list[object]:
        node = self._node
        if node.disk.full or node.disk.state_full:
            raise StateFullError("no space left on device")
        results: list[object] = []
        for e in entries:
            if results and node.disk.batch_ends_every and e.index % node.disk.batch_ends_every == 0:
                break  # ends the batch early, as the KV state machine does at a state check marker
            if e.index != self.applied_index + 1:
                raise RuntimeError(f"{node.id}: entry {e.index} does not follow the applied index {self.applied_index}")
            poison = e.type == EntryType.NORMAL and e.payload.startswith(POISON)
            if e.type == EntryType.NORMAL and not poison:
                apply_command(self.state, e.payload)
            elif e.type == EntryType.CONFIG:
                self.membership = e.payload
            _watched(node, lambda: node.checker.on_apply(node, e, self.state))
            self.applied_index, self.applied_term = e.index, e.term
            if poison:
                results.append(RefusedAtApply(e.index, e.payload))
                break
            results.append((e.index, e.payload))
        return results

    def sync(self) -> None:
        self.durable = (dict(self.state), self.applied_index, self.applied_term, self.membership)

    def replace(self, state: State, index: int, term: int, membership: bytes) -> None:
        self.state, self.applied_index, self.applied_term, self.membership = dict(state), index, term, membership
        self.sync()

    def lose_unsynced(self) -> None:
        state, index, term, membership = self.durable
        self.state, self.applied_index, self.applied_term, self.membership = dict(state), index, term, membership


@dataclass
class SnapshotFile:
    meta: SnapshotMeta
    state: State
    sha256: str = ""  # of the payload as written (what the manifest records)
    rotten: bool = False  # a byte of it changed on the disk since

    def __post_init__(self) -> None:
        self.sha256 = self.sha256 or hashlib.sha256(self._encoded()).hexdigest()

    def _encoded(self) -> bytes:
        return json.dumps({"index": self.meta.index, "term": self.meta.term,
                           "membership": self.meta.membership.decode(), "state": self.state}, sort_keys=True).encode()

    def payload(self) -> bytes:
        data = self._encoded()
        return data[:-1] + bytes([data[-1] ^ 1]) if self.rotten else data

    @staticmethod
    def parse(payload: bytes) -> SnapshotFile:
        d = json.loads(payload)
        return SnapshotFile(SnapshotMeta(d["index"], d["term"], d["membership"].encode()), d["state"])


@dataclass
class _Receiver:
    """A snapshot stream being received into a file of the disk."""

    snapshots: SimSnapshots
    data: bytearray = field(default_factory=bytearray)

    def feed(self, offset: int, data: bytes) -> None:
        if offset != len(self.data):
            raise ValueError(f"chunk at offset {offset}, expected {len(self.data)}")
        self.data += data

    def finish(self, expected_size: int, expected_sha256: str) -> Path:
        if len(self.data) != expected_size or hashlib.sha256(self.data).hexdigest() != expected_sha256:
            raise ValueError("the snapshot does not verify")
        return self.snapshots.keep(SnapshotFile.parse(bytes(self.data)), received=True)

    def abort(self) -> None:
        self.data.clear()


class SimSnapshots:
    """The SnapshotHost port: snapshot files by path, the newest `kept` of them kept."""

    def __init__(self, node: SimNode, members: tuple[str, ...], kept: int = 2) -> None:
        self._node = node
        self._members = members
        self._kept = kept
        self.files: dict[Path, SnapshotFile] = {}
        self._adopted: list[Path] = []  # taken or installed, oldest first (received ones wait)
        self._newest: Path | None = None
        self._names = 0

    def keep(self, file: SnapshotFile, received: bool = False) -> Path:
        self._names += 1
        path = Path(f"/sim/{self._node.id}/{'received' if received else 'snapshot'}-{self._names}")
        self.files[path] = file
        return path

    def _info(self, path: Path) -> SnapshotInfo:
        file = self.files[path]
        return SnapshotInfo(file.meta.index, file.meta.term, path, len(file.payload()), file.sha256,
                            file.meta.membership)

    def verify(self, info: SnapshotInfo) -> bool:
        file = self.files.get(info.path)
        if file is not None and hashlib.sha256(file.payload()).hexdigest() == file.sha256:
            return True
        if file is not None:  # set aside: out of the store
            del self.files[info.path]
            self._adopted.remove(info.path)
            self._newest = self._adopted[-1] if self._adopted else None
        return False

    def check(self) -> None:
        while (newest := self.newest()) is not None and not self.verify(newest):
            pass

    def rot_newest(self) -> bool:
        """(A fault) A byte of the newest snapshot file changes on the disk."""
        if self._newest is None:
            return False
        self.files[self._newest].rotten = True
        return True

    @property
    def newest_file(self) -> SnapshotFile | None:
        return self.files[self._newest] if self._newest is not None else None

    def newest(self) -> SnapshotInfo | None:
        return self._info(self._newest) if self._newest is not None else None

    def take(self) -> SnapshotInfo:
        node, fsm = self._node, self._node.disk.fsm
        meta = SnapshotMeta(fsm.applied_index, fsm.applied_term, fsm.membership)
        self._newest = self.keep(SnapshotFile(meta, dict(fsm.state)))
        self._adopted.append(self._newest)
        _watched(node, lambda: node.checker.on_snapshot(node, meta, fsm.state))
        fsm.sync()  # as NodeSnapshots.take: the state is on disk before the log is compacted
        return self._info(self._newest)

    def receiver(self, source: str) -> _Receiver:
        return _Receiver(self)

    def install(self, verified_file: Path) -> SnapshotInfo:
        node, file = self._node, self.files[verified_file]
        _watched(node, lambda: node.checker.on_install(node, file.meta, file.state))
        node.disk.fsm.replace(file.state, file.meta.index, file.meta.term, file.meta.membership)
        self._newest = verified_file
        self._adopted.append(verified_file)
        if node.disk.crash_after_install:
            node.disk.crash_after_install = False
            node.cluster.crash(node.id)  # the driver's wait for this call ends with the crash
        return self._info(verified_file)

    def restore(self, info: SnapshotInfo) -> None:
        file = self.files[info.path]
        self._node.disk.fsm.replace(file.state, file.meta.index, file.meta.term, file.meta.membership)

    def chunks(self, info: SnapshotInfo, chunk_size: int) -> Iterator[tuple[int, bytes, bool]]:
        payload = self.files[info.path].payload()
        for offset in range(0, len(payload), chunk_size):
            yield offset, payload[offset:offset + chunk_size], offset + chunk_size >= len(payload)

    def prune(self) -> None:
        while len(self._adopted) > self._kept:
            del self.files[self._adopted.pop(0)]


class SimDisk:
    """The node's disk; also its RejoinRecord and DiskSpace (raft/node/ports.py)."""

    def __init__(self, node: SimNode, members: tuple[str, ...], batch_ends_every: int = 0) -> None:
        self.log = SimLogStore(node)
        self.fsm = SimStateMachine(node)
        self.snapshots = SimSnapshots(node, members)
        self.full = False
        self.full_unseen = False  # full, yet free_bytes() still reports room
        self.state_full = False
        # The state machine ends an apply batch before each index divisible by this (0: never).
        self.batch_ends_every = batch_ends_every
        self.crash_in_save: int | None = None  # armed: entries of the next save that reach the disk
        self.crash_after_install = False
        # The node rejoins after losing its data (the RejoinRecord port; kv/server's REJOINING
        # file): its rejoin floor, set when its peers said the cluster has a log, cleared once it
        # has caught up.
        self.rejoin_floor: tuple[int, int] | None = None
        # (The simulator's knowledge) this disk replaced a lost one and the node has not caught up
        # yet: it holds less than it acknowledged, and votes for no one.
        self.replaced = False

    def free_bytes(self) -> int:
        """The DiskSpace port."""
        return 0 if self.full and not self.full_unseen else 1 << 40

    def load(self) -> tuple[int, int] | None:
        return self.rejoin_floor

    def save(self, floor: tuple[int, int] | None) -> None:
        self.rejoin_floor = floor
        if floor is None:
            self.replaced = False  # caught up (or founded): it holds what a member must
