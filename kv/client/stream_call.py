"""One bidirectional gRPC call that sends a message and waits for the next reply, two ways.

gRPC's public synchronous API runs a stream-stream call on two threads of its own: one takes the
requests from an iterator and starts their sends, the other (the channel's spin thread) polls
the call's completion queue and wakes the caller when a reply is in. Each request of a lone
client therefore wakes three threads in turn, and on this project's bench machine every wake-up
costs more than the work it carries (README, Performance, "This machine's wake-ups"). A blocking
unary call has none of those hops: gRPC makes it on a completion queue of its own (a
"segregated" call) that the calling thread polls itself, and with the polling I/O manager
(kv/tools/grpc_io.py) that thread also does the socket reads.

`InlineStreamCall` runs a stream the way gRPC runs that unary call: `exchange` starts the send of
one message and the receive of the next, then polls the call's own completion queue in the
caller's thread until both are done. It uses gRPC's Cython layer (`grpc._cython.cygrpc`, the same
calls grpc's own single-threaded unary-stream calls make), which is not public API;
`open_stream_call` falls back to `QueuedStreamCall`, on the public API, when those calls are not
there or do not take the arguments this module gives them; a call that finds them changed later
fails as UNAVAILABLE (the client retries it) and the process's later calls use the fallback.

Both carry serialized messages and share one contract: `exchange` from one thread at a time,
`cancel` from any thread (it ends a waiting `exchange`), `close` once no `exchange` runs."""
from __future__ import annotations

import logging
import queue
from collections.abc import Iterator
from typing import Any, Protocol

import grpc

log = logging.getLogger(__name__)

try:
    from grpc._cython import cygrpc
except ImportError:  # pragma: no cover - every grpcio wheel has it; the fallback covers its absence
    cygrpc = None

_END = None  # put on QueuedStreamCall's queue: half-close the stream
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_NO_FLAGS = 0  # gRPC's operation flags: none (a message is written at once)
# What gRPC's Cython layer raises when it is not what InlineStreamCall expects (a grpcio whose
# internals changed): the client then goes on with the public API.
_INTERNALS_CHANGED = (AttributeError, TypeError, ValueError)
_inline_works = cygrpc is not None  # until a call finds otherwise


class StreamCall(Protocol):
    def exchange(self, message: bytes) -> bytes | None:
        """Send `message` and return the next message the server sends; None when the server
        ended the call with OK first. Raises grpc.RpcError when the call failed or was cancelled."""

    def cancel(self) -> None:
        """End the call (any thread): a waiting `exchange` raises, later ones too."""

    def close(self) -> None:
        """Cancel, and release what the call holds. Not while an `exchange` runs."""


