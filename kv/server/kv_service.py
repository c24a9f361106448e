"""The client API's gRPC face on a node: `KVServicer` resolves each call's user while auth is on,
hands the request to KVHandler (kv_handler.py) and turns its kv.errors into statuses with kv.errors'
metadata; it counts calls for the metrics. One Pipeline call's mechanics (its reader, its replies
and their budgets) are in pipeline_call.py."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from kv import errors
from raftkv_proto import kv_pb2, kv_pb2_grpc
from statemachine.auth_state import USER_EMPTY
from kv.server.auth_gate import Caller
from kv.server.pipeline_call import PipelineCall, refusal
from raft.node.stats import LATENCY_BUCKETS_S, Histogram
from snapshot.file_format import read_manifest
from snapshot.transfer import chunk_file
from kv.server.kv_handler import KVHandler

if TYPE_CHECKING:
    from kv.server.auth_service import AuthHandler

T = TypeVar("T")

log = logging.getLogger(__name__)

# The method a Stream request is counted as, by its kind (metrics.py: grpc_server_handled_total).
_STREAM_METHODS = {"put": "Stream.Put", "get": "Stream.Get", "delete": "Stream.Delete"}


async def serve_call(call: Awaitable[T], context: grpc.aio.ServicerContext) -> T:
    """Await a handler call; a RaftKVError ends the RPC with its status and kv.errors' metadata."""
    try:
        return await call
    except errors.RaftKVError as e:
        await errors.abort(context, e)
        raise  # unreachable: abort raises


