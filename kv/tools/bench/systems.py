"""What a workload needs of a system under test, so that raftkv and etcd run the same code:
a `Cluster` of local processes and a `Target`, one client's view of it."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# How the bench names read consistency levels; a Cluster lists those it supports.
LINEARIZABLE = "linearizable"
LEASE = "lease"
STALE = "stale"


class Target(Protocol):
    """One client of a cluster. Each bench worker thread owns one."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def get(self, key: bytes, consistency: str = LINEARIZABLE) -> bytes | None: ...

    def bulk_put(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """Write all pairs atomically in one request (raftkv Batch, etcd Txn)."""
        ...

    def close(self) -> None: ...


class Cluster(Protocol):
    """Three local members started as separate processes."""

    system: str              # "raftkv" or "etcd"
    members: list[str]       # member names, e.g. n1..n3 or e1..e3
    max_bulk_ops: int        # most puts one bulk_put may carry
    consistencies: tuple[str, ...]

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def leader(self) -> str | None:
        """The member every running member agrees leads, None while there is no such one."""
        ...

    def wait_healthy(self, timeout_s: float) -> str:
        """Wait until every running member agrees on a leader and has caught up; returns it."""
        ...

    def kill(self, member: str) -> None:
        """SIGKILL one member."""
        ...

    def restart(self, member: str) -> None:
        """Start a killed member again on its data."""
        ...

    def pid(self, member: str) -> int | None: ...

    def target(self, timeout_s: float) -> Target: ...
