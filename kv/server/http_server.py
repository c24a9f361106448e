"""The one HTTP/1.1 server a node runs, on its own event loop, for whatever it serves over HTTP: the
metrics listener (--listen-metrics-urls, kv/server/http_endpoints.py) and etcd's JSON gateway
(--listen-client-http-urls, kv/server/etcd_gateway.py). Each gives it a handler; this module
does the connections.

h11 parses requests and frames responses (sans-I/O); the I/O is asyncio streams:

- keep-alive: a connection serves requests one after the other for as long as the client keeps
  it (Go's server, which etcd's gateway runs on, closes no idle connection either);
- a request body is read as it arrives (`HttpRequest.body_chunks`), so a handler can answer a
  long-lived stream (etcd's watch) while the client is still sending it requests;
- a response body is bytes (sent with Content-Length) or an async iterator of chunks, each sent
  and flushed as it comes (chunked transfer encoding);
- a client that goes away ends its request: once the body is read, the connection is watched
  for the client's close, and the handler is cancelled then (a watch ends with its client);
- HTTP/2 passthrough (`relay_to`): a plaintext connection that opens with HTTP/2's preface is a
  gRPC client; its bytes are relayed both ways, unread, to the member's gRPC port, so that one
  URL serves both, as etcd's client URL does. The gRPC port itself is not touched."""
from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from http import HTTPStatus

import h11

from raft.transport.address import split_address

log = logging.getLogger(__name__)

# A request line and headers larger than this are refused (431).
MAX_HEAD_BYTES = 64 << 10
READ_BYTES = 64 << 10
# The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names in lower case; a repeated header's values joined by ", "
    _chunks: AsyncIterator[bytes]
    peer: str = ""  # the client's address, host:port
    certificate_name: str = ""  # the common name of the client's verified certificate (TLS)

    def body_chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (read at most once)."""
        return self._chunks

    async def body(self, limit: int) -> bytes | None:
        """The whole body; None when it is larger than `limit` (the rest is not read)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self._chunks:
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
        return b"".join(parts)


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes | AsyncIterator[bytes]  # an iterator: sent chunked, each chunk flushed as it comes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def text_response(status: int, text: str, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    """A plain-text answer, as Go's http.Error writes one (the text and a newline)."""
    return HttpResponse(status, f"{text}\n".encode(), "text/plain; charset=utf-8",
                        [("X-Content-Type-Options", "nosniff"), *(headers or [])])


class HttpServer:
    """Serves `handler` on each of `listeners` (host, port), with TLS when `ssl_context` is given;
    `relay_to` (host:port) takes plaintext HTTP/2 connections. `flag` names the option that
    configured the listeners, for errors. `refuse_certificate(peercert)`: why a TLS connection
    with that verified client certificate is closed unanswered (a revoked one), None to serve it."""

    def __init__(self, flag: str, listeners: list[tuple[str, int]], handler: Handler,
                 ssl_context: ssl.SSLContext | None = None, relay_to: Callable[[], str] | None = None,
                 refuse_certificate: Callable[[dict[str, Any] | None], str | None] | None = None) -> None:
        self._flag = flag
        self._listeners = listeners
        self._handler = handler
        self._ssl = ssl_context
        self._relay_to = relay_to
        self._refuse_certificate = refuse_certificate
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for host, port in self._listeners:
            try:
                self._servers.append(await asyncio.start_server(self._connection, host, port, ssl=self._ssl,
                                                                limit=READ_BYTES))
            except OSError as e:
                await self.stop()
                raise OSError(e.errno, f"cannot serve HTTP on {host}:{port} ({self._flag}): {e.strerror}") from None

    @property
    def addresses(self) -> list[str]:
        """host:port of each listener (the bound port, when 0 was asked)."""
        return [f"{s.sockets[0].getsockname()[0]}:{s.sockets[0].getsockname()[1]}" for s in self._servers]

    async def stop(self) -> None:
        """Stop listening and end every connection (an open watch included)."""
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if self._refused(writer):
                return
            first = await _sniff(reader) if self._relay_to is not None and self._ssl is None else b""
            if first.startswith(HTTP2_PREFACE):
                assert self._relay_to is not None
                await _relay(first, reader, writer, self._relay_to())
            else:
                await _Connection(reader, writer, self._handler).serve(first)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass  # the server stops
        except Exception:  # noqa: BLE001 - one connection's failure must not end the server
            log.exception("HTTP connection failed")
        finally:
            self._connections.discard(task)
            writer.close()


    def _refused(self, writer: asyncio.StreamWriter) -> bool:
        why = self._refuse_certificate(writer.get_extra_info("peercert")) if self._refuse_certificate else None
        if why is not None:
            peer = writer.get_extra_info("peername")
            log.info("%s: connection from %s refused: %s", self._flag, peer[0] if isinstance(peer, tuple) else "?",
                     why)
        return why is not None


