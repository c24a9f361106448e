"""Client side of the peer transport: per peer, one connection that carries every batch of
messages to it, in order, and one grpc.aio channel for the rest (Hello, snapshots).

By default (`peer_transport="tcp"`) a link asks the peer with the gRPC `Hello` call where it takes
message connections, then writes each batch as a frame on a plain TCP connection to that port
(raft/transport/message_listener.py says why). With `peer_transport="grpc"`, or when the peer
answers port 0, the batches go on a long-lived gRPC client stream (RaftPeer.Stream) instead; a
stream carries a deadline and is ended and reopened before it expires.

The driver loop must never wait on a peer, so `send` never blocks: on an open TCP connection it
writes the batch at once; otherwise a pump task per peer connects and feeds the link, merging
everything queued since its last write into one batch. At most `max_inflight` sends queue per
peer and messages beyond that are dropped, as are the queued ones when the link fails and those
that would overfill a TCP connection's send buffer - Raft retransmits (heartbeats, push
timeouts), so a drop costs latency, never safety. Reconnect backoff is short so a healed link
carries traffic again within ~100 ms."""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Sequence, cast

import grpc

from raftkv_proto import raft_pb2, raft_pb2_grpc
from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.transport.address import socket_host, split_address
from raft.transport.codec import meta_to_proto, to_proto
from raft.transport.frames import FrameError, FrameReader, frame
from raft.transport.message_listener import configure_peer_socket
from raft.transport.peer_transport import MAX_MESSAGE_BYTES, PeerRefused

log = logging.getLogger(__name__)

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    # gRPC's default reconnect backoff starts at 1 s and grows to 120 s: far too slow for Raft.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
    # Keepalive notices a silently dead connection (peer host gone) without waiting for TCP.
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Raft retransmits by itself; gRPC's transparent retries would only add duplicates.
    ("grpc.enable_retries", 0),
]

# A peer is "unreachable" for these codes; others (refusals) mean it is up but disagrees with us.
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}

# A stream is ended cleanly after this long and a new one opened; its deadline is a little longer.
STREAM_LIFETIME_S = 30.0
STREAM_DEADLINE_S = STREAM_LIFETIME_S + 10.0
# Most queued sends merged into one stream write.
MAX_SENDS_PER_WRITE = 16
# Pause before reopening a stream that failed (gRPC's own reconnect backoff comes on top).
REOPEN_PAUSE_S = 0.05
# A TCP connection holding this much unsent data takes no more batches until it drains (they are
# dropped): its peer is not reading, and Raft resends what still matters once it does.
MAX_BUFFERED_BYTES = 16 << 20


@dataclass(slots=True)
class _Feed:
    """One stream's claim on its link's queue. gRPC keeps pulling from a call's request iterator
    after the call has failed (cancel() is a no-op on a finished call, so its consumer task lives
    on) and drops what it pulls: a failed stream's feed must be closed, or every failed reconnect
    attempt leaves a consumer that swallows one later batch (during a 2 s outage, about 40)."""

    closed: bool = False


@dataclass(slots=True)
class PeerLink:
    peer_id: str
    address: str
    channel: grpc.aio.Channel
    stub: raft_pb2_grpc.RaftPeerStub
    reachable: bool | None = None  # None until the first call ends: nothing to report yet
    dropped: int = 0
    last_refusal: str | None = None
    queue: deque[Sequence[Message]] = field(default_factory=deque)
    queued: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None
    # Where to open the TCP message connection, when configured (else asked by Hello).
    message_address: str | None = None
    # The open TCP message connection, once the queue is flushed into it: send() writes there.
    connection: _Outbound | None = None
    # The peer's Hello said it reads PushRequest.packed_entries (asked again on each reconnect).
    packed: bool = False
    # Set each time the pump learns whether the peer is reachable (tests and tools await it).
    checked: asyncio.Event = field(default_factory=asyncio.Event)


