"""Server side of the peer transport: the RaftPeer gRPC servicer (message batches by gRPC,
snapshots, and Hello, which tells a peer the port of this node's MessageListener).

Send checks who is talking before anything reaches the core: a batch from another cluster, from
a member this node does not know, or addressed to another node is refused with FAILED_PRECONDITION
(a message a person can act on); a message that does not decode is refused with INVALID_ARGUMENT.
A refused batch is dropped whole, so the core never sees half of one."""
from __future__ import annotations

import logging
from typing import AsyncIterator, Callable, Collection, Protocol

import grpc

from raftkv_proto import raft_pb2, raft_pb2_grpc
from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.transport.codec import CodecError, from_proto, meta_from_proto

log = logging.getLogger(__name__)

# Largest message either side accepts: a push carries up to max_batch_bytes of entries (1 MiB by
# default) and a batch may hold several pushes.
MAX_MESSAGE_BYTES = 64 << 20

# Options for the node's grpc.aio servers: accept the peers' keepalive pings (without these a
# server answers frequent pings with GOAWAY "too_many_pings") and large batches. (kv/server/server_group.py
# adds SO_REUSEPORT, with its own check that no other process listens on the port.)
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
]


class SnapshotSink(Protocol):
    """Where an InstallSnapshot stream goes: the node (raft.node.ports.Inbound)."""

    async def receive_snapshot(self, leader: str, term: int, meta: SnapshotMeta, total_size: int,
                               sha256: str, chunks: AsyncIterator[tuple[int, bytes, bool]]) -> tuple[bool, str]: ...


class PeerRefused(Exception):
    """Why a batch was refused; becomes the status message."""


class PeerService(raft_pb2_grpc.RaftPeerServicer):
    """`deliver` takes the decoded messages of an accepted batch (in order) and must not block:
    the node steps them into its core on the event loop."""

    def __init__(self, node_id: str, cluster_id: str, members: Collection[str],
                 deliver: Callable[[list[Message]], None], snapshots: SnapshotSink | None = None,
                 message_port: Callable[[], int] = lambda: 0) -> None:
        """`message_port()`: where this node's MessageListener listens (0: it has none, peers
        send on the Stream call)."""
        self._message_port = message_port
        self._node_id = node_id
        self._cluster_id = cluster_id
        self._members = frozenset(members)
        self._deliver = deliver
        self._snapshots = snapshots

    def check(self, batch: raft_pb2.MessageBatch) -> list[Message]:
        """The batch's messages, or PeerRefused."""
        self._check_sender(batch.cluster_id, batch.from_id)
        out: list[Message] = []
        for pm in batch.messages:
            if pm.src != batch.from_id:
                raise PeerRefused(f"unknown member id: message from {pm.src!r} in a batch from {batch.from_id!r}")
            if pm.dst != self._node_id:
                raise PeerRefused(f"message for {pm.dst!r} reached {self._node_id!r}: check --peers addresses")
            out.append(from_proto(pm))
        return out

    async def Send(self, request: raft_pb2.MessageBatch, context: grpc.aio.ServicerContext) -> raft_pb2.SendAck:
        await self._accept(request, context)
        return raft_pb2.SendAck()

    async def Stream(self, request_iterator: AsyncIterator[raft_pb2.MessageBatch],
                     context: grpc.aio.ServicerContext) -> raft_pb2.SendAck:
        """Batches on a long-lived stream from one peer, each checked and delivered as Send does."""
        async for batch in request_iterator:
            await self._accept(batch, context)
        return raft_pb2.SendAck()

    async def Hello(self, request: raft_pb2.HelloRequest, context: grpc.aio.ServicerContext) -> raft_pb2.HelloReply:
        try:
            self._check_sender(request.cluster_id, request.from_id)
        except PeerRefused as e:
            log.warning("refused a hello from %r: %s", request.from_id, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return raft_pb2.HelloReply(message_port=self._message_port(), packed_entries=True)

    async def _accept(self, batch: raft_pb2.MessageBatch, context: grpc.aio.ServicerContext) -> None:
        """Deliver the batch's messages, or end the call with the reason it is refused."""
        try:
            messages = self.check(batch)
        except PeerRefused as e:
            log.warning("refused peer batch from %r: %s", batch.from_id, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except CodecError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed peer message: {e}")
        self._deliver(messages)

    async def InstallSnapshot(self, request_iterator: AsyncIterator[raft_pb2.SnapshotChunk],
                              context: grpc.aio.ServicerContext) -> raft_pb2.SnapshotAck:
        """A snapshot file streamed by the leader, handed to the node chunk by chunk (it writes,
        verifies and installs it). Nothing is held in memory beyond one chunk."""
        if self._snapshots is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this node takes no snapshots")
        first = await anext(request_iterator, None)
        if first is None:
            return raft_pb2.SnapshotAck(success=False, message="an empty snapshot stream")
        try:
            self._check_sender(first.cluster_id, first.from_id)
        except PeerRefused as e:
            log.warning("refused a snapshot stream: %s", e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))

        async def chunks() -> AsyncIterator[tuple[int, bytes, bool]]:
            chunk: raft_pb2.SnapshotChunk | None = first
            while chunk is not None:
                if chunk.term != first.term:
                    raise PeerRefused("the term changed in the middle of a snapshot stream")
                yield chunk.offset, chunk.data, chunk.done
                if chunk.done:
                    return
                chunk = await anext(request_iterator, None)

        assert self._snapshots is not None
        ok, why = await self._snapshots.receive_snapshot(first.from_id, first.term, meta_from_proto(first.meta),
                                                         first.total_size, first.sha256, chunks())
        return raft_pb2.SnapshotAck(success=ok, message=why)

    def _check_sender(self, cluster_id: str, from_id: str) -> None:
        if cluster_id != self._cluster_id:
            raise PeerRefused(f"wrong cluster id: got {cluster_id!r}, this cluster is {self._cluster_id!r}")
        if from_id not in self._members:
            raise PeerRefused(f"unknown member id {from_id!r}; members are {sorted(self._members)}")
