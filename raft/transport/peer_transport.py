"""Server side of the peer transport: the RaftPeer gRPC servicer.

Send checks who is talking before anything reaches the core: a batch from another cluster, from
a member this node does not know, or addressed to another node is refused with FAILED_PRECONDITION
(a message a person can act on); a message that does not decode is refused with INVALID_ARGUMENT.
A refused batch is dropped whole, so the core never sees half of one."""
from __future__ import annotations

import logging
from typing import Callable, Collection

import grpc

from proto import raft_pb2, raft_pb2_grpc
from raft.core.messages import Message
from raft.transport.codec import CodecError, from_proto

log = logging.getLogger(__name__)

# Largest message either side accepts: a push carries up to max_batch_bytes of entries (1 MiB by
# default) and a batch may hold several pushes.
MAX_MESSAGE_BYTES = 64 << 20

# Options for the node's one grpc.aio server: accept the peers' keepalive pings (without these a
# server answers frequent pings with GOAWAY "too_many_pings") and large batches.
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    # gRPC sets SO_REUSEPORT by default on Linux, so a second node on the same port would bind
    # too and the kernel would split connections between them; refuse to start instead.
    ("grpc.so_reuseport", 0),
]


class PeerRefused(Exception):
    """Why a batch was refused; becomes the status message."""


class PeerService(raft_pb2_grpc.RaftPeerServicer):
    """`deliver` takes the decoded messages of an accepted batch (in order) and must not block:
    the node steps them into its core on the event loop."""

    def __init__(self, node_id: str, cluster_id: str, members: Collection[str],
                 deliver: Callable[[list[Message]], None]) -> None:
        self._node_id = node_id
        self._cluster_id = cluster_id
        self._members = frozenset(members)
        self._deliver = deliver

    def check(self, batch: raft_pb2.MessageBatch) -> list[Message]:
        """The batch's messages, or PeerRefused."""
        if batch.cluster_id != self._cluster_id:
            raise PeerRefused(f"wrong cluster id: got {batch.cluster_id!r}, this cluster is {self._cluster_id!r}")
        if batch.from_id not in self._members:
            raise PeerRefused(f"unknown member id {batch.from_id!r}; members are {sorted(self._members)}")
        out: list[Message] = []
        for pm in batch.messages:
            if pm.src != batch.from_id:
                raise PeerRefused(f"unknown member id: message from {pm.src!r} in a batch from {batch.from_id!r}")
            if pm.dst != self._node_id:
                raise PeerRefused(f"message for {pm.dst!r} reached {self._node_id!r}: check --peers addresses")
            out.append(from_proto(pm))
        return out

    async def Send(self, request: raft_pb2.MessageBatch, context: grpc.aio.ServicerContext) -> raft_pb2.SendAck:
        try:
            messages = self.check(request)
        except PeerRefused as e:
            log.warning("refused peer batch from %r: %s", request.from_id, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except CodecError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed peer message: {e}")
        self._deliver(messages)
        return raft_pb2.SendAck()

    async def InstallSnapshot(self, request_iterator: object, context: grpc.aio.ServicerContext) -> raft_pb2.SnapshotAck:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "InstallSnapshot comes with snapshots")
        raise AssertionError("unreachable: abort raises")
