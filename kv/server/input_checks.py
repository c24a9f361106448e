"""Register a grpc.aio servicer so that a request whose bytes do not parse is refused with
INVALID_ARGUMENT and a message saying so. Left to itself, gRPC answers such garbage with UNKNOWN
and logs a traceback per request; a node must give a clear error and keep serving.

Every method gets the check: a unary request before the handler runs, a streaming request's
messages as the handler reads them (the call ends at the first malformed one). A `caller_check`,
when given, runs before every handler too (the client port's revocation list, kv/server/tls.py).

A handler may also answer with bytes it encoded itself, sent as they are: the Watch service
shares one revision's encoded events among its watches (kv/server/etcd_watch.py)."""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Malformed:
    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse_or_mark(raw: bytes) -> Any:
        try:
            return parse(raw)
        except (DecodeError, ValueError) as e:
            return _Malformed(e)
    return parse_or_mark


def _passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def serialize_unless_bytes(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)
    return serialize_unless_bytes


async def _refuse(request: _Malformed, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"malformed request: the bytes do not parse as this call's message ({request.error})")


# What a call must pass before its handler runs; it ends the call with context.abort otherwise.
CallerCheck = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


async def _pass(context: grpc.aio.ServicerContext) -> None:
    pass


def _checked_unary(behaviour: Callable[..., Any], caller_check: CallerCheck) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await caller_check(context)
        if isinstance(request, _Malformed):
            await _refuse(request, context)
        return await behaviour(request, context)
    return call


def _checked_unary_stream(behaviour: Callable[..., AsyncIterator[Any]],
                          caller_check: CallerCheck) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await caller_check(context)
        if isinstance(request, _Malformed):
            await _refuse(request, context)
        async for item in behaviour(request, context):
            yield item
    return call


async def _parsed(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    """A request stream that ends the call at its first malformed message (the abort raises
    through the handler's read)."""
    async for request in requests:
        if isinstance(request, _Malformed):
            await _refuse(request, context)
        yield request


# grpc.aio tells the handler kinds apart by the function's type, so each needs its own wrapper.
def _checked_stream_stream(behaviour: Callable[..., AsyncIterator[Any]],
                           caller_check: CallerCheck) -> Callable[..., AsyncIterator[Any]]:
    async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await caller_check(context)
        async for item in behaviour(_parsed(requests, context), context):
            yield item
    return call


def _checked_stream_unary(behaviour: Callable[..., Awaitable[Any]],
                          caller_check: CallerCheck) -> Callable[..., Awaitable[Any]]:
    async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        await caller_check(context)
        return await behaviour(_parsed(requests, context), context)
    return call


class _Capture:
    """Stands in for the server while a generated add_*_to_server function registers handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.service = ""

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, handlers


def add_servicer(server: grpc.aio.Server, add_to_server: Callable[[Any, Any], None], servicer: Any,
                 caller_check: CallerCheck | None = None) -> None:
    """Like `add_FooServicer_to_server(servicer, server)`, with malformed requests refused, and
    every call first put to `caller_check` when one is given."""
    check = caller_check or _pass
    capture = _Capture()
    add_to_server(servicer, capture)
    checked: dict[str, grpc.RpcMethodHandler] = {}
    for name, h in capture.handlers.items():
        lenient = h._replace(request_deserializer=_lenient(h.request_deserializer),
                             response_serializer=_passing_bytes(h.response_serializer))
        if h.request_streaming and h.response_streaming:
            checked[name] = lenient._replace(stream_stream=_checked_stream_stream(h.stream_stream, check))
        elif h.request_streaming:
            checked[name] = lenient._replace(stream_unary=_checked_stream_unary(h.stream_unary, check))
        elif h.response_streaming:
            checked[name] = lenient._replace(unary_stream=_checked_unary_stream(h.unary_stream, check))
        else:
            checked[name] = lenient._replace(unary_unary=_checked_unary(h.unary_unary, check))
    # A generic handler only, no registered methods: grpc.aio's accept loop keeps one pending
    # accept per registered method and runs asyncio.wait over all of them for every call it
    # takes (a node's 13 methods: 13 done-callbacks added and removed per call). Without them
    # the leader spent 0.27 instead of 0.29 ms of CPU per linearizable get (16 clients).
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, checked),))
