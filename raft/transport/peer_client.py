"""Client side of the peer transport: one grpc.aio channel per peer, fire-and-forget sends.

The driver loop must never wait on a peer, so `send` only starts calls. Each call carries a
deadline; at most `max_inflight` calls per peer are outstanding and messages beyond that are
dropped - Raft retransmits (heartbeats, push timeouts), so a drop costs latency, never safety.
Reconnect backoff is short so a healed link carries traffic again within ~100 ms."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

import grpc

from proto import raft_pb2, raft_pb2_grpc
from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.transport.codec import to_proto
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


@dataclass(slots=True)
class PeerLink:
    peer_id: str
    address: str
    channel: grpc.aio.Channel
    stub: raft_pb2_grpc.RaftPeerStub
    inflight: int = 0
    reachable: bool | None = None  # None until the first call ends: nothing to report yet
    dropped: int = 0
    sent: int = 0
    last_refusal: str | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class PeerClient:
    """Sends core messages to peers. Create and use it on the event loop that runs the node."""

    def __init__(self, node_id: str, cluster_id: str, peers: dict[str, str], rpc_timeout_ms: int,
                 max_inflight: int = 64) -> None:
        self._node_id = node_id
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
        """Start one Send call per destination; return at once."""
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
        if link.inflight >= self._max_inflight:
            link.dropped += len(messages)
            return
        request = raft_pb2.MessageBatch(cluster_id=self._cluster_id, from_id=self._node_id,
                                        messages=[to_proto(m) for m in messages])
        link.inflight += 1
        task = asyncio.get_running_loop().create_task(self._call(link, request))
        link.tasks.add(task)
        task.add_done_callback(link.tasks.discard)

    async def _call(self, link: PeerLink, request: raft_pb2.MessageBatch) -> None:
        try:
            await link.stub.Send(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            self._failed(link, e)
        else:
            link.sent += 1
            if link.reachable is False:
                log.info("peer %s at %s reachable again", link.peer_id, link.address)
            link.reachable = True
            link.last_refusal = None
        finally:
            link.inflight -= 1

    def _failed(self, link: PeerLink, e: grpc.aio.AioRpcError) -> None:
        if e.code() in _UNREACHABLE:
            if link.reachable is not False:
                log.warning("peer %s at %s unreachable: %s", link.peer_id, link.address, e.code().name)
            link.reachable = False
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
                          sha256=sha256, meta=raft_pb2.SnapshotMeta(index=meta.index, term=meta.term,
                                                                     members=list(meta.members)))
            async for offset, data, done in chunks:
                yield raft_pb2.SnapshotChunk(offset=offset, data=data, done=done, **header)  # type: ignore[arg-type]

        try:
            ack = await link.stub.InstallSnapshot(requests(), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            return False, f"{e.code().name}: {e.details()}"
        return ack.success, ack.message

    async def close(self) -> None:
        for link in self._links.values():
            for t in list(link.tasks):
                t.cancel()
            await link.channel.close()
