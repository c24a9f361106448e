"""PeerListener: the TCP port where a node takes its peers' connections (--listen-peer), the
listening half of raft/transport/peer_protocol.py.

Each connection starts with a hello, checked before anything else is read: another cluster, a
stranger or a connection meant for another member gets one PeerHelloReply with the reason and is
closed. Then, on a MESSAGES connection, each frame is a MessageBatch whose messages must all come
from the hello's member and be addressed to this node; a batch that does not decode or does not
pass gets one Refusal frame and the connection is closed, and the node never sees any part of
it. When the hello asked for acknowledgements (ack_within_ms), an empty frame goes back on the
connection within that long of each batch received (one for all received by then). A member has
one MESSAGES connection to us at a time: when a new one from it is accepted, its older ones are
closed (with a Refusal naming the reason), so nothing sent before a dialer dialled again is
delivered after what it sent since. On a SNAPSHOT connection the header and chunks are handed to the node as they arrive (reading
pauses while the node is behind), and the node's verdict goes back as one SnapshotAck.

With peer TLS on (`tls`, raft/transport/peer_tls.py), the listener accepts each connection itself
and hands it to the event loop's connect_accepted_socket(ssl=...), which raises when the TLS
handshake fails: a plaintext dialer, or one whose certificate the trusted CA did not sign (or, with
--peer-client-cert-auth, one with no certificate), is refused and logged, and no byte it sent is
read as a frame. (create_server(ssl=...) would drop a failed handshake without a word: an SSLError
is an OSError, which asyncio logs only in debug mode. Upgrading a plain TCP transport with
start_tls loses the ClientHello on uvloop, which starts reading as soon as connection_made
returns, before a task could call start_tls.) Then a hello is taken only when the verified
certificate names the member the hello claims to come from. A dialer that presented no certificate
(possible only without --peer-client-cert-auth) is taken under the member id it claims: its
identity is then not bound, as in etcd without --peer-client-cert-auth.

The node logs a refusal and serves on: bad bytes on its peer port never stop it. A dialer refused
again and again for one reason is logged once, then at most once a minute with the count of
refusals in between (raft/transport/refusal_log.py)."""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

from google.protobuf.message import DecodeError

from raftkv_proto import raft_pb2
from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.node.ports import ClientAddresses
from raft.transport.address import socket_host
from raft.transport.codec import CodecError, from_proto, meta_from_proto
from raft.transport.frames import FrameError, FrameReader, frame
from raft.transport.peer_protocol import (
    MAX_FRAME_BYTES,
    MAX_HELLO_BYTES,
    MESSAGES,
    PROBE,
    PURPOSES,
    PeerRefused,
    RemovedMember,
    check_hello,
    configure_peer_socket,
    not_a_peer,
    parse_hello,
)
from raft.transport.peer_tls import check_names_member, check_not_revoked
from raft.transport.refusal_log import RefusalLog
from raft.transport.tls_reload import Revocations

log = logging.getLogger(__name__)

# A connection that has not sent its hello this long after it opened (after its TLS handshake, with
# peer TLS on) is closed; so is one whose TLS handshake has not ended this long after it opened.
HELLO_TIMEOUT_S = 10.0
# Connections a listening socket holds before they are accepted (asyncio's create_server default).
BACKLOG = 100
# Pause after accept() failed for want of file descriptors or memory, as asyncio's server does.
ACCEPT_RETRY_S = 1.0
# What a failed TLS handshake most often means, for the log line that reports it.
HANDSHAKE_HINT = ("a plaintext peer? one without --peer-cert-file? a certificate not signed by "
                  "--peer-trusted-ca-file?")
# Snapshot chunks read ahead of the node: reading pauses above the first, resumes at the second.
CHUNKS_AHEAD_HIGH = 4
CHUNKS_AHEAD_LOW = 1

ReceiveSnapshot = Callable[[str, int, SnapshotMeta, int, str, AsyncIterator[tuple[int, bytes, bool]]],
                           Awaitable[tuple[bool, str]]]


