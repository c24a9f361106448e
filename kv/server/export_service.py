"""Point-in-time live export on a node (proto/export.proto): BeginExport confirms leadership and an
index with one ReadIndex round, then pins ONE LMDB read transaction of the state machine
(statemachine.read_view.ReadView); every ReadExport of that export, from any number of readers,
sees exactly that state while writes go on. EndExport releases it.

A pinned read transaction stops LMDB from reusing the pages it sees, so the state file grows while
it is held under writes. Hence the limits: a view is released `ttl` after its last use (readers
refresh it with every batch), at the latest `max_lifetime_s` after it was taken, and at most
`max_exports` are open at once.

    exports = ExportHandler(node, fsm)     # kv/server/server.py serves ExportServicer(exports) beside the KV servicer
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from kv import errors
from kv.server.auth_gate import AuthGate
from kv.server.kv_handler import SCAN_PAGE_BYTES
from kv.server.node_calls import node_call
from kv.server.kv_service import serve_call
from raftkv_proto import export_pb2, export_pb2_grpc, kv_pb2
from raft.node.node import RaftNode
from raftkv_proto.key_ranges import prefix_end
from statemachine.commands import MAX_KEY_BYTES
from statemachine.kv_state import KVStateMachine
from statemachine.read_view import ReadView

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TTL_MS = 30_000
MAX_TTL_MS = 300_000
DEFAULT_MAX_LIFETIME_S = 600.0
DEFAULT_MAX_EXPORTS = 16
DEFAULT_BATCH_SIZE = 2000
MAX_BATCH_SIZE = 10_000
# A batch also stops at this many bytes of keys and values (its first pair always goes), so that
# batches of large values neither pass the node's send limit nor pile up on a slow reader.
EXPORT_BATCH_BYTES = SCAN_PAGE_BYTES
MAX_PARTITIONS = 4096


@dataclass(slots=True)
class PinnedExport:
    """One export: its pinned view, the range it covers, and when it must be released."""

    export_id: str
    view: ReadView
    start: bytes
    end: bytes  # b"": to the last key
    ttl_s: float
    deadline: float  # monotonic; the hard limit
    last_used: float = field(default_factory=time.monotonic)
    # py-lmdb transactions may move between threads but not be used by two at once.
    lock: threading.Lock = field(default_factory=threading.Lock)
    timer: asyncio.TimerHandle | None = None

    def scan(self, start: bytes, end: bytes, limit: int) -> tuple[list[tuple[bytes, bytes]], bool]:
        with self.lock:
            if self.view.closed:
                raise _expired(self.export_id)
            return self.view.scan(start, end or None, limit, EXPORT_BATCH_BYTES)

    def release(self) -> bool:
        with self.lock:
            was_open = not self.view.closed
            self.view.close()
        return was_open


class ExportHandler:
    """The work behind the Export service; raises kv.errors."""

    def __init__(self, node: RaftNode, fsm: KVStateMachine, *, max_exports: int = DEFAULT_MAX_EXPORTS,
                 max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S) -> None:
        self._node = node
        self._fsm = fsm
        self._max_exports = max_exports
        self._max_lifetime_s = max_lifetime_s
        self._exports: dict[str, PinnedExport] = {}

    @property
    def open_exports(self) -> int:
        return len(self._exports)

    async def begin(self, request: export_pb2.BeginExportRequest, timeout: float | None) -> export_pb2.BeginExportResponse:
        start, end = _resolve_range(request)
        partitions = min(max(request.partitions, 1), MAX_PARTITIONS)
        ttl_ms = min(request.ttl_ms or DEFAULT_TTL_MS, MAX_TTL_MS)
        if len(self._exports) >= self._max_exports:
            raise errors.QueueFullError(
                f"{len(self._exports)} exports are open on node {self._node.id} (the maximum); "
                "end one (EndExport) or wait for one to expire")
        await self._node_call(lambda: self._node.read_barrier("linearizable"), timeout)
        view = self._fsm.read_view()  # at an applied index >= the confirmed read index
        export = PinnedExport(uuid.uuid4().hex, view, start, end, ttl_ms / 1000,
                              time.monotonic() + self._max_lifetime_s)
        self._exports[export.export_id] = export
        self._schedule_expiry(export)
        try:
            count, splits = await asyncio.to_thread(_split_points, export, partitions)
        except BaseException:
            self._drop(export.export_id)
            raise
        log.info("export %s pinned at index %d term %d: %d keys in [%r, %r), %d ranges",
                 export.export_id, view.index, view.term, count, start, end, len(splits) + 1)
        return export_pb2.BeginExportResponse(
            export_id=export.export_id, index=view.index, term=view.term, revision=view.revision,
            cluster_id=self._node.cluster_id,
            split_points=splits, start=start, end=end, key_count=count, ttl_ms=ttl_ms)

    async def read(self, request: export_pb2.ReadExportRequest) -> AsyncIterator[export_pb2.ExportBatch]:
        export = self._get(request.export_id)
        start = max(request.start, export.start)
        end = _min_end(request.end, export.end)
        limit = min(request.batch_size or DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE)
        while True:
            self._touch(export)
            items, more = await asyncio.to_thread(export.scan, start, end, limit)
            yield export_pb2.ExportBatch(items=[kv_pb2.KeyValue(key=k, value=v) for k, v in items])
            if not more or not items:
                return
            start = items[-1][0] + b"\x00"  # the smallest key after the last one sent

    async def end(self, request: export_pb2.EndExportRequest) -> export_pb2.EndExportResponse:
        export = self._exports.get(request.export_id)
        if export is None:
            return export_pb2.EndExportResponse(released=False)
        return export_pb2.EndExportResponse(released=await asyncio.to_thread(self._drop, export.export_id))

    def close(self) -> None:
        """Release every view (before the state machine closes)."""
        for export_id in list(self._exports):
            self._drop(export_id)

    # ---- lifetime ------------------------------------------------------------------------------

    def _get(self, export_id: str) -> PinnedExport:
        export = self._exports.get(export_id)
        if export is None:
            raise _expired(export_id)
        return export

    def _touch(self, export: PinnedExport) -> None:
        export.last_used = time.monotonic()
        self._schedule_expiry(export)

    def _schedule_expiry(self, export: PinnedExport) -> None:
        if export.timer is not None:
            export.timer.cancel()
        delay = max(0.0, min(export.last_used + export.ttl_s, export.deadline) - time.monotonic())
        export.timer = asyncio.get_running_loop().call_later(delay, self._expire, export.export_id)

    def _expire(self, export_id: str) -> None:
        export = self._exports.get(export_id)
        if export is None:
            return
        log.info("export %s (index %d) released: unused for %.0fs or past its %.0fs limit",
                 export_id, export.view.index, export.ttl_s, self._max_lifetime_s)
        # The lock may be held by a batch being read: release off the event loop.
        asyncio.get_running_loop().run_in_executor(None, self._drop, export_id)

    def _drop(self, export_id: str) -> bool:
        export = self._exports.pop(export_id, None)
        if export is None:
            return False
        if export.timer is not None:
            export.timer.cancel()
        return export.release()

    async def _node_call(self, start: Callable[[], Awaitable[T]], timeout: float | None) -> T:
        return await node_call(self._node, start, timeout, "no read index confirmed within {:.3f}s")


def _expired(export_id: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(
        f"export {export_id!r} is unknown here or was released (ended, idle past its ttl, or past its "
        "time limit, or the node restarted); begin a new export")


def _resolve_range(request: export_pb2.BeginExportRequest) -> tuple[bytes, bytes]:
    if request.prefix and (request.start or request.end):
        raise errors.InvalidArgumentError("give either prefix or start/end, not both")
    if request.prefix:
        if len(request.prefix) > MAX_KEY_BYTES:
            raise errors.InvalidArgumentError(f"prefix is {len(request.prefix)} bytes; keys are at most {MAX_KEY_BYTES}")
        return request.prefix, prefix_end(request.prefix)
    if request.end and request.end <= request.start:
        raise errors.InvalidArgumentError(f"empty range: end {request.end!r} is not after start {request.start!r}")
    return request.start, request.end


def _min_end(a: bytes, b: bytes) -> bytes:
    """The tighter of two range ends, where b"" means unbounded."""
    if not a or not b:
        return a or b
    return min(a, b)


def _split_points(export: PinnedExport, partitions: int) -> tuple[int, list[bytes]]:
    """(key count, partitions - 1 keys cutting the export's range into ranges of equal count).
    Walks the keys only (no values); a whole-store range takes its count from LMDB's stat."""
    with export.lock:
        view = export.view
        whole = not export.start and not export.end
        count = view.count() if whole else sum(1 for _ in view.keys(export.start, export.end or None))
        if partitions <= 1 or count < partitions:
            return count, []
        step = count / partitions
        wanted = [round(step * i) for i in range(1, partitions)]
        splits: list[bytes] = []
        for position, key in enumerate(view.keys(export.start, export.end or None)):
            if position == wanted[len(splits)]:
                splits.append(key)
                if len(splits) == len(wanted):
                    break
        return count, splits


class ExportServicer(export_pb2_grpc.ExportServicer):
    """gRPC face of ExportHandler: every RaftKVError becomes a status with kv.errors' metadata.
    While auth is on (`auth`), exports are for the root role only: they read every key."""

    def __init__(self, handler: ExportHandler, gate: AuthGate | None = None) -> None:
        self._handler = handler
        self._gate = gate  # None: no auth at all (a test's servicer)

    def _check_root(self, context: grpc.aio.ServicerContext) -> None:
        if self._gate is not None:
            self._gate.check_root(self._gate.caller(context))

    async def BeginExport(self, request: export_pb2.BeginExportRequest,
                          context: grpc.aio.ServicerContext) -> export_pb2.BeginExportResponse:
        try:
            self._check_root(context)
        except errors.RaftKVError as e:
            await errors.abort(context, e)
        return await serve_call(self._handler.begin(request, context.time_remaining()), context)

    async def ReadExport(self, request: export_pb2.ReadExportRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[export_pb2.ExportBatch]:
        try:
            self._check_root(context)
            async for batch in self._handler.read(request):
                yield batch
        except errors.RaftKVError as e:
            await errors.abort(context, e)

    async def EndExport(self, request: export_pb2.EndExportRequest,
                        context: grpc.aio.ServicerContext) -> export_pb2.EndExportResponse:
        try:
            self._check_root(context)
        except errors.RaftKVError as e:
            await errors.abort(context, e)
        return await self._handler.end(request)

