"""Many requests in flight on one KV.Pipeline call per node, shared by every Client in a process.

A request stream (kv/client/request_stream.py) carries one request at a time, so a node reads one message
and writes one reply per request, and the client's request crosses three threads. When a process
already has a request in flight to a node, a Client sends the next one on that node's pipeline
instead: the request is queued, gRPC's sending thread takes everything queued by then into one
message, and the node answers with every reply it has ready in one message too. One reader thread
hands the replies to their callers by tag. With one request at a time the pipeline would only add
the reader's hop, so a lone request keeps to its stream (`PipelineHub.enter`).

A late reply cannot answer a later request: tags are never reused. When the call fails, every
request waiting on it fails as unavailable (retryable; a write keeps its client id and seq, so a
retry applies it at most once), and the next request opens a new call. The pipelines close when the
process's last Client closes (one collected without close() counts out at the hub's next use)."""
from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable, Hashable, Iterator

import grpc

from kv.errors import UnavailableError
from kv.client.request_stream import answered, overdue, timeout_ms
from raftkv_proto import kv_pb2
from raftkv_proto.request_limits import BATCH_MESSAGE_BYTES, REQUEST_OVERHEAD_BYTES

METHOD = "/raftkv.kv.KV/Pipeline"
# What one message may carry: more requests wait for the next message. The byte bound keeps a
# message within every node's request limit (--max-request-bytes is at least this much); a
# request larger than it never goes on a pipeline (`fits`), so one message never fails the call.
MAX_REQUESTS_PER_MESSAGE = 64
MAX_BYTES_PER_MESSAGE = BATCH_MESSAGE_BYTES
# A request's framing inside a PipelineRequest: its field tag and length.
_FRAMING_BYTES = 6

_END = None  # put on the request queue: half-close the call
Metadata = tuple[tuple[str, str], ...]


class ReplyWaiter:
    """One request's wait for its reply: a lock held from the start and released by whoever
    settles it. A concurrent.futures.Future builds a Condition per request and notifies through
    it; with 16 threads sharing a pipeline that bookkeeping was about a third of the client's
    Python time per request (README, Performance). Settled at most once: only the party that
    took the waiter out of the pipeline's table settles it."""

    __slots__ = ("_settled", "_reply", "_error")

    def __init__(self) -> None:
        self._settled = threading.Lock()
        self._settled.acquire()
        self._reply: kv_pb2.StreamReply | None = None
        self._error: BaseException | None = None

    def set_reply(self, reply: kv_pb2.StreamReply) -> None:
        self._reply = reply
        self._settled.release()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._settled.release()

    def wait(self, timeout: float) -> kv_pb2.StreamReply | None:
        """The reply (its error raised); None when `timeout` s pass first."""
        if not self._settled.acquire(timeout=max(timeout, 0.0)):
            return None
        if self._error is not None:
            raise self._error
        return self._reply


class Pipeline:
    """One KV.Pipeline call to one node, on a channel it owns and closes when the call ends.
    `call` may be used by any number of threads at once."""

    def __init__(self, channel: grpc.Channel, address: str, metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        self.address = address
        self._channel = channel
        self.broken = False
        self._tags = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[int, ReplyWaiter] = {}
        self._requests: queue.SimpleQueue[kv_pb2.TaggedRequest | None] = queue.SimpleQueue()
        self._call = channel.stream_stream(
            METHOD,
            request_serializer=kv_pb2.PipelineRequest.SerializeToString,
            response_deserializer=kv_pb2.PipelineReply.FromString,
        )(outgoing_messages(self._requests), metadata=metadata)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"raftkv-pipeline-{address}")
        self._reader.start()

    def call(self, request: kv_pb2.StreamRequest, timeout: float) -> kv_pb2.StreamReply:
        """The reply to `request` (refusals raised as their RaftKVError), within `timeout` s."""
        request.timeout_ms = timeout_ms(timeout)
        waiter = ReplyWaiter()
        tag = next(self._tags)
        with self._lock:
            if self.broken:
                raise UnavailableError(f"the pipeline to {self.address} is closed")
            self._waiting[tag] = waiter
        self._requests.put(kv_pb2.TaggedRequest(tag=tag, request=request))
        reply = waiter.wait(timeout)
        if reply is None:
            with self._lock:
                self._waiting.pop(tag, None)
            raise overdue(self.address, timeout)
        return answered(reply)

    def close(self) -> None:
        """End the call; requests waiting on it fail as unavailable."""
        with self._lock:
            self.broken = True
        self._requests.put(_END)
        self._call.cancel()

    def _read(self) -> None:
        why = "ended the pipeline"
        try:
            for message in self._call:
                with self._lock:
                    answered = [(self._waiting.pop(r.tag, None), r.reply) for r in message.replies]
                for waiter, reply in answered:
                    if waiter is not None:  # None: its caller gave up waiting
                        waiter.set_reply(reply)
        except grpc.RpcError as e:
            why = f"failed the pipeline: {e.code().name} {e.details() or ''}".rstrip()
        except Exception as e:  # noqa: BLE001 - a reply that does not parse, say: fail the callers, never hang them
            why = f"failed the pipeline: {e!r}"
        with self._lock:
            self.broken = True
            waiting, self._waiting = self._waiting, {}
        self._requests.put(_END)  # gRPC's sending thread waits on the queue: let it end
        error = UnavailableError(f"{self.address} {why}")
        for waiter in waiting.values():
            waiter.set_error(error)
        self._channel.close()  # the pipeline's own: a broken pipeline is never used again