class PeerListener:
    """`deliver(messages)` takes an accepted batch's messages, in order, and must not block (the
    node steps them); `receive_snapshot` is raft.node.ports.Inbound's; `learnt(member, address)`
    is told each accepted dialer's advertised client address; `disk_state()` says the node's
    term and the end of its log (last term, last index), for the reply to a hello. `clock()`:
    seconds on a monotonic clock, for how often refusals are logged (default: the event loop's).
    `tls`: peer_tls.listener_context's (or ReloadingPeerTLS.listener_context's), to take only TLS
    connections (None: plaintext); `revocations`: --peer-crl-file's, whose certificates are refused."""

    def __init__(self, node_id: str, cluster_id: str, client: ClientAddresses,
                 deliver: Callable[[list[Message]], None], receive_snapshot: ReceiveSnapshot,
                 learnt: Callable[[str, ClientAddresses], None], disk_state: Callable[[], tuple[int, int, int]],
                 clock: Callable[[], float] | None = None, tls: ssl.SSLContext | None = None,
                 revocations: Revocations | None = None) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        # Members this node saw removed: their hellos are refused (RemovedMember).
        self.removed: frozenset[str] = frozenset()
        # Told the peer address a dialer announces (one the node's configuration may not name).
        self.learnt_peer: Callable[[str, str], None] = lambda member, address: None
        self.deliver = deliver
        self.receive_snapshot = receive_snapshot
        self.learnt = learnt
        self.client = client
        self.disk_state = disk_state
        self.tls = tls
        self.revocations = revocations
        self.connections: set[_Accepted] = set()
        # With TLS: the connections whose handshake is under way.
        self.handshakes: set[asyncio.Task[None]] = set()
        # Refused hellos by source: the member the hello claims to come from, else the dialer's host.
        self.refusals = RefusalLog()
        self.clock = clock if clock is not None else lambda: asyncio.get_running_loop().time()
        self._server: asyncio.AbstractServer | _TLSServer | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on host (as written: "[::1]", "" for every interface) and port (0: any free
        port); return the port bound. OSError (with the address) when it cannot be bound."""
        bind_host = socket_host(host)
        try:
            server = await (self._serve_plaintext(bind_host, port) if self.tls is None else
                            _TLSServer.bind(self, bind_host, port))
            chosen = server.sockets[0].getsockname()[1]
        except OSError as e:
            raise OSError(e.errno, f"cannot listen for peers on {host}:{port} (--listen-peer): {e.strerror}") from e
        self._server = server
        self.port = chosen
        return chosen

    async def _serve_plaintext(self, bind_host: str | None, port: int) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Accepted(self), bind_host, port)
        chosen = server.sockets[0].getsockname()[1]
        if any(s.getsockname()[1] != chosen for s in server.sockets):
            # Port 0 and a name like "localhost" gave a socket per address family, each with
            # a port of its own: make every family listen on one port.
            server.close()
            await server.wait_closed()
            server = await loop.create_server(lambda: _Accepted(self), bind_host, chosen)
        return server

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for handshake in list(self.handshakes):
            handshake.cancel()
        receiving = [c.receiving for c in self.connections if c.receiving is not None]
        for connection in list(self.connections):
            connection.close()
        for task in receiving:
            task.cancel()
        await asyncio.gather(*receiving, *self.handshakes, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def refuse_removed(self, removed: frozenset[str]) -> None:
        """The members seen removed, from now on: their hellos are refused (RemovedMember), and
        their open MESSAGES connections closed with a Refusal. A hello is checked only when a
        member dials, and on an open connection its messages would be taken in silence: a
        removed follower that held its links already would never hear that it was removed, and
        would run on. Closed, it dials again and is told."""
        self.removed = removed
        for connection in [c for c in self.connections if c.messages and c._peer in removed and not c._closing]:
            why = f"{connection._peer} was removed from this cluster: its connection is closed"
            connection._close_with(raft_pb2.Refusal(reason=why).SerializeToString())

    def note_refusal(self, source: str, peername: object, why: str) -> None:
        """Log a refused connection from `peername` (rate-limited by `source` and reason)."""
        say = self.refusals.note(source, why, self.clock())
        if say is not None:
            log.warning("refused a peer connection from %s: %s%s", peername, why, say.suffix())


def _host(peername: object) -> str:
    """The dialer's host, as the refusals are counted by it (its port changes with each dial)."""
    return str(peername[0]) if isinstance(peername, tuple) and peername else "?"


