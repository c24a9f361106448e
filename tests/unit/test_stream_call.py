"""kv/client/stream_call.py against a real gRPC server on 127.0.0.1 whose stream handler follows a script.
Each contract test runs on both kinds of call: driven by the caller's thread, and gRPC's public API."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from kv.client import stream_call
from kv.errors import NotLeaderError, from_rpc_error
from kv.client.stream_call import InlineStreamCall, QueuedStreamCall, open_stream_call

METHOD = "/test.Echo/Stream"
SERVER_THREADS = "echo-server"  # the in-process server's threads, which the thread count leaves out
# A script: given the request iterator and the context, yield the replies.
Script = Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]


class EchoServer:
    def __init__(self) -> None:
        self.script: Script = lambda requests, context: (b"echo:" + r for r in requests)
        self.ended = threading.Event()  # set when a handler's stream is over, however it ended

        def handle(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            context.add_callback(self.ended.set)
            yield from self.script(requests, context)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=SERVER_THREADS))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "test.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(handle)}),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


@pytest.fixture
def server() -> Iterator[EchoServer]:
    echo = EchoServer()
    yield echo
    echo.server.stop(grace=None)


@pytest.fixture
def channel(server: EchoServer) -> Iterator[grpc.Channel]:
    channel = grpc.insecure_channel(server.address)
    yield channel
    channel.close()


@pytest.fixture(params=[InlineStreamCall, QueuedStreamCall], ids=["inline", "queued"])
def kind(request) -> type:
    return request.param


def test_each_exchange_gets_the_reply_to_its_message(channel, kind):
    call = kind(channel, METHOD)
    try:
        assert [call.exchange(m) for m in (b"a", b"b", b"c")] == [b"echo:a", b"echo:b", b"echo:c"]
    finally:
        call.close()


def test_a_stream_the_server_ended_with_ok_gives_none(server, channel, kind):
    def one_reply(requests, context):
        next(requests)
        yield b"only"

    server.script = one_reply
    call = kind(channel, METHOD)
    try:
        assert call.exchange(b"first") == b"only"
        assert call.exchange(b"second") is None
        assert call.exchange(b"third") is None  # still over, still OK
    finally:
        call.close()


def test_a_refusal_raises_with_its_status_and_trailing_metadata(server, channel, kind):
    refusal = NotLeaderError("n2", "127.0.0.1:7002")

    def refuse(requests, context):
        next(requests)
        context.set_trailing_metadata(refusal.metadata())
        context.abort(refusal.code, str(refusal))
        yield b"never"

    server.script = refuse
    call = kind(channel, METHOD)
    try:
        with pytest.raises(grpc.RpcError) as raised:
            call.exchange(b"put")
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        error = from_rpc_error(raised.value)
        assert isinstance(error, NotLeaderError) and error.leader_address == "127.0.0.1:7002"
        with pytest.raises(grpc.RpcError):  # the call is over: it stays failed
            call.exchange(b"again")
    finally:
        call.close()


def test_cancel_from_another_thread_ends_a_waiting_exchange(server, channel, kind):
    received, release = threading.Event(), threading.Event()

    def never_answer(requests, context):
        next(requests)
        received.set()
        release.wait(10)
        return
        yield

    server.script = never_answer
    call = kind(channel, METHOD)
    canceller = threading.Thread(target=lambda: received.wait(10) and call.cancel())
    canceller.start()
    try:
        with pytest.raises(grpc.RpcError) as raised:
            call.exchange(b"waits")
        assert raised.value.code() == grpc.StatusCode.CANCELLED
    finally:
        release.set()
        canceller.join()
        call.close()


def test_closing_an_idle_call_ends_it_on_the_server(server, channel, kind):
    call = kind(channel, METHOD)
    assert call.exchange(b"a") == b"echo:a"
    call.close()
    assert server.ended.wait(5)


def test_an_inline_call_wakes_no_grpc_thread(channel):
    """The point of InlineStreamCall: the caller's thread does the whole exchange. gRPC's public
    API starts a thread for the requests and a spin thread for the channel (the contrast below
    shows this test can tell them apart)."""
    def client_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if not t.name.startswith(SERVER_THREADS)}

    before = client_threads()
    inline = InlineStreamCall(channel, METHOD)
    for m in (b"a", b"b", b"c"):
        assert inline.exchange(m) == b"echo:" + m
    assert client_threads() - before == set()
    inline.close()
    queued = QueuedStreamCall(channel, METHOD)
    try:
        assert queued.exchange(b"a") == b"echo:a"
        assert client_threads() - before != set()
    finally:
        queued.close()


def test_open_stream_call_falls_back_to_the_public_api(channel, monkeypatch):
    def changed_internals(*args: object) -> None:
        raise AttributeError("'Channel' object has no attribute 'segregated_call'")

    monkeypatch.setattr(stream_call, "_inline_works", True)
    first = open_stream_call(channel, METHOD)
    assert isinstance(first, InlineStreamCall)
    first.close()
    monkeypatch.setattr(stream_call, "InlineStreamCall", changed_internals)
    fallback = open_stream_call(channel, METHOD)
    try:
        assert isinstance(fallback, QueuedStreamCall)
        assert fallback.exchange(b"a") == b"echo:a"
        assert stream_call._inline_works is False  # asked once, not at every stream
    finally:
        fallback.close()