class Membership:
    """One Client's place in the hub's count (`PipelineHub.attach`)."""

    def __init__(self, hub: PipelineHub) -> None:
        self._hub = hub
        self.released = False  # under the hub's lock

    def release(self) -> None:
        """Leave the count (the second call does nothing)."""
        self._hub._leave(self)

    def release_later(self) -> None:
        """For a finalizer: garbage collection may run it on any thread, even one holding the
        hub's lock, so it only queues the release (SimpleQueue.put is safe there)."""
        self._hub._collected.put(self)


def outgoing_messages(requests: queue.SimpleQueue[kv_pb2.TaggedRequest | None]) -> Iterator[kv_pb2.PipelineRequest]:
    """The call's messages: each takes everything queued by the time gRPC's sending thread asks
    for it, within MAX_REQUESTS_PER_MESSAGE and MAX_BYTES_PER_MESSAGE; None on the queue ends them."""
    held: kv_pb2.TaggedRequest | None = None  # taken, but past the last message's bounds
    while (first := held or requests.get()) is not _END:
        batch, size, held = [first], first.ByteSize() + _FRAMING_BYTES, None
        while len(batch) < MAX_REQUESTS_PER_MESSAGE:
            try:
                more = requests.get_nowait()
            except queue.Empty:
                break
            if more is _END:
                yield kv_pb2.PipelineRequest(requests=batch)
                return
            size += more.ByteSize() + _FRAMING_BYTES
            if size > MAX_BYTES_PER_MESSAGE:
                held = more
                break
            batch.append(more)
        yield kv_pb2.PipelineRequest(requests=batch)


def fits(payload_bytes: int) -> bool:
    """Whether a request carrying `payload_bytes` of keys and values may go on a pipeline: one
    over the node's limit would fail the whole call, and with it every request in flight."""
    return payload_bytes <= MAX_BYTES_PER_MESSAGE - REQUEST_OVERHEAD_BYTES


class PipelineHub:
    """The process's pipelines, one per node address and kind of connection (plaintext, or TLS with
    given files: a Client must never send on a connection made with other credentials than its
    own), and its count of requests in flight per
    address (over streams and pipelines alike), which decides where the next one goes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients = 0
        self._inflight: dict[str, int] = {}
        # By address, the TLS its connections use (None: plaintext) and the metadata its Clients
        # send (a token: Clients logged in as a user share only their own pipelines).
        self._pipelines: dict[tuple[str, Hashable, Metadata | None], Pipeline] = {}
        # Memberships of Clients collected without close(), left here by their finalizers and
        # released at the hub's next attach or enter (see Membership.release_later).
        self._collected: queue.SimpleQueue[Membership] = queue.SimpleQueue()

    def attach(self) -> Membership:
        """Count a Client in until its membership is released. When the last Client leaves, the
        pipelines close: open, each would hold a call on its node, a channel and two threads for
        the life of the process."""
        self._release_collected()
        with self._lock:
            self._clients += 1
        return Membership(self)

    def _leave(self, membership: Membership) -> None:
        with self._lock:
            if membership.released:
                return
            membership.released = True
            self._clients -= 1
            closing = list(self._pipelines.values()) if self._clients == 0 else []
            if closing:
                self._pipelines.clear()
        for pipeline in closing:
            pipeline.close()

    def _release_collected(self) -> None:
        if self._collected.empty():  # nearly always: skip raising queue.Empty on every request
            return
        while True:
            try:
                membership = self._collected.get_nowait()
            except queue.Empty:
                return
            self._leave(membership)

    def enter(self, address: str) -> bool:
        """Count a request to `address`; True when another is in flight there already, so this
        one should go on the pipeline. Pair with `leave`."""
        self._release_collected()
        with self._lock:
            busy = self._inflight.get(address, 0)
            self._inflight[address] = busy + 1
            return busy > 0

    def leave(self, address: str) -> None:
        with self._lock:
            self._inflight[address] -= 1

    def pipeline(self, address: str, open_channel: Callable[[], grpc.Channel],
                 credentials: Hashable = None, metadata: Metadata | None = None) -> Pipeline:
        """The open pipeline to `address` over connections made with `credentials` (None: plaintext;
        a Client's TLS), for calls with `metadata`, opened on a channel of its own (`open_channel()`)
        when there is none or the last one broke."""
        key = (address, credentials, metadata)
        with self._lock:
            pipeline = self._pipelines.get(key)
            if pipeline is not None and not pipeline.broken:
                return pipeline
            pipeline = self._pipelines[key] = Pipeline(open_channel(), address, metadata)
            return pipeline

    def forget(self, metadata: Metadata | None) -> None:
        """Close the pipelines opened with `metadata` (a token no Client uses any more); the
        token-less ones (None) are shared, and close with the last Client."""
        if metadata is None:
            return
        with self._lock:
            closing = [key for key in self._pipelines if key[2] == metadata]
            pipelines = [self._pipelines.pop(key) for key in closing]
        for pipeline in pipelines:
            pipeline.close()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's calls and threads are not there; start afresh (its
        Clients are, and still count)."""
        self._lock = threading.Lock()
        self._inflight, self._pipelines = {}, {}
        self._collected = queue.SimpleQueue()


# Shared by every Client of the process: sharing is the point (16 clients' requests to one node
# travel together).
HUB = PipelineHub()
os.register_at_fork(after_in_child=HUB.forget_after_fork)
