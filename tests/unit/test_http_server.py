"""The node's HTTP/1.1 server (kv/server/http_server.py) on loopback sockets: requests one after
the other on a kept connection, a body read as it arrives and a chunked answer sent as it comes,
the handler's end when its client goes away, a malformed request refused, and a connection that
opens with HTTP/2's preface relayed byte for byte."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kv.server.http_server import HTTP2_PREFACE, HttpRequest, HttpResponse, HttpServer

DEADLINE_S = 5.0


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)


def test_requests_follow_each_other_on_one_connection() -> None:
    async def handler(request: HttpRequest) -> HttpResponse:
        body = await request.body(1 << 10)
        return HttpResponse(200, f"{request.method} {request.path} {body!r}".encode(), "text/plain")

    async def run() -> list[bytes]:
        server = HttpServer("test", [("127.0.0.1", 0)], handler)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.addresses[0].split(":"))
            answers = []
            for body in (b"one", b"two!"):
                writer.write(b"POST /x?q=1 HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                head = await _read_head(reader)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                answers.append(head.split(b"\r\n")[0] + b" " + await reader.readexactly(length))
            writer.close()
            return answers
        finally:
            await server.stop()
    assert asyncio.run(run()) == [b"HTTP/1.1 200 OK POST /x b'one'", b"HTTP/1.1 200 OK POST /x b'two!'"]


def test_a_streamed_body_is_answered_chunk_by_chunk_while_it_arrives_and_a_gone_client_ends_the_handler() -> None:
    async def run() -> tuple[list[bytes], bool]:
        handler_ended = asyncio.Event()

        async def handler(request: HttpRequest) -> HttpResponse:
            async def echo() -> AsyncIterator[bytes]:
                try:
                    async for chunk in request.body_chunks():
                        yield b"got " + chunk
                    await asyncio.Event().wait()  # a watch: open until its client goes
                finally:
                    handler_ended.set()
            return HttpResponse(200, echo())

        server = HttpServer("test", [("127.0.0.1", 0)], handler)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.addresses[0].split(":"))
            writer.write(b"POST /watch HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await _read_head(reader)
            seen = [await asyncio.wait_for(reader.readuntil(b"got abc\r\n"), DEADLINE_S)]
            writer.write(b"2\r\nde\r\n")  # the answer to the first came before the second was sent
            seen.append(await asyncio.wait_for(reader.readuntil(b"got de\r\n"), DEADLINE_S))
            writer.write(b"0\r\n\r\n")
            writer.close()
            await asyncio.wait_for(handler_ended.wait(), DEADLINE_S)
            return seen, handler_ended.is_set()
        finally:
            await server.stop()
    seen, handler_ended = asyncio.run(run())
    assert seen == [b"7\r\ngot abc\r\n", b"6\r\ngot de\r\n"] and handler_ended


def test_a_request_that_does_not_parse_is_refused() -> None:
    async def handler(request: HttpRequest) -> HttpResponse:
        raise AssertionError("never called")

    async def run() -> bytes:
        server = HttpServer("test", [("127.0.0.1", 0)], handler)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.addresses[0].split(":"))
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            return (await _read_head(reader)).split(b"\r\n")[0]
        finally:
            await server.stop()
    assert asyncio.run(run()) == b"HTTP/1.1 400 Bad Request"


def test_an_http2_connection_is_relayed_byte_for_byte() -> None:
    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, b"http/1.1")

    async def run() -> tuple[bytes, bytes]:
        received = asyncio.Queue[bytes]()

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            data = await reader.readexactly(len(HTTP2_PREFACE) + 5)
            await received.put(data)
            writer.write(b"settings" + data[-5:])
            await writer.drain()
            writer.close()

        grpc_port = await asyncio.start_server(upstream, "127.0.0.1", 0)
        address = "127.0.0.1:%d" % grpc_port.sockets[0].getsockname()[1]
        server = HttpServer("test", [("127.0.0.1", 0)], handler, relay_to=lambda: address)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.addresses[0].split(":"))
            writer.write(HTTP2_PREFACE[:5])  # the preface may come in pieces
            await writer.drain()
            writer.write(HTTP2_PREFACE[5:] + b"hello")
            answer = await asyncio.wait_for(reader.readexactly(13), DEADLINE_S)
            return await asyncio.wait_for(received.get(), DEADLINE_S), answer
        finally:
            await server.stop()
            grpc_port.close()
    sent, answer = asyncio.run(run())
    assert sent == HTTP2_PREFACE + b"hello" and answer == b"settingshello"