class KVServicer(kv_pb2_grpc.KVServicer):
    """gRPC face of KVHandler: every RaftKVError becomes a status with kv.errors' metadata.
    While auth is on each call's user is resolved (AuthGate) and handed to the handler; while it
    is off that costs one attribute test (`self._auth.enabled`)."""

    def __init__(self, handler: KVHandler, auth_handler: AuthHandler | None = None) -> None:
        self._handler = handler
        self._auth = handler.auth
        self._gate = handler.gate
        self._auth_handler = auth_handler
        # What end_streams ends at once: Stream calls waiting for their next request, by handler
        # task. (Pipeline calls are in _pipelines and end themselves: see end_streams.)
        self._stoppable_calls: dict[asyncio.Task[Any], grpc.aio.ServicerContext] = {}
        self._ending = False
        self._pipelines: set[PipelineCall] = set()  # every open Pipeline call, for status and end_streams
        # Plain counts for metrics.py, read at scrape time: finished unary calls by (method, code),
        # and requests begun on Stream and Pipeline calls by kind (put, get, delete).
        self.handled: dict[tuple[str, str], int] = {}
        self.latency: dict[str, Histogram] = {}  # method -> seconds from the call (or stream request) to its reply
        self.stream_requests: dict[str, int] = {"put": 0, "get": 0, "delete": 0}

    async def Put(self, request: kv_pb2.PutRequest, context: grpc.aio.ServicerContext) -> kv_pb2.PutResponse:
        return await self._serve(context, lambda user: self._handler.put(request, context.time_remaining(), user),
                                 "Put")

    async def Get(self, request: kv_pb2.GetRequest, context: grpc.aio.ServicerContext) -> kv_pb2.GetResponse:
        return await self._serve(context, lambda user: self._handler.get(request, context.time_remaining(), user),
                                 "Get")

    async def Delete(self, request: kv_pb2.DeleteRequest, context: grpc.aio.ServicerContext) -> kv_pb2.DeleteResponse:
        return await self._serve(context, lambda user: self._handler.delete(request, context.time_remaining(), user),
                                 "Delete")

    async def Scan(self, request: kv_pb2.ScanRequest, context: grpc.aio.ServicerContext) -> bytes:
        return await self._serve(context, lambda user: self._handler.scan(request, context.time_remaining(), user),
                                 "Scan")

    async def Changes(self, request: kv_pb2.ChangesRequest,
                      context: grpc.aio.ServicerContext) -> kv_pb2.ChangesResponse:
        return await self._serve(context, lambda user: self._handler.changes(request, context.time_remaining(), user),
                                 "Changes")

    async def Batch(self, request: kv_pb2.BatchRequest, context: grpc.aio.ServicerContext) -> kv_pb2.BatchResponse:
        return await self._serve(context, lambda user: self._handler.batch(request, context.time_remaining(), user),
                                 "Batch")

    async def RegisterClient(self, request: kv_pb2.RegisterClientRequest,
                             context: grpc.aio.ServicerContext) -> kv_pb2.RegisterClientResponse:
        return await self._serve(context, lambda user: self._handler.register_client(
            request, context.time_remaining(), user), "RegisterClient")

    async def _serve(self, context: grpc.aio.ServicerContext, work: Callable[[str | None], Awaitable[T]],
                     method: str) -> T:
        """`work(user)` for the call's user (None while auth is off); a RaftKVError, a refused
        identity included, ends the RPC with its status. Counted by `method` and code (metrics.py)."""
        started = time.perf_counter()
        try:
            reply = await work(self._gate.caller(context))
        except errors.RaftKVError as e:
            self._count(method, e.code.name, started)
            log.debug("%s refused: %s: %s", method, e.kind, e, extra={"grpc_method": method})
            await errors.abort(context, e)
            raise  # unreachable: abort raises
        self._count(method, "OK", started)
        return reply

    def _count(self, method: str, code: str, started: float) -> None:
        """One finished call or stream request: its count by code and its latency (about 0.4 µs)."""
        key = (method, code)
        self.handled[key] = self.handled.get(key, 0) + 1
        latency = self.latency.get(method)
        if latency is None:
            latency = self.latency[method] = Histogram(LATENCY_BUCKETS_S)
        latency.observe(time.perf_counter() - started)

    async def Alarm(self, request: kv_pb2.AlarmRequest, context: grpc.aio.ServicerContext) -> kv_pb2.AlarmResponse:
        return await self._serve(context, lambda user: self._handler.alarm(request, context.time_remaining(), user),
                                 "Alarm")

    async def AuthAdmin(self, request: kv_pb2.AuthAdminRequest,
                        context: grpc.aio.ServicerContext) -> kv_pb2.AuthAdminResponse:
        assert self._auth_handler is not None, "served with an AuthHandler (kv/server/server.py)"
        auth = self._auth_handler
        return await self._serve(context, lambda user: auth.admin(request, user, context.time_remaining()),
                                 "AuthAdmin")

    async def Authenticate(self, request: kv_pb2.AuthenticateRequest,
                           context: grpc.aio.ServicerContext) -> kv_pb2.AuthenticateResponse:
        assert self._auth_handler is not None, "served with an AuthHandler (kv/server/server.py)"
        return await serve_call(self._auth_handler.authenticate(request, context.time_remaining()), context)

    async def Status(self, request: kv_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> kv_pb2.StatusResponse:
        reply = self._handler.status()
        reply.pipeline_requests_held, reply.pipeline_reply_bytes_held = self.pipeline_held()
        return reply

    def pipeline_held(self) -> tuple[int, int]:
        """Requests and reply bytes the open Pipeline calls hold."""
        return sum(p.held for p in self._pipelines), sum(p.held_bytes for p in self._pipelines)

    async def Stream(self, requests: AsyncIterator[kv_pb2.StreamRequest],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[kv_pb2.StreamReply]:
        """Put, Get and Delete on one long-lived stream, one at a time: each request's reply (or
        refusal) before the next request is read. `end_streams` ends it between requests."""
        task = asyncio.current_task()
        assert task is not None
        caller = Caller(self._gate, context)
        while not self._ending:
            self._stoppable_calls[task] = context
            try:
                request = await anext(requests)
            except StopAsyncIteration:
                return
            finally:
                self._stoppable_calls.pop(task, None)
            yield await self._stream_reply(request, caller)

    async def Pipeline(self, requests: AsyncIterator[kv_pb2.PipelineRequest],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[kv_pb2.PipelineReply]:
        """Tagged requests, all in flight at once; each reply goes back with its tag as soon as it
        is ready, together with every other reply ready by then (pipeline_call.py). `end_streams`
        ends the call with UNAVAILABLE: its client retries what was in flight (writes keep their
        client id and seq)."""
        if self._ending:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")
        caller = Caller(self._gate, context)
        call = PipelineCall(requests, lambda request: self._begin(request, caller))
        self._pipelines.add(call)
        try:
            while (message := await call.next_message()) is not None:
                yield message
                call.sent()
            if call.ended:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")
        finally:
            self._pipelines.discard(call)
            call.close()

    async def end_streams(self) -> None:
        """On shutdown: end every stream now waiting for its next request, and every pipeline,
        with UNAVAILABLE (their client retries elsewhere, as after any stop), and each other
        stream once its request is answered. Left open, they would hold the server's stop for its
        whole grace period.

        A pipeline is told to end, and ends itself from its own task: its status must not be sent
        from here. Its task may be inside gRPC, sending the message it last yielded (the client can
        have that message before the send's completion reaches the task), and a status sent from
        another task meanwhile fails (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS): no status would go at
        all, and the call would stay open until the server's stop cancelled it ("Cancelling all
        calls") after its grace period. A Stream call is here only while its task waits for the
        next request, after its last reply was sent, so it is ended from here."""
        self._ending = True
        for call in self._pipelines:
            call.end()
        for task, context in list(self._stoppable_calls.items()):
            try:
                # Sends the status from this task; the handler's pending read then ends.
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")
            except Exception:  # noqa: BLE001 - AbortError: sent; others: the client left meanwhile
                pass
            task.cancel()

    async def _stream_reply(self, request: kv_pb2.StreamRequest, caller: Caller) -> kv_pb2.StreamReply:
        started = time.perf_counter()
        method = _STREAM_METHODS.get(request.WhichOneof("request") or "", "Stream")
        try:
            kind, pending = self._begin(request, caller)
            reply = kv_pb2.StreamReply(**{kind: await pending})
        except errors.RaftKVError as e:
            self._count(method, e.code.name, started)
            log.debug("%s refused: %s: %s", method, e.kind, e, extra={"grpc_method": method})
            return refusal(e)
        self._count(method, "OK", started)
        return reply

    def _begin(self, request: kv_pb2.StreamRequest, caller: Caller | None = None) -> tuple[str, asyncio.Future[Any]]:
        """Start a stream or pipeline request of `caller`: its kind and the handler's future of
        its reply. A refusal known at once is raised."""
        timeout = request.timeout_ms / 1000 if request.timeout_ms else None
        user = None
        if self._auth.enabled:
            if caller is None:
                raise errors.UnauthenticatedError(USER_EMPTY)
            user = caller.user()
        kind = request.WhichOneof("request")
        if kind in self.stream_requests:
            self.stream_requests[kind] += 1
        if kind == "put":
            return kind, self._handler.begin_put(request.put, timeout, user)
        if kind == "get":
            return kind, self._handler.begin_get(request.get, timeout, user)
        if kind == "delete":
            return kind, self._handler.begin_delete(request.delete, timeout, user)
        raise errors.InvalidArgumentError("a stream request needs one of put, get or delete")

    async def SaveSnapshot(self, request: kv_pb2.SaveSnapshotRequest,
                           context: grpc.aio.ServicerContext) -> AsyncIterator[kv_pb2.SnapshotFileChunk]:
        info = await self._serve(context, lambda user: self._handler.save_snapshot(context.time_remaining(), user),
                                 "SaveSnapshot")
        manifest_json = (await asyncio.to_thread(read_manifest, info.path))[0].to_json()
        chunks = chunk_file(info.path)
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield kv_pb2.SnapshotFileChunk(manifest_json=manifest_json if chunk.offset == 0 else b"",
                                           total_size=info.file_size, sha256=info.sha256,
                                           offset=chunk.offset, data=chunk.data, done=chunk.done)
