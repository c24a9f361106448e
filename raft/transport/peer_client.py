"""Client side of the peer transport: one grpc.aio channel per peer, and on it one long-lived
client stream (RaftPeer.Stream) that carries every batch of messages to that peer, in order.

The driver loop must never wait on a peer, so `send` only queues. A pump task per peer feeds the
stream, encoding everything queued since its last write into one batch (under load several
Readies' messages share one write: fewer gRPC messages on both sides, no added latency when idle);
at most `max_inflight` sends queue per peer and messages beyond that are dropped, as are
the queued ones when the stream fails - Raft retransmits (heartbeats, push timeouts), so a drop
costs latency, never safety. Every stream carries a deadline and is ended and reopened before it
expires. Reconnect backoff is short so a healed link carries traffic again within ~100 ms."""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Sequence

import grpc

from proto import raft_pb2, raft_pb2_grpc
from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.transport.codec import meta_to_proto, to_proto
from raft.transport.peer_transport import MAX_MESSAGE_BYTES

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
    inflight: int = 0
    reachable: bool | None = None  # None until the first call ends: nothing to report yet
    dropped: int = 0
    last_refusal: str | None = None
    queue: deque[Sequence[Message]] = field(default_factory=deque)
    queued: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None
    # Set each time the pump learns whether the peer is reachable (tests and tools await it).
    checked: asyncio.Event = field(default_factory=asyncio.Event)


class PeerClient:
    """Sends core messages to peers. Create and use it on the event loop that runs the node."""

    def __init__(self, node_id: str, cluster_id: str, peers: dict[str, str], rpc_timeout_ms: int,
                 max_inflight: int = 64, on_gone: Callable[[str], None] | None = None) -> None:
        """`on_gone(peer)` is called each time a stream to `peer` fails because the connection was
        refused or reset (UNAVAILABLE): the peer's process is most likely gone."""
        self._node_id = node_id
        self._on_gone = on_gone
        self._cluster_id = cluster_id
        self._timeout_s = rpc_timeout_ms / 1000
        self._max_inflight = max_inflight
        self._links: dict[str, PeerLink] = {}
        for pid, addr in peers.items():
            if pid != node_id:
                channel = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
                self._links[pid] = PeerLink(pid, addr, channel, raft_pb2_grpc.RaftPeerStub(channel))

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
        if len(link.queue) >= self._max_inflight:
            link.dropped += len(messages)
            return
        link.queue.append(messages)
        link.queued.set()

    async def _pump(self, link: PeerLink) -> None:
        """Keep one stream open to the peer and feed it what is queued."""
        loop = asyncio.get_running_loop()
        while True:
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
                    continue  # an idle stream outlived its lifetime: open the next one, nothing lost
                if isinstance(e, grpc.aio.AioRpcError):
                    self._failed(link, e)
                else:
                    self._unreachable(link, "no answer within the call deadline")
                self._drop_queued(link)  # stale by the time the link heals; Raft resends
                link.checked.set()
                await asyncio.sleep(REOPEN_PAUSE_S)
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
            messages = [to_proto(m) for queued in sends for m in queued]
            yield raft_pb2.MessageBatch(cluster_id=self._cluster_id, from_id=self._node_id, messages=messages)

    def _drop_queued(self, link: PeerLink) -> None:
        link.dropped += sum(len(queued) for queued in link.queue)
        link.queue.clear()

    def _reachable(self, link: PeerLink) -> None:
        if link.reachable is False:
            log.info("peer %s at %s reachable again", link.peer_id, link.address)
        link.reachable = True
        link.last_refusal = None
        link.checked.set()

    def _unreachable(self, link: PeerLink, why: str) -> None:
        if link.reachable is not False:
            log.warning("peer %s at %s unreachable: %s", link.peer_id, link.address, why)
        link.reachable = False

    def _failed(self, link: PeerLink, e: grpc.aio.AioRpcError) -> None:
        if e.code() == grpc.StatusCode.UNAVAILABLE and self._on_gone is not None:
            self._on_gone(link.peer_id)
        if e.code() in _UNREACHABLE:
            self._unreachable(link, e.code().name)
            return
        # The peer answered but refused (wrong cluster id, misaddressed): a configuration problem.
        # Log each distinct refusal once, not once per heartbeat.
        refusal = f"{e.code().name}: {e.details()}"
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
