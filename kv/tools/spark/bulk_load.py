"""Load (key, value) rows into a cluster in batches of idempotent puts through the leader: the
path of the Spark writer and of `raftkv import`.

    with BulkLoader(endpoints) as loader:
        loader.load(rows)                          # rows: Iterable[(bytes, bytes)]
    publish_staged(endpoints, loader.stage)        # only with atomic staging (stage=new_stage())

Each batch is one Batch RPC (one Raft entry) sent with kv.Client: it finds the leader, follows
"not leader", retries with backoff and tags the batch with (client id, seq) so a retried RPC is
applied at most once. Puts are idempotent, so a Spark task retried from the start, or a
speculative duplicate, writes the same bytes again and nothing doubles. A failed job may leave
part of its rows written (Spark cannot roll back task writes) - unless the rows are staged under
a private prefix and published by ONE committed move_prefix command (all or nothing).
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType

from kv.client.client import Client
from kv.client.tls import TLS
from kv.tools.spark.export_client import STAGING_PREFIX
from raftkv_proto import kv_pb2
from raftkv_proto.request_limits import BATCH_MESSAGE_BYTES, REQUEST_OVERHEAD_BYTES
from statemachine.commands import MAX_KEY_BYTES, CommandLimits

# The server accepts at most CommandLimits.max_ops ops per write, and a request of at most its
# --max-request-bytes, which is never below BATCH_MESSAGE_BYTES: a batch's request stays within
# that (its header and each op's framing counted), so it fits on any node.
DEFAULT_BATCH_ROWS = CommandLimits().max_ops
MAX_BATCH_BYTES = BATCH_MESSAGE_BYTES - REQUEST_OVERHEAD_BYTES
OP_FRAMING_BYTES = 16  # an Op around a KeyValue: two field tags and lengths each
DEFAULT_IN_FLIGHT = 8


def new_stage() -> bytes:
    """A private staging prefix for one atomic job."""
    return STAGING_PREFIX + uuid.uuid4().hex[:16].encode() + b"/"


@dataclass
class Throttle:
    """A token bucket over rows and bytes per second (0: unlimited), shared by a loader's threads."""

    rows_per_s: float = 0.0
    bytes_per_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _start: float = field(default_factory=time.monotonic)
    _rows: int = 0
    _bytes: int = 0

    def wait(self, rows: int, nbytes: int) -> None:
        with self._lock:
            self._rows += rows
            self._bytes += nbytes
            due = max(self._rows / self.rows_per_s if self.rows_per_s else 0.0,
                      self._bytes / self.bytes_per_s if self.bytes_per_s else 0.0)
            delay = self._start + due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


@dataclass
class BulkLoader:
    endpoints: Sequence[str] | str
    batch_rows: int = DEFAULT_BATCH_ROWS
    in_flight: int = DEFAULT_IN_FLIGHT
    stage: bytes = b""  # non-empty: write every key under this prefix (atomic staging)
    throttle: Throttle = field(default_factory=Throttle)
    timeout: float = 30.0
    on_batch: Callable[[int], None] | None = None  # progress: called with each batch's row count
    tls: TLS | None = None  # as kv.Client's
    rows: int = 0
    user: str | None = None  # who writes, once the cluster has auth enabled (docs/security.md)
    password: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.batch_rows <= DEFAULT_BATCH_ROWS:
            raise ValueError(f"batch_rows must be in 1..{DEFAULT_BATCH_ROWS} (the server's ops per write)")
        self._client = Client(self.endpoints, timeout=self.timeout, tls=self.tls, user=self.user,
                              password=self.password)
        self._pool = ThreadPoolExecutor(max(1, self.in_flight), thread_name_prefix="raftkv-load")

    def __enter__(self) -> BulkLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def load(self, rows: Iterable[tuple[bytes, bytes]]) -> int:
        """Send every row; returns how many. Raises the first failed batch's error (after the
        client's retries) once the batches in flight have finished."""
        pending: list[Future[int]] = []
        for batch in self._batches(rows):
            self.throttle.wait(len(batch), sum(len(k) + len(v) for k, v in batch))
            pending.append(self._pool.submit(self._send, batch))
            while len(pending) >= self.in_flight:
                self.rows += pending.pop(0).result()
        for future in pending:
            self.rows += future.result()
        return self.rows

    def _batches(self, rows: Iterable[tuple[bytes, bytes]]) -> Iterator[list[tuple[bytes, bytes]]]:
        batch: list[tuple[bytes, bytes]] = []
        size = 0
        for key, value in rows:
            key = self._staged_key(key)
            row_bytes = len(key) + len(value) + OP_FRAMING_BYTES
            if batch and (len(batch) == self.batch_rows or size + row_bytes > MAX_BATCH_BYTES):
                yield batch
                batch, size = [], 0
            batch.append((key, value))
            size += row_bytes
        if batch:
            yield batch

    def _staged_key(self, key: bytes) -> bytes:
        if key.startswith(STAGING_PREFIX):
            raise ValueError(f"key {key[:40]!r} is under raftkv's reserved staging prefix {STAGING_PREFIX!r}")
        if self.stage and len(self.stage) + len(key) > MAX_KEY_BYTES:
            raise ValueError(f"key of {len(key)} bytes is too long for an atomic write: staged under "
                             f"{len(self.stage)} bytes of prefix it would pass the {MAX_KEY_BYTES}-byte key limit")
        return self.stage + key

    def _send(self, batch: list[tuple[bytes, bytes]]) -> int:
        self._client.batch(batch)
        if self.on_batch is not None:
            self.on_batch(len(batch))
        return len(batch)


def publish_staged(endpoints: Sequence[str] | str, stage: bytes, timeout: float = 60.0,
                   tls: TLS | None = None, user: str | None = None, password: str | None = None) -> None:
    """Make every row staged under `stage` visible at once: ONE committed move_prefix command.
    With auth enabled it writes anywhere in the key space: a user with the root role's job."""
    _apply(endpoints, kv_pb2.Op(move_prefix=kv_pb2.MovePrefix(source=stage, target=b"")), timeout, tls, user,
           password)


def discard_staged(endpoints: Sequence[str] | str, stage: bytes, timeout: float = 60.0,
                   tls: TLS | None = None, user: str | None = None, password: str | None = None) -> None:
    """Remove every row staged under `stage` (an aborted atomic job)."""
    _apply(endpoints, kv_pb2.Op(delete_prefix=stage), timeout, tls, user, password)


def _apply(endpoints: Sequence[str] | str, op: kv_pb2.Op, timeout: float, tls: TLS | None, user: str | None,
           password: str | None) -> None:
    if not stage_ok(op):
        raise ValueError("only staging prefixes may be published or discarded")
    with Client(endpoints, timeout=timeout, tls=tls, user=user, password=password) as client:
        client.apply_ops([op])  # retried with the same (client id, seq): applied at most once


def stage_ok(op: kv_pb2.Op) -> bool:
    prefix = op.delete_prefix if op.HasField("delete_prefix") else op.move_prefix.source
    return prefix.startswith(STAGING_PREFIX) and len(prefix) > len(STAGING_PREFIX)