class _TLSServer:
    """The listening sockets of a listener with peer TLS on, each with a task that accepts its
    connections and a task per connection for its TLS handshake (in listener.handshakes): a
    connection whose handshake succeeds gets an _Accepted on the TLS transport; one whose
    handshake fails is refused (logged, rate-limited) and closed, none of its bytes read as a
    frame."""

    def __init__(self, listener: PeerListener, sockets: list[socket.socket]) -> None:
        self._listener = listener
        self.sockets = sockets
        loop = asyncio.get_running_loop()
        self._accepting = [loop.create_task(self._accept(s), name="raft-peer-accept") for s in sockets]

    @classmethod
    async def bind(cls, listener: PeerListener, host: str | None, port: int) -> _TLSServer:
        """A socket for each address `host` stands for (None: every interface), all on one port
        (`port`, or the one the first bind chose when it is 0), as create_server binds them."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(sockets) > 1:
                    address = (address[0], sockets[0].getsockname()[1], *address[2:])
                sock.bind(address)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        return cls(listener, sockets)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        listener = self._listener
        while True:
            try:
                connection, peername = await loop.sock_accept(sock)
            except OSError as e:  # out of file descriptors or memory: the listener serves on
                log.error("accepting a peer connection failed: %s", e)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            task = loop.create_task(self._handshake(connection, peername), name="raft-peer-tls-handshake")
            listener.handshakes.add(task)
            task.add_done_callback(listener.handshakes.discard)

    async def _handshake(self, connection: socket.socket, peername: object) -> None:
        listener = self._listener
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Accepted(listener), connection, ssl=listener.tls, ssl_handshake_timeout=HELLO_TIMEOUT_S)
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError; so is a reset. The loop closed it.
            listener.note_refusal(_host(peername), peername,
                                  f"TLS handshake failed: {str(e) or type(e).__name__} ({HANDSHAKE_HINT})")

    def close(self) -> None:
        for task in self._accepting:
            task.cancel()

    async def wait_closed(self) -> None:
        """The sockets are closed once no accept waits on them any more."""
        await asyncio.gather(*self._accepting, return_exceptions=True)
        for sock in self.sockets:
            sock.close()


class _Accepted(asyncio.Protocol):
    """One connection from a peer: its hello, then what its purpose says."""

    def __init__(self, listener: PeerListener) -> None:
        self._listener = listener
        self._reader = FrameReader(MAX_FRAME_BYTES, first_frame_bytes=MAX_HELLO_BYTES)
        self._transport: asyncio.Transport | None = None
        self._closing = False
        self._on_frame: Callable[[bytes], None] = self._hello
        self._hello_timer: asyncio.TimerHandle | None = None
        self._peer = ""  # the member on the other end, once its hello is accepted
        self.messages = False  # a MESSAGES connection, once its hello is accepted
        self._ack_within_s = 0.0  # acknowledge what arrives within this long (0: never)
        self._ack_timer: asyncio.TimerHandle | None = None
        # A snapshot connection: the node's receive task and the chunks read ahead of it.
        self.receiving: asyncio.Task[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._chunks_end: Exception | None = None  # why no more chunks will come
        self._chunk_waiter: asyncio.Future[None] | None = None
        self._paused = False

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        configure_peer_socket(transport.get_extra_info("socket"))
        self._listener.connections.add(self)
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(HELLO_TIMEOUT_S, self._refuse_hello,
                                            f"no hello within {HELLO_TIMEOUT_S:.0f} s")

    def connection_lost(self, exc: Exception | None) -> None:
        self._listener.connections.discard(self)
        self._closing = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        self._end_chunks(ConnectionResetError(f"the connection from {self._peer} closed in the middle of a "
                                              f"snapshot stream"))

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        error: FrameError | None = None
        try:
            frames = self._reader.feed(data)
        except FrameError as e:
            frames, error = e.frames, e
        for body in frames:
            self._on_frame(body)
            if self._closing:
                return
        if error is not None:
            self._bad_frame(data, error)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- the hello ---------------------------------------------------------------------------

    def _hello(self, body: bytes) -> None:
        listener = self._listener
        try:
            hello = parse_hello(body)
        except PeerRefused as e:
            self._refuse_hello(str(e), body)
            return
        try:
            check_hello(hello, listener.cluster_id, listener.node_id, listener.removed)
        except PeerRefused as e:
            self._refuse_hello(str(e), claimed=hello.from_id, removed=isinstance(e, RemovedMember))
            return
        assert self._transport is not None and self._hello_timer is not None
        peercert = self._transport.get_extra_info("peercert") if listener.tls is not None else None
        if peercert is not None:  # None with TLS: no certificate, allowed without --peer-client-cert-auth
            try:
                check_not_revoked(peercert, listener.revocations)
                check_names_member(peercert, hello.from_id, "the certificate of this connection")
            except PeerRefused as e:
                self._refuse_hello(str(e))  # counted by the dialer's address: its claim is what is false
                return
        self._hello_timer.cancel()
        self._peer = hello.from_id
        listener.refusals.forget(hello.from_id)
        if hello.client_address:
            listener.learnt(hello.from_id, ClientAddresses(hello.client_address, hello.client_http_address))
        if hello.peer_address:
            listener.learnt_peer(hello.from_id, hello.peer_address)
        term, last_term, last_index = listener.disk_state()
        reply = raft_pb2.PeerHelloReply(node_id=listener.node_id, client_address=listener.client.grpc,
                                        client_http_address=listener.client.http, term=term,
                                        last_log_term=last_term, last_log_index=last_index)
        log.debug("accepted a %s connection from %s", PURPOSES[hello.purpose], hello.from_id)
        if hello.purpose == PROBE:  # the reply was all it asked for
            self._close_with(reply.SerializeToString())
            return
        if hello.purpose == MESSAGES:
            self._on_frame = self._batch
            self.messages = True
            self._ack_within_s = hello.ack_within_ms / 1000
            if hello.ack_within_ms:
                reply.acks = True
            for older in [c for c in listener.connections if c is not self and c.messages and c._peer == self._peer
                          and not c._closing]:
                older._close_with(raft_pb2.Refusal(
                    reason=f"a newer connection from {self._peer} took this one's place: do two members run "
                           f"with id {self._peer!r}?").SerializeToString())
        else:
            self._on_frame = self._snapshot_header
        self._transport.write(frame(reply.SerializeToString()))

    def _refuse_hello(self, why: str, received: bytes = b"", claimed: str = "", removed: bool = False) -> None:
        if self._closing:
            return
        if received and why.startswith("malformed hello"):
            why = not_a_peer(received, why)
        assert self._transport is not None
        # A misconfigured member dials again every few tens of ms: not a line for each attempt.
        peername = self._transport.get_extra_info("peername")
        self._listener.note_refusal(claimed or _host(peername), peername, why)
        self._close_with(raft_pb2.PeerHelloReply(refusal=why, removed=removed).SerializeToString())

    def _bad_frame(self, received: bytes, error: FrameError) -> None:
        if self._on_frame == self._hello:
            self._refuse_hello(f"malformed hello: {error}", received)
        elif self._on_frame == self._batch:
            self._refuse_batch(f"malformed peer message: {error}")
        elif self._on_frame == self._snapshot_header:
            self._ack(False, f"malformed snapshot stream: {error}")
        else:  # the node is reading the chunks: it answers, with this reason
            self._end_chunks(ValueError(f"malformed snapshot stream: {error}"))
            self._on_frame = self._ignore

    def _log_refusal(self, why: str) -> None:
        assert self._transport is not None
        log.warning("refused a peer connection from %s: %s", self._peer or self._transport.get_extra_info("peername"),
                    why)

    def _close_with(self, reply: bytes) -> None:
        """Send the last frame and close."""
        assert self._transport is not None
        self._closing = True
        self._transport.write(frame(reply))
        self._transport.close()

    # ---- MESSAGES ----------------------------------------------------------------------------

    def _batch(self, body: bytes) -> None:
        """Every message of the batch checked and decoded, then all of them delivered."""
        peer, me = self._peer, self._listener.node_id
        try:
            messages: list[Message] = []
            for pm in raft_pb2.MessageBatch.FromString(body).messages:
                if pm.src != peer:
                    raise PeerRefused(f"a message from {pm.src!r} on the connection from {peer!r}")
                if pm.dst != me:
                    raise PeerRefused(f"message for {pm.dst!r} reached {me!r}: check --peers addresses")
                messages.append(from_proto(pm))
        except (DecodeError, CodecError) as e:
            self._refuse_batch(f"malformed peer message: {e}")
        except PeerRefused as e:
            self._refuse_batch(str(e))
        else:
            self._listener.deliver(messages)
            if self._ack_within_s and self._ack_timer is None and not self._closing:
                self._ack_timer = asyncio.get_running_loop().call_later(self._ack_within_s, self._acknowledge)

    def _acknowledge(self) -> None:
        """An empty frame: everything received on this connection so far has arrived."""
        self._ack_timer = None
        if not self._closing and self._transport is not None:
            self._transport.write(frame(b""))

    def _refuse_batch(self, why: str) -> None:
        self._log_refusal(why)
        self._close_with(raft_pb2.Refusal(reason=why).SerializeToString())

    # ---- SNAPSHOT ----------------------------------------------------------------------------

    def _snapshot_header(self, body: bytes) -> None:
        self._on_frame = self._chunk
        try:
            header = raft_pb2.SnapshotHeader.FromString(body)
        except DecodeError as e:
            log.warning("refused a snapshot stream from %s: malformed header: %s", self._peer, e)
            self._ack(False, f"malformed snapshot header: {e}")
            return
        self.receiving = asyncio.get_running_loop().create_task(self._receive(header),
                                                                name=f"raft-snapshot-from-{self._peer}")

    async def _receive(self, header: raft_pb2.SnapshotHeader) -> None:
        try:
            ok, why = await self._listener.receive_snapshot(self._peer, header.term, meta_from_proto(header.meta),
                                                            header.total_size, header.sha256, self._chunk_stream())
        except Exception as e:  # noqa: BLE001 - the dialer gets the reason, the node serves on
            ok, why = False, str(e) or type(e).__name__
        self._ack(ok, why)

    def _ack(self, ok: bool, why: str) -> None:
        """The node's verdict on the stream (the node logs a refusal), and the end of it."""
        self._on_frame = self._ignore
        if self._closing or self._transport is None:
            return
        self._close_with(raft_pb2.SnapshotAck(success=ok, message=why).SerializeToString())

    def _chunk(self, body: bytes) -> None:
        self._chunks.append(body)
        self._wake()
        if len(self._chunks) > CHUNKS_AHEAD_HIGH and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def _ignore(self, body: bytes) -> None:
        pass

    def _end_chunks(self, why: Exception) -> None:
        if self._chunks_end is None:
            self._chunks_end = why
        self._wake()

    def _wake(self) -> None:
        waiter = self._chunk_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _chunk_stream(self) -> AsyncIterator[tuple[int, bytes, bool]]:
        """The chunks as the node reads them: (offset, data, done), up to the one marked done.
        Raises when the stream breaks off or a chunk does not decode."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._chunks:
                if self._chunks_end is not None:
                    raise self._chunks_end
                self._chunk_waiter = loop.create_future()
                await self._chunk_waiter
            body = self._chunks.popleft()
            if self._paused and len(self._chunks) <= CHUNKS_AHEAD_LOW and not self._closing:
                self._paused = False
                assert self._transport is not None
                self._transport.resume_reading()
            try:
                chunk = raft_pb2.SnapshotChunk.FromString(body)
            except DecodeError as e:
                raise ValueError(f"malformed snapshot chunk: {e}") from None
            yield chunk.offset, chunk.data, chunk.done
            if chunk.done:
                return
