"""KV.Pipeline on a node: a client's tagged requests, all in flight at once, each reply sent
back with its tag as soon as it is ready, together with every other reply ready by then.

One call is a reader task that pulls requests and starts each on the handler, and the call's own
task that sends replies in messages (`PipelineCall`). The call bounds what it holds, by count and
by bytes (`_ReplyGather`): past either it reads no further requests, so a client that sends without
reading is held back by gRPC's flow control rather than growing the node's memory. A request is
its handler's reply future and a done callback, no task each, which is what lets one call keep
hundreds of requests in flight cheaply. KVServicer (kv_service.py) is the gRPC face that opens
calls, counts them in `status` and ends them on shutdown."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from raftkv_proto import kv_pb2

from kv import errors

# Start one stream or pipeline request: its kind ("put", "get", "delete") and the handler's
# future of its reply; a refusal known at once is raised (KVServicer._begin).
BeginRequest = Callable[[kv_pb2.StreamRequest], tuple[str, asyncio.Future[Any]]]

# Requests one Pipeline call may hold (in flight, or answered and not yet sent), and bytes of
# answered replies it may hold (waiting, or in the message being sent). Past either the call reads
# no further requests until its client takes replies: gRPC's flow control then holds the client's
# writes, so a client that sends without reading cannot grow the node's memory without bound
# (4,096 gets of 1 MiB values would be 4 GiB). A get in flight counts at the call's get reply
# estimate, since its reply is not known yet, so a burst of large gets stops the reading before it
# lands. The count is far above what one process's clients keep in flight (one per thread); the
# bytes, above what a reading client leaves waiting.
MAX_PIPELINE_HELD = 4096
MAX_PIPELINE_HELD_BYTES = 8 << 20
# Replies one PipelineReply message carries at most, by bytes (its first reply always goes).
PIPELINE_MESSAGE_BYTES = 4 << 20
# What a reply costs besides its value: tag, index, framing (an estimate: exact sizes would cost a
# serialization per reply).
_REPLY_OVERHEAD_BYTES = 32
# A call's first estimate of a get reply, before any has come back: 128 gets in flight fill the
# byte budget, plenty for a client's threads, and few enough that large values cannot flood it.
_FIRST_GET_ESTIMATE_BYTES = 64 << 10


class _ReplyGather:
    """A Pipeline call's requests in flight and their replies, gathered into batches for the
    call to send. A request is its handler's reply future and a done callback: no task each.
    A batch taken by `next_batch` stays held until the call says it is `sent`: while the client
    does not read, gRPC's send does not finish, and those replies are still in memory."""

    def __init__(self, limit: int, byte_limit: int = MAX_PIPELINE_HELD_BYTES) -> None:
        self._limit = limit
        self._byte_limit = byte_limit
        self._ready: list[tuple[kv_pb2.TaggedReply, int]] = []  # (reply, its estimated bytes)
        self._ready_bytes = 0
        self._sending = 0  # replies in the message being sent, and their bytes
        self._sending_bytes = 0
        self._changed = asyncio.Event()
        self._taken = asyncio.Event()  # set when sent replies leave (room for more)
        self._running: set[asyncio.Future[Any]] = set()
        self._running_gets = 0
        # A get reply's expected size: up at once to a larger reply, down slowly to smaller ones.
        self._get_estimate = _FIRST_GET_ESTIMATE_BYTES
        self._failure: BaseException | None = None
        self._reader: asyncio.Task[None] | None = None
        self.ended = False  # `end` was called: the call stops sending

    def read_with(self, reader: asyncio.Task[None]) -> None:
        """`reader` starts the requests; once it is done and they are answered, the call ends."""
        self._reader = reader
        reader.add_done_callback(self._wake)

    @property
    def held(self) -> int:
        """Requests the call holds: running, answered and not yet sent, or being sent."""
        return len(self._running) + len(self._ready) + self._sending

    @property
    def held_bytes(self) -> int:
        """Bytes of the replies the call holds, answered or expected (an estimate: values plus a
        little, and the recent get reply size for each get in flight)."""
        return self._ready_bytes + self._sending_bytes + self._running_gets * self._get_estimate

    @property
    def full(self) -> bool:
        return self.held >= self._limit or self.held_bytes >= self._byte_limit

    async def room(self) -> None:
        """Return once the call is not full (at once when it is not)."""
        while self.full:
            self._taken.clear()
            await self._taken.wait()

    def answered(self, tag: int, reply: kv_pb2.StreamReply) -> None:
        """A reply known at once (a refusal)."""
        self._add(kv_pb2.TaggedReply(tag=tag, reply=reply), len(reply.error.message) + _REPLY_OVERHEAD_BYTES)
        self._wake()

    def start(self, tag: int, kind: str, pending: asyncio.Future[Any]) -> None:
        """`pending`: the handler's future of the `kind` ("put", "get", "delete") reply."""
        self._running.add(pending)
        if kind == "get":
            self._running_gets += 1
        pending.add_done_callback(functools.partial(self._finish, tag, kind))

    def _finish(self, tag: int, kind: str, done: asyncio.Future[Any]) -> None:
        self._running.discard(done)
        if kind == "get":
            self._running_gets -= 1
        if done.cancelled():  # cancel_all: the call is over
            return
        try:
            reply = stream_reply_of(kind, done)
        except Exception as e:  # noqa: BLE001 - not a refusal (those are replies): fail the call
            self._failure = e
        else:
            size = _REPLY_OVERHEAD_BYTES + len(reply.get.value) + len(reply.error.message)
            if kind == "get":
                self._get_estimate = max(size, self._get_estimate + (size - self._get_estimate) // 8)
            self._add(kv_pb2.TaggedReply(tag=tag, reply=reply), size)
        self._wake()

    def _add(self, reply: kv_pb2.TaggedReply, size: int) -> None:
        self._ready.append((reply, size))
        self._ready_bytes += size

    def _wake(self, *_: object) -> None:
        self._changed.set()

    def end(self) -> None:
        """No further batch: `next_batch` returns None from now on (the call ends on shutdown)."""
        self.ended = True
        self._wake()

    async def next_batch(self) -> list[kv_pb2.TaggedReply] | None:
        """Replies ready now, up to PIPELINE_MESSAGE_BYTES of them (at least one), waiting for
        one if none is; None once the reader is done (the client ended its requests, or reading
        failed) and nothing is left in flight, or once `end` is called. Call `sent` once the
        batch is sent."""
        assert self._reader is not None, "read_with() first"
        while not self._ready or self.ended:
            if self.ended:
                return None
            if self._failure is not None:
                raise self._failure
            if self._reader.done() and not self._running:
                return None
            self._changed.clear()
            await self._changed.wait()
        count, size = 0, 0
        for _, reply_size in self._ready:
            if count and size + reply_size > PIPELINE_MESSAGE_BYTES:
                break
            count += 1
            size += reply_size
        batch = [reply for reply, _ in self._ready[:count]]
        del self._ready[:count]
        self._ready_bytes -= size
        self._sending, self._sending_bytes = count, size
        return batch

    def sent(self) -> None:
        """The last batch is sent (gRPC took it): its replies are no longer held."""
        self._sending = self._sending_bytes = 0
        self._taken.set()

    def cancel_all(self) -> None:
        for pending in list(self._running):
            pending.cancel()


def stream_reply_of(kind: str, done: asyncio.Future[Any]) -> kv_pb2.StreamReply:
    """The StreamReply for a finished handler future: its `kind` reply, or the refusal it
    failed with. Any other failure is raised."""
    error = done.exception()
    if error is None:
        return kv_pb2.StreamReply(**{kind: done.result()})
    if isinstance(error, errors.RaftKVError):
        return refusal(error)
    raise error


def refusal(error: errors.RaftKVError) -> kv_pb2.StreamReply:
    """A refused request's reply, on a Pipeline or a Stream call: the call stays open."""
    return kv_pb2.StreamReply(error=errors.stream_error(error))


class PipelineCall:
    """One open Pipeline call: the task reading its requests and starting each, and the replies
    it holds, under MAX_PIPELINE_HELD and MAX_PIPELINE_HELD_BYTES (read when the call opens)."""

    def __init__(self, requests: AsyncIterator[kv_pb2.PipelineRequest], begin: BeginRequest) -> None:
        self._replies = _ReplyGather(MAX_PIPELINE_HELD, MAX_PIPELINE_HELD_BYTES)
        self._reader = asyncio.create_task(read_requests(requests, self._replies, begin))
        self._replies.read_with(self._reader)

    @property
    def held(self) -> int:
        return self._replies.held

    @property
    def held_bytes(self) -> int:
        return self._replies.held_bytes

    @property
    def ended(self) -> bool:
        """`end` was called (rather than every request answered and sent)."""
        return self._replies.ended

    def end(self) -> None:
        """End the call (the node is shutting down): `next_message` returns None at once, or,
        when the call's task is sending a message, once that send is done. The call's task then
        ends the call with its status (KVServicer.Pipeline); what was in flight is dropped."""
        self._replies.end()

    async def next_message(self) -> kv_pb2.PipelineReply | None:
        """The next message to send, or None once every request is answered and sent, or once
        the call is `end`ed. Call `sent` once it is sent."""
        batch = await self._replies.next_batch()
        if batch is None:
            if not self.ended:
                await self._reader  # raises what ended the reading (an abort for a malformed message)
            return None
        return kv_pb2.PipelineReply(replies=batch)

    def sent(self) -> None:
        self._replies.sent()

    def close(self) -> None:
        """However the call ended: stop reading and drop the requests still in flight."""
        self._reader.cancel()
        self._replies.cancel_all()


async def read_requests(requests: AsyncIterator[kv_pb2.PipelineRequest], replies: _ReplyGather,
                        begin: BeginRequest) -> None:
    """A call's reader: start each request in turn, waiting for room whenever the call is full."""
    async for batch in requests:
        for tagged in batch.requests:
            if replies.full:
                await replies.room()
            try:
                kind, pending = begin(tagged.request)
            except errors.RaftKVError as e:
                replies.answered(tagged.tag, refusal(e))
                continue
            replies.start(tagged.tag, kind, pending)