class CallEnded(grpc.RpcError):
    """How an InlineStreamCall ended, readable as any failed call is (`kv.errors.from_rpc_error`)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[tuple[str, Any], ...]):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailing_metadata = code, details, trailing_metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._trailing_metadata


# Tags of the call's operation batches; every batch started is in InlineStreamCall._due until its
# completion is taken off the queue.
_START, _STATUS, _HEADERS, _SEND, _RECEIVE = "start", "status", "headers", "send", "receive"


class InlineStreamCall:
    """A stream-stream call on a completion queue of its own, polled by the thread in `exchange`.

    gRPC frees the call and its queue as soon as the last started batch completes, so the queue
    is polled only while `_due` holds a batch: the status batch stays due until the call ends."""

    def __init__(self, channel: grpc.Channel, method: str, metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        batches = ((cygrpc.SendInitialMetadataOperation(metadata or (), _NO_FLAGS),), _START), \
                  ((cygrpc.ReceiveStatusOnClientOperation(_NO_FLAGS),), _STATUS), \
                  ((cygrpc.ReceiveInitialMetadataOperation(_NO_FLAGS),), _HEADERS)
        self._call = channel._channel.segregated_call(  # the grpc.Channel's cygrpc.Channel
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, method.encode(), None, None, None, None,
            batches, cygrpc.build_census_context(), None)
        self._due = {_START, _STATUS, _HEADERS}
        self._ended: CallEnded | None = None
        self._queue_gone = False  # a signal interrupted the poll: gRPC freed the call and its queue

    def exchange(self, message: bytes) -> bytes | None:
        try:
            return self._exchange(message)
        except _INTERNALS_CHANGED as e:
            _give_up_inline(e)
            raise CallEnded(grpc.StatusCode.UNAVAILABLE, f"this grpcio's internals are not what the client "
                            f"expects ({e!r}); later calls use gRPC's public API", ()) from e

    def _exchange(self, message: bytes) -> bytes | None:
        if self._ended is not None:  # over: None for an OK end, else its error again
            return self._await_end()
        if not self._start((cygrpc.SendMessageOperation(message, _NO_FLAGS),), _SEND) \
                or not self._start((cygrpc.ReceiveMessageOperation(_NO_FLAGS),), _RECEIVE):
            return self._await_end()
        reply: bytes | None = None
        while _SEND in self._due or _RECEIVE in self._due:
            event = self._next_event()
            if event.tag == _RECEIVE:
                reply = event.batch_operations[0].message()
        if reply is not None:
            return reply
        return self._await_end()  # the server closed its side: the status says how

    def cancel(self) -> None:
        self._call.cancel(cygrpc.StatusCode.cancelled, "cancelled by the client")

    def close(self) -> None:
        try:
            self.cancel()
            while self._due and not self._queue_gone:
                self._next_event()
        except _INTERNALS_CHANGED as e:  # the call may be left behind; the client goes on without
            _give_up_inline(e)

    def _start(self, operations: tuple[Any, ...], tag: str) -> bool:
        """Start one batch; False when the call has ended already (nothing was started)."""
        if self._queue_gone or not self._call.operate(operations, tag):
            return False
        self._due.add(tag)
        return True

    def _await_end(self) -> None:
        """Poll until the status is in; None for OK, else raise the CallEnded it describes."""
        while self._ended is None and _STATUS in self._due and not self._queue_gone:
            self._next_event()
        if self._ended is None:
            self._ended = CallEnded(grpc.StatusCode.CANCELLED, "the call ended", ())
        if self._ended.code() is grpc.StatusCode.OK:
            return None
        raise self._ended

    def _next_event(self) -> Any:
        try:
            event = self._call.next_event()
        except BaseException:  # KeyboardInterrupt in the poll: gRPC has freed the call
            self._queue_gone = True
            self._due.clear()
            raise
        self._due.discard(event.tag)
        if event.tag == _STATUS:
            status = event.batch_operations[0]
            self._ended = CallEnded(_STATUS_CODES.get(status.code(), grpc.StatusCode.UNKNOWN),
                                    status.details() or "", tuple(status.trailing_metadata() or ()))
        return event


class QueuedStreamCall:
    """The same call on gRPC's public API: its own thread takes the messages from a queue, the
    channel's spin thread hands the replies over."""

    def __init__(self, channel: grpc.Channel, method: str, metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        self._messages: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._call = channel.stream_stream(method)(self._outgoing(), metadata=metadata)

    def exchange(self, message: bytes) -> bytes | None:
        self._messages.put(message)
        try:
            return next(self._call)
        except StopIteration:
            return None

    def cancel(self) -> None:
        self._messages.put(_END)  # gRPC's sending thread waits on the queue: let it end
        self._call.cancel()

    def close(self) -> None:
        self.cancel()

    def _outgoing(self) -> Iterator[bytes]:
        while (message := self._messages.get()) is not _END:
            yield message


def open_stream_call(channel: grpc.Channel, method: str,
                     metadata: tuple[tuple[str, str], ...] | None = None) -> StreamCall:
    """An InlineStreamCall when this grpcio has what it needs, else a QueuedStreamCall; either
    sends `metadata` (the client's token) when it opens."""
    if _inline_works:
        try:
            return InlineStreamCall(channel, method, metadata)
        except _INTERNALS_CHANGED as e:
            _give_up_inline(e)
    return QueuedStreamCall(channel, method, metadata)


def _give_up_inline(error: Exception) -> None:
    global _inline_works
    if _inline_works:
        _inline_works = False
        log.warning("gRPC calls driven by their caller are not available (%r); using gRPC's threads", error)