async def _sniff(reader: asyncio.StreamReader) -> bytes:
    """The connection's first bytes: as many as it takes to tell HTTP/2's preface from anything else."""
    data = b""
    while len(data) < len(HTTP2_PREFACE) and HTTP2_PREFACE.startswith(data):
        more = await reader.read(len(HTTP2_PREFACE) - len(data))
        if not more:
            break
        data += more
    return data


async def _relay(first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str) -> None:
    """Relay the connection byte for byte to `address` until either side ends it."""
    host, port = split_address(address)
    up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), port)
    up_writer.write(first)

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(READ_BYTES):
            sink.write(data)
            await sink.drain()

    pipes = [asyncio.create_task(pipe(reader, up_writer)), asyncio.create_task(pipe(up_reader, writer))]
    try:
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        up_writer.close()


class _Connection:
    """One client connection: its requests, one after the other."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._body_read = asyncio.Event()
        peer = writer.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self._certificate_name = _common_name(writer.get_extra_info("peercert"))

    async def serve(self, first: bytes) -> None:
        if first:
            self._h11.receive_data(first)
        while True:
            try:
                event = await self._next_event()
            except h11.RemoteProtocolError as e:
                await self._refuse(e)
                return
            if not isinstance(event, h11.Request):
                return  # the client closed (ConnectionClosed) or sent what cannot start a request
            if not await self._answer(event):
                return
            self._take_arrived_body()
            if self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
                return  # a body left unread, or either side asked to close: not reused
            self._h11.start_next_cycle()

    def _take_arrived_body(self) -> None:
        """Take what has arrived of a body the handler did not read: a request with none (GET
        /version, etcd3gw's and Patroni's first) ends there, and the connection serves the client's
        next request, as the client expects (it was sent no Connection: close)."""
        while isinstance(self._h11.next_event(), h11.Data):
            pass

    async def _next_event(self) -> object:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._h11.receive_data(await self._reader.read(READ_BYTES))

    async def _body(self) -> AsyncIterator[bytes]:
        try:
            if self._h11.they_are_waiting_for_100_continue:  # curl's Expect: 100-continue
                await self._send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            while True:
                event = await self._next_event()
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    return
                else:  # the client closed mid-body
                    raise ConnectionResetError("the client closed its connection in the middle of a request")
        finally:
            self._body_read.set()

    async def _answer(self, event: h11.Request) -> bool:
        """Run the handler and send its response; False when the connection is done."""
        target = event.target.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self._body_read.clear()
        request = HttpRequest(event.method.decode("ascii"), path, query, headers, self._body(), self._peer,
                              self._certificate_name)
        respond = asyncio.create_task(self._respond(request))
        closed = asyncio.create_task(self._watch_for_close(respond))
        try:
            return await respond
        except asyncio.CancelledError:
            if not respond.cancelled():
                raise
            return False  # the client went away
        finally:
            # Both end before the connection reads again: one reader of the stream at a time.
            closed.cancel()
            respond.cancel()
            await asyncio.gather(closed, respond, return_exceptions=True)

    async def _respond(self, request: HttpRequest) -> bool:
        response = await self._handler(request)
        headers = [("Content-Type", response.content_type), *response.headers]
        if isinstance(response.body, bytes):
            headers.append(("Content-Length", str(len(response.body))))
        await self._send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
        if isinstance(response.body, bytes):
            await self._send(h11.Data(data=response.body))
        else:
            async for chunk in response.body:
                await self._send(h11.Data(data=chunk))
        await self._send(h11.EndOfMessage())
        return True

    async def _watch_for_close(self, respond: asyncio.Task[bool]) -> None:
        """Once the request's body is read, the client's next bytes are its next request (kept
        for h11) or the end of the connection, which ends `respond`."""
        await self._body_read.wait()
        while data := await self._reader.read(READ_BYTES):
            self._h11.receive_data(data)
        respond.cancel()

    async def _send(self, event: object) -> None:
        data = self._h11.send(event)
        if data:
            self._writer.write(data)
            await self._writer.drain()

    async def _refuse(self, error: h11.RemoteProtocolError) -> None:
        """Answer a request h11 could not parse (400, or 431 for too large a head) and close."""
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status = error.error_status_hint
        body = b"431 Request Header Fields Too Large" if status == 431 else b"400 Bad Request"
        await self._send(h11.Response(status_code=status, reason=_reason(status), headers=[
            ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
            ("Connection", "close")]))
        await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _common_name(certificate: dict | None) -> str:
    """The subject's common name in a verified peer certificate (ssl's dict form), else ""."""
    for attributes in (certificate or {}).get("subject", ()):
        for name, value in attributes:
            if name == "commonName":
                return str(value)
    return ""
