"""What a workload needs of a system under test, so that raftkv and etcd run the same code:
a `Cluster` of local processes and a `Target`, one client's view of it. raftkv is driven through
one of two APIs (`raftkv bench --api`): its native client (kv.Client), or etcd's API through the
very client the bench drives etcd with (etcd.EtcdTarget)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kv.tools.bench.processes import Registry

# How the bench names read consistency levels; a Cluster lists those it supports.
LINEARIZABLE = "linearizable"
LEASE = "lease"
STALE = "stale"

# The APIs `raftkv bench --api` can drive raftkv through.
NATIVE_API = "native"
ETCD_API = "etcd"
APIS = (NATIVE_API, ETCD_API)


class Target(Protocol):
    """One client of a cluster. Each bench worker thread owns one."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def get(self, key: bytes, consistency: str = LINEARIZABLE) -> bytes | None: ...

    def bulk_put(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """Write all pairs atomically in one request (raftkv Batch, etcd Txn)."""
        ...

    def revision(self) -> int:
        """The store's revision now (etcd's header revision)."""
        ...

    def get_at(self, key: bytes, revision: int) -> bytes | None:
        """A linearizable read of `key` as it was at `revision` (etcd's Range with a revision)."""
        ...

    def cas(self, key: bytes, mod_revision: int, value: bytes) -> tuple[bool, int]:
        """One Txn: if `key`'s mod revision is `mod_revision` (0: absent), put `value`, else read
        the key. Whether the put ran, and the key's mod revision after the Txn."""
        ...

    def list_prefix(self, prefix: bytes, keys_only: bool = False, page: int = 0) -> int:
        """Every key under `prefix`, as a Kubernetes list reads them: one linearizable range, or
        with `page`, ranges of at most `page` keys each from the key after the last one (etcd's
        pages at the first page's revision); how many keys came."""
        ...

    def close(self) -> None: ...


class Cluster(Protocol):
    """Three local members started as separate processes."""

    system: str              # "raftkv" or "etcd"
    members: list[str]       # member names, e.g. n1..n3 or e1..e3
    max_bulk_ops: int        # most puts one bulk_put may carry
    consistencies: tuple[str, ...]
    registry: Registry       # every process the bench started (a workload's own ones too)
    client_tls: Any          # kv.client.tls.TLS the members' client ports want, None: plaintext

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

    def client_address(self, member: str) -> str:
        """host:port of `member`'s client port, where it serves etcd's API (W14 and W15 open their
        own gRPC streams there)."""
        ...
