"""ReplaceableStateMachine: the node's KVStateMachine, whose whole contents a follower replaces
by an installed snapshot while the node keeps running.

Reads (client service, exports) and applies go through a shared lock; the replacement takes it
exclusively, closes the LMDB environment, swaps the directory atomically (snapshot.install) and
reopens it. So no reader ever sees a closed environment or half of a swap."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raft.core import Entry
from snapshot.install import install_into_state
from snapshot.manifest import SnapshotManifest
from statemachine.alarms import AlarmHolder
from statemachine.auth_state import AuthHolder
from statemachine.leases import LeaseHolder
from statemachine.client_sessions import SessionStats
from statemachine.kv_state import KVStateMachine
from statemachine.range_read import Allow, allow_any


class SharedExclusiveLock:
    """Many holders in shared mode, or one in exclusive mode (a writer waits for readers to leave
    and new readers wait for a waiting writer, so a swap is never starved)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._shared = _SharedHold(self)

    def shared(self) -> _SharedHold:
        """`with lock.shared():` (one object for every holder: it keeps no state of its own, and
        every read and apply takes it, where a generator per use cost more than the lock)."""
        return self._shared

    def _enter_shared(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def _leave_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class _SharedHold:
    __slots__ = ("_lock",)

    def __init__(self, lock: SharedExclusiveLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._enter_shared()

    def __exit__(self, *exc_info: object) -> None:
        self._lock._leave_shared()


class ReplaceableStateMachine:
    def __init__(self, state_dir: Path, open_state: Callable[[Path], KVStateMachine]) -> None:
        self.state_dir = Path(state_dir)
        self._open = open_state
        self._lock = SharedExclusiveLock()
        self._machine = open_state(self.state_dir)

    def replace_with(self, snapshot_file: Path) -> SnapshotManifest:
        """Make the state exactly the snapshot's (verified while it is extracted)."""
        with self._lock.exclusive():
            self._machine.close()
            try:
                return install_into_state(snapshot_file, self.state_dir)
            finally:
                self._machine = self._open(self.state_dir)

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock.shared():
            return getattr(self._machine, name)(*args)

    @property
    def auth(self) -> AuthHolder:
        """The auth state's holder: the same object across replacements (each reopened machine
        publishes its auth tables into it)."""
        return self._machine.auth

    @property
    def leases(self) -> LeaseHolder:
        """The leases' holder, the same object across replacements (as `auth`)."""
        return self._machine.leases

    def lease_keys(self, lease: int) -> list[bytes]:
        return self._call("lease_keys", lease)

    @property
    def alarms(self) -> AlarmHolder:
        """The raised alarms' holder, the same object across replacements (as `auth`)."""
        return self._machine.alarms

    # The StateMachine the driver uses, and the reads the services use.
    @property
    def applied_index(self) -> int:
        with self._lock.shared():
            return self._machine.applied_index

    @property
    def applied_term(self) -> int:
        with self._lock.shared():
            return self._machine.applied_term

    @property
    def membership(self) -> bytes:
        with self._lock.shared():
            return self._machine.membership

    def apply(self, entries: Sequence[Entry]) -> list[Any]:
        return self._call("apply", entries)

    def in_proportion(self, entries: Sequence[Entry]) -> bool:
        return KVStateMachine.in_proportion(entries)  # reads the entries alone: no lock

    def get(self, key: bytes) -> bytes | None:
        return self._call("get", key)

    def changes(self, first: int, last: int, start: bytes = b"", end: bytes | None = None,
                with_prev: bool = False) -> list[Any]:
        return self._call("changes", first, last, start, end, with_prev)

    @property
    def compacted_revision(self) -> int:
        with self._lock.shared():
            return self._machine.compacted_revision

    def etcd_range(self, request: Any, allow: Allow = allow_any) -> Any:
        return self._call("etcd_range", request, allow)

    def etcd_read_txn(self, request: Any, allow: Allow = allow_any) -> Any:
        return self._call("etcd_read_txn", request, allow)

    def hash_kv(self, revision: int = 0) -> tuple[int, int, int]:
        return self._call("hash_kv", revision)

    def state_hash(self) -> str:
        return self._call("state_hash")

    @property
    def revision(self) -> int:
        with self._lock.shared():
            return self._machine.revision

    def scan(self, start: bytes, end: bytes | None, limit: int, max_bytes: int | None = None,
             keys_only: bool = False) -> tuple[list[tuple[bytes, bytes]], bool]:
        return self._call("scan", start, end, limit, max_bytes, keys_only)

    def scan_prefix(self, prefix: bytes, limit: int, max_bytes: int | None = None,
                    keys_only: bool = False) -> tuple[list[tuple[bytes, bytes]], bool]:
        return self._call("scan_prefix", prefix, limit, max_bytes, keys_only)

    def size_bytes(self) -> int:
        return self._call("size_bytes")

    def in_use_bytes(self) -> int:
        return self._call("in_use_bytes")

    def count(self) -> int:
        return self._call("count")

    def session_stats(self) -> SessionStats:
        return self._call("session_stats")

    def take_state_checks(self) -> list[Any]:
        return self._call("take_state_checks")

    def sync(self) -> None:
        self._call("sync")

    def copy_to(self, directory: str) -> tuple[int, int, bytes]:
        return self._call("copy_to", directory)

    def read_view(self) -> Any:
        """A pinned read transaction for exports. It does not hold off a snapshot install (which
        only a follower does; exports run on the leader): after a swap its reads fail cleanly."""
        return self._call("read_view")

    def close(self) -> None:
        with self._lock.exclusive():
            self._machine.close()
