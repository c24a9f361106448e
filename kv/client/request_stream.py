"""A client's long-lived KV.Stream call to one node: Put, Get and Delete as stream messages.

On this machine a Python node spends about half the CPU on a stream message that it spends on a
unary call, and one client's round trip falls from 0.31-0.42 to about 0.22 ms (README,
Performance). The stream carries one request at a time, so a reply always belongs to the request
before it; a Client keeps a few idle streams per node and lends one to each call (`StreamPool`).

The caller's own thread sends the request and polls for the reply (kv/client/stream_call.py), with no
gRPC thread in between where grpcio allows it. A reply can only be awaited without a time limit,
so a `Watchdog` (one thread per pool, asleep until the earliest deadline) cancels a stream whose
reply is overdue; a reader thread handing replies over to the caller cost the client 11% more
CPU per request. A stream whose reply does not come in time, or whose call fails, is closed and
never lent again: a late reply must not answer the next request."""
from __future__ import annotations

import threading
import time

import grpc
from google.protobuf.message import DecodeError

from kv.errors import RaftKVError, UnavailableError, from_rpc_error, from_stream_error
from kv.errors import TimeoutError as KVTimeoutError
from kv.client.stream_call import open_stream_call
from raftkv_proto import kv_pb2

METHOD = "/raftkv.kv.KV/Stream"
# Streams a Client keeps per node. Each open stream holds a client thread (gRPC's, feeding it
# requests) and a task on the node; a caller that finds none idle and this many open uses a
# unary call instead.
MAX_STREAMS_PER_NODE = 8


def timeout_ms(timeout: float) -> int:
    """A request's timeout_ms: how long the node may work on it."""
    return max(1, int(timeout * 1000))


def answered(reply: kv_pb2.StreamReply) -> kv_pb2.StreamReply:
    """The reply, or the RaftKVError its refusal stands for, raised."""
    if reply.WhichOneof("reply") == "error":
        raise from_stream_error(reply.error)
    return reply


def overdue(address: str, timeout: float) -> KVTimeoutError:
    return KVTimeoutError(f"no reply from {address} within {timeout:.3f}s; "
                          "a write may still be applied later, at most once")


class RequestStream:
    """One KV.Stream call. `call` sends one request and returns its reply, or raises the
    RaftKVError it stands for. Not for concurrent use: the pool lends it to one caller at a time."""

    def __init__(self, channel: grpc.Channel, address: str, watchdog: Watchdog,
                 metadata: tuple[tuple[str, str], ...] | None = None, generation: int = 0) -> None:
        self.address = address
        self.broken = False
        self.generation = generation  # the pool's generation it was opened in (StreamPool.reset)
        self._expired = False
        self._watchdog = watchdog
        self._call = open_stream_call(channel, METHOD, metadata)

    def call(self, request: kv_pb2.StreamRequest, timeout: float) -> kv_pb2.StreamReply:
        """The reply to `request` (refusals raised as their RaftKVError), within `timeout` s."""
        request.timeout_ms = timeout_ms(timeout)
        self._watchdog.watch(self, time.monotonic() + timeout)
        # Broken until the reply is in: a stream left in the middle of an exchange (an error, or
        # an interrupt) must never be lent again, or its late reply would answer the next request.
        self.broken = True
        try:
            message = self._call.exchange(request.SerializeToString())
        except grpc.RpcError as e:
            if self._expired:
                raise overdue(self.address, timeout) from None
            raise from_rpc_error(e) from None
        finally:
            self._watchdog.unwatch(self)
        if message is None:
            raise UnavailableError(f"{self.address} ended the request stream")
        try:
            reply = kv_pb2.StreamReply.FromString(message)
        except DecodeError:
            raise RaftKVError(f"INTERNAL: {self.address} sent a reply that does not parse") from None
        self.broken = self._expired
        return answered(reply)

    def expire(self) -> None:
        """The reply is overdue (the watchdog's call, from its thread): end the call, which ends
        the wait; the caller then closes the stream."""
        self._expired = True
        self.broken = True
        self._call.cancel()

    def close(self) -> None:
        """(not while a call waits: the pool closes a stream when it is idle or given back)"""
        self.broken = True
        self._call.close()


class Watchdog:
    """Expires the streams whose reply is overdue. Its thread starts with the first watch and
    sleeps until the earliest deadline; since each stream's next deadline is later than its last,
    it wakes about once per timeout, not once per request."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: dict[RequestStream, float] = {}
        self._wake_at: float | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, stream: RequestStream, deadline: float) -> None:
        with self._cond:
            self._deadlines[stream] = deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="raftkv-stream-watchdog")
                self._thread.start()
            elif self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()

    def unwatch(self, stream: RequestStream) -> None:
        with self._cond:
            self._deadlines.pop(stream, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for stream in [s for s, deadline in self._deadlines.items() if deadline <= now]:
                    del self._deadlines[stream]
                    stream.expire()
                self._wake_at = min(self._deadlines.values(), default=None)
                self._cond.wait(None if self._wake_at is None else self._wake_at - now)


class StreamPool:
    """Idle RequestStreams per node address. `take` lends one (opening it when none is idle and
    fewer than MAX_STREAMS_PER_NODE are open), `give_back` returns it; a broken one is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[RequestStream]] = {}
        self._open: dict[str, int] = {}
        self._closed = False
        self._watchdog = Watchdog()
        self._generation = 0

    def take(self, address: str, channel: grpc.Channel,
             metadata: tuple[tuple[str, str], ...] | None = None) -> RequestStream | None:
        """An idle stream to `address`, a new one (opened with `metadata`: the client's token),
        or None when the node's quota is in use."""
        with self._lock:
            if self._closed:
                return None
            idle = self._idle.get(address)
            if idle:
                return idle.pop()
            if self._open.get(address, 0) >= MAX_STREAMS_PER_NODE:
                return None
            self._open[address] = self._open.get(address, 0) + 1
            generation = self._generation
        return RequestStream(channel, address, self._watchdog, metadata, generation)

    def reset(self) -> None:
        """Close the idle streams, and the lent ones when they come back: they carry the metadata
        of a token the client no longer uses."""
        with self._lock:
            self._generation += 1
            idle = [s for streams in self._idle.values() for s in streams]
            self._idle.clear()
            for stream in idle:
                self._open[stream.address] -= 1
        for stream in idle:
            stream.close()

    def give_back(self, stream: RequestStream) -> None:
        with self._lock:
            if not stream.broken and not self._closed and stream.generation == self._generation:
                self._idle.setdefault(stream.address, []).append(stream)
                return
            self._open[stream.address] -= 1
        stream.close()

    def close(self) -> None:
        """Close every idle stream; streams lent out close when they are given back."""
        with self._lock:
            self._closed = True
            idle = [s for streams in self._idle.values() for s in streams]
            self._idle.clear()
        self._watchdog.close()
        for stream in idle:
            stream.close()