class PeerClient:
    """Sends core messages to peers. Create and use it on the event loop that runs the node."""

    def __init__(self, node_id: str, cluster_id: str, peers: dict[str, str], rpc_timeout_ms: int,
                 max_inflight: int = 64, on_gone: Callable[[str], None] | None = None,
                 peer_transport: str = "tcp", message_addresses: dict[str, str] | None = None) -> None:
        """`on_gone(peer)` is called each time a link to `peer` fails because the connection was
        refused, reset or closed without a reason: the peer's process is most likely gone.
        `message_addresses`: where to open the TCP message connection of the peers named (else
        the host of the peer's address and the port its Hello tells)."""
        if peer_transport not in ("tcp", "grpc"):
            raise ValueError(f"peer transport must be tcp or grpc, not {peer_transport!r}")
        self._tcp = peer_transport == "tcp"
        self._node_id = node_id
        self._on_gone = on_gone
        self._cluster_id = cluster_id
        self._timeout_s = rpc_timeout_ms / 1000
        self._max_inflight = max_inflight
        self._links: dict[str, PeerLink] = {}
        for pid, addr in peers.items():
            if pid != node_id:
                channel = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
                self._links[pid] = PeerLink(pid, addr, channel, raft_pb2_grpc.RaftPeerStub(channel),
                                            message_address=(message_addresses or {}).get(pid))

    def reachable(self, peer_id: str) -> bool | None:
        return self._links[peer_id].reachable

    def dropped(self, peer_id: str) -> int:
        return self._links[peer_id].dropped

    def send(self, messages: Sequence[Message]) -> None:
        """Queue the messages on their destinations' streams; return at once."""
        by_dst: dict[str, list[Message]] = {}
        for m in messages:
            by_dst.setdefault(m.dst, []).append(m)
        for dst, batch in by_dst.items():
            link = self._links.get(dst)
            if link is None:
                log.error("dropping %d message(s) for %r: not a peer of %r", len(batch), dst, self._node_id)
                continue
            self._start(link, batch)

    def _start(self, link: PeerLink, messages: list[Message]) -> None:
        if link.pump is None:
            link.pump = asyncio.get_running_loop().create_task(self._pump(link), name=f"raft-stream-{link.peer_id}")
        if link.connection is not None:  # the queue is empty while a connection is open
            if not link.connection.write(self._frame([messages], link.packed)):
                link.dropped += len(messages)
            return
        if len(link.queue) >= self._max_inflight:
            link.dropped += len(messages)
            return
        link.queue.append(messages)
        link.queued.set()

    async def _pump(self, link: PeerLink) -> None:
        """Keep the link connected and fed: over TCP where the peer offers a port, else a stream."""
        while True:
            try:
                port = await self._hello(link) if self._tcp else 0
                if port:
                    await self._tcp_session(link, port)
                else:
                    await self._stream_session(link)
                    continue  # the stream outlived its lifetime: open the next one, nothing lost
            except grpc.aio.AioRpcError as e:
                self._failed(link, e)
            except asyncio.TimeoutError:
                self._unreachable(link, "no answer within the call deadline")
            except PeerRefused as e:  # the peer closed our message connection and said why
                self._refused(link, str(e))
            except OSError as e:  # refused, reset, or closed by a peer that gave no reason
                if self._on_gone is not None:
                    self._on_gone(link.peer_id)
                self._unreachable(link, str(e) or type(e).__name__)
            self._drop_queued(link)  # stale by the time the link heals; Raft resends
            link.checked.set()
            await asyncio.sleep(REOPEN_PAUSE_S)

    async def _hello(self, link: PeerLink) -> int:
        """Ask the peer where it takes message connections (0: on the Stream call only) and
        note whether it reads packed entries."""
        hello = raft_pb2.HelloRequest(cluster_id=self._cluster_id, from_id=self._node_id)
        link.packed = False
        try:
            reply = await link.stub.Hello(hello, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return 0  # a node from before Hello: it takes streams
            raise
        link.packed = reply.packed_entries
        return reply.message_port

    async def _tcp_session(self, link: PeerLink, port: int) -> None:
        """Connect, flush what queued meanwhile, then let send() write directly until the
        connection ends (always by an exception)."""
        loop = asyncio.get_running_loop()
        connection = _Outbound(loop)
        if link.message_address is not None:
            host, port = split_address(link.message_address)
        else:
            host = split_address(link.address)[0]
        try:
            await asyncio.wait_for(loop.create_connection(lambda: connection, socket_host(host), port),
                                   self._timeout_s)
            self._reachable(link)
            while link.queue:
                sends = [link.queue.popleft() for _ in range(min(len(link.queue), MAX_SENDS_PER_WRITE))]
                if not connection.write(self._frame(sends, link.packed)):
                    link.dropped += sum(len(queued) for queued in sends)
            link.connection = connection
            await connection.closed
        finally:
            link.connection = None
            connection.abort()
        if connection.refusal is not None:
            raise PeerRefused(connection.refusal)
        raise ConnectionResetError(f"connection closed: {connection.closed.result() or 'by the peer'}")

    def _frame(self, sends: Sequence[Sequence[Message]], packed: bool) -> bytes:
        batch = raft_pb2.MessageBatch(cluster_id=self._cluster_id, from_id=self._node_id,
                                      messages=[to_proto(m, packed) for queued in sends for m in queued])
        return frame(batch.SerializeToString())

    async def _stream_session(self, link: PeerLink) -> None:
        """One gRPC stream, fed until it fails (raises) or outlives its lifetime (returns)."""
        loop = asyncio.get_running_loop()
        opened = loop.time()
        feed = _Feed()
        call = link.stub.Stream(self._batches(link, feed), timeout=STREAM_DEADLINE_S)
        try:
            try:
                # A peer that accepts TCP but never speaks (stopped, hung) must not hold us
                # for the stream's whole deadline: give connecting the deadline of one call.
                await asyncio.wait_for(call.wait_for_connection(), self._timeout_s)
                self._reachable(link)
                await call
            finally:
                feed.closed = True
                link.queued.set()  # wake a stale consumer so it sees its feed closed and ends
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as e:
            call.cancel()
            if (isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    and loop.time() - opened >= STREAM_LIFETIME_S):
                return
            raise
        except asyncio.CancelledError:
            call.cancel()
            raise

    async def _batches(self, link: PeerLink, feed: _Feed) -> AsyncIterator[raft_pb2.MessageBatch]:
        """What the stream carries, while its feed is open. It ends itself (cleanly, nothing in
        flight is lost) once it is STREAM_LIFETIME_S old; heartbeats keep it from idling long past
        that."""
        loop = asyncio.get_running_loop()
        ends = loop.time() + STREAM_LIFETIME_S
        while loop.time() < ends:
            while not link.queue:
                if feed.closed:
                    return
                link.queued.clear()
                await link.queued.wait()
            if feed.closed:
                return
            # Each queued send holds at most max_batch_bytes of entries, so a write stays far
            # below MAX_MESSAGE_BYTES.
            sends = [link.queue.popleft() for _ in range(min(len(link.queue), MAX_SENDS_PER_WRITE))]
            messages = [to_proto(m, link.packed) for queued in sends for m in queued]
            yield raft_pb2.MessageBatch(cluster_id=self._cluster_id, from_id=self._node_id, messages=messages)

    def _drop_queued(self, link: PeerLink) -> None:
        link.dropped += sum(len(queued) for queued in link.queue)
        link.queue.clear()

    def _reachable(self, link: PeerLink) -> None:
        if link.reachable is False:
            log.info("peer %s at %s reachable again", link.peer_id, link.address)
        link.reachable = True
        link.checked.set()

    def _unreachable(self, link: PeerLink, why: str) -> None:
        if link.reachable is not False:
            log.warning("peer %s at %s unreachable: %s", link.peer_id, link.address, why)
        link.reachable = False
        # A refusal is logged once while it repeats (the link reconnects and is refused again
        # every REOPEN_PAUSE_S); a peer that went away and refuses again is logged again.
        link.last_refusal = None

    def _failed(self, link: PeerLink, e: grpc.aio.AioRpcError) -> None:
        if e.code() == grpc.StatusCode.UNAVAILABLE and self._on_gone is not None:
            self._on_gone(link.peer_id)
        if e.code() in _UNREACHABLE:
            self._unreachable(link, e.code().name)
            return
        self._refused(link, f"{e.code().name}: {e.details()}")

    def _refused(self, link: PeerLink, refusal: str) -> None:
        # The peer answered but refused (wrong cluster id, misaddressed): a configuration problem.
        # Log each distinct refusal once, not once per heartbeat.
        if refusal != link.last_refusal:
            log.error("peer %s at %s refused our messages: %s", link.peer_id, link.address, refusal)
            link.last_refusal = refusal

    async def send_snapshot(self, peer_id: str, term: int, meta: SnapshotMeta, total_size: int, sha256: str,
                            chunks: AsyncIterator[tuple[int, bytes, bool]], timeout_s: float) -> tuple[bool, str]:
        """Stream a snapshot file to a peer (client streaming). Returns (success, why not)."""
        link = self._links[peer_id]

        async def requests() -> AsyncIterator[raft_pb2.SnapshotChunk]:
            header = dict(cluster_id=self._cluster_id, from_id=self._node_id, term=term, total_size=total_size,
                          sha256=sha256, meta=meta_to_proto(meta))
            async for offset, data, done in chunks:
                yield raft_pb2.SnapshotChunk(offset=offset, data=data, done=done, **header)  # type: ignore[arg-type]

        try:
            ack = await link.stub.InstallSnapshot(requests(), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            return False, f"{e.code().name}: {e.details()}"
        return ack.success, ack.message

    async def close(self) -> None:
        pending = [link.pump for link in self._links.values() if link.pump is not None]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for link in self._links.values():
            await link.channel.close()
        await asyncio.sleep(0)  # let the cancelled streams' request generators finish on this loop


class _Outbound(asyncio.Protocol):
    """Our end of a TCP message connection. Nothing flows back but, at most, one frame: why the
    peer closes the connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.closed: asyncio.Future[Exception | None] = loop.create_future()
        self.refusal: str | None = None
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader(64 << 10)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        configure_peer_socket(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError:
            frames = [b"an unreadable reason"]
        if frames and self.refusal is None:
            self.refusal = frames[0].decode(errors="replace")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    def write(self, data: bytes) -> bool:
        """Queue the bytes on the connection; False (nothing written) when it is closing or its
        peer has left MAX_BUFFERED_BYTES unread."""
        t = self._transport
        if t is None or t.is_closing() or t.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            return False
        t.write(data)
        return True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
