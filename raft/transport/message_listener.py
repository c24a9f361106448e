"""MessageListener: the TCP port where a node takes its peers' message batches.

Why not gRPC: every gRPC message crosses gRPC's poller thread and the event loop at both ends,
and writing one costs the sender about 0.1 ms under the GIL. Two Python processes exchange a
gRPC stream message in about 0.30 ms and a TCP frame on uvloop in about 0.06 ms (sixth and
seventh sessions, README "Where the time goes"). A replicated write waits for two such
messages, a linearizable read's round for two more. gRPC keeps what it is good at: the client
API, snapshots, and `Hello`, which tells a peer this listener's port.

A connection carries frames (raft/transport/frames.py), each a serialized MessageBatch from one
peer, delivered in order. Every batch is checked as the gRPC Stream call checks it
(`PeerService.check`: cluster id, sender, addressee, decodable messages). A connection whose
bytes are not frames of a MessageBatch, or whose batch is refused, gets one frame back with the
reason (UTF-8) and is closed; the node logs it once and serves on, and the core never sees any
part of the bad batch."""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable, cast

from google.protobuf.message import DecodeError

from raftkv_proto import raft_pb2
from raft.core.messages import Message
from raft.transport.address import socket_host
from raft.transport.codec import CodecError
from raft.transport.frames import FrameError, FrameReader, frame
from raft.transport.peer_transport import MAX_MESSAGE_BYTES, PeerRefused

log = logging.getLogger(__name__)

# A connection whose peer vanished without a FIN or RST (host down, cable out) is dropped after
# about this long: TCP keepalive probes an idle one, TCP_USER_TIMEOUT bounds unacknowledged data.
DEAD_PEER_TIMEOUT_S = 5


def configure_peer_socket(sock: socket.socket | None) -> None:
    """No Nagle delay (asyncio sets TCP_NODELAY already; said here so it never depends on that),
    and a dead peer noticed within DEAD_PEER_TIMEOUT_S where the platform allows."""
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", DEAD_PEER_TIMEOUT_S - 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 2),
                        ("TCP_USER_TIMEOUT", DEAD_PEER_TIMEOUT_S * 1000)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class MessageListener:
    """`check` turns a batch into its messages or raises PeerRefused / CodecError;
    `deliver` takes an accepted batch's messages and must not block (the node steps them)."""

    def __init__(self, check: Callable[[raft_pb2.MessageBatch], list[Message]],
                 deliver: Callable[[list[Message]], None], max_frame_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._check = check
        self._deliver = deliver
        self._max_frame_bytes = max_frame_bytes
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Inbound] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on host (as written: "[::1]", "" for every interface) and port (0: any free
        port); return the port bound. OSError (with the address) when it cannot be bound."""
        loop = asyncio.get_running_loop()
        bind_host = socket_host(host)
        try:
            server = await loop.create_server(lambda: _Inbound(self), bind_host, port)
            chosen = server.sockets[0].getsockname()[1]
            if any(s.getsockname()[1] != chosen for s in server.sockets):
                # A name like "localhost" gave a socket per address family, each with a port of
                # its own; Hello tells one port, so every family must listen on it.
                server.close()
                await server.wait_closed()
                server = await loop.create_server(lambda: _Inbound(self), bind_host, chosen)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen for peer messages on {host}:{port}: {e.strerror}") from e
        self._server = server
        self.port = chosen
        return chosen

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.close()
        await self._server.wait_closed()
        self._server = None


class _Inbound(asyncio.Protocol):
    """One peer's connection: frames in, batches checked and delivered."""

    def __init__(self, listener: MessageListener) -> None:
        self._listener = listener
        self._reader = FrameReader(listener._max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        configure_peer_socket(transport.get_extra_info("socket"))
        self._listener._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._listener._connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        try:
            for body in self._reader.feed(data):
                batch = raft_pb2.MessageBatch.FromString(body)
                self._listener._deliver(self._listener._check(batch))
        except (FrameError, DecodeError, CodecError) as e:
            self._refuse(f"malformed peer message: {e}")
        except PeerRefused as e:
            self._refuse(str(e))

    def _refuse(self, why: str) -> None:
        assert self._transport is not None
        log.warning("refused a peer message connection from %s: %s", self._transport.get_extra_info("peername"), why)
        self._refused = True
        self._transport.write(frame(why.encode()))
        self._transport.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
