"""NetworkTransport: the peer transport a node runs on (raft.node.ports.PeerTransport), made of the
message listener (TCP), the peer client and the RaftPeer gRPC service (Hello, snapshots)."""
from __future__ import annotations

from typing import Sequence

from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.node.config import NodeConfig
from raft.node.ports import Chunks, Inbound, SnapshotInfo
from raft.transport.address import split_address
from raft.transport.message_listener import MessageListener
from raft.transport.peer_client import PeerClient
from raft.transport.peer_transport import PeerService


class NetworkTransport:
    def __init__(self, config: NodeConfig, cluster_id: str) -> None:
        self._config = config
        self._cluster_id = cluster_id
        self._inbound: Inbound | None = None
        self._client: PeerClient | None = None
        self._listener: MessageListener | None = None
        # Added to the node's gRPC server by its owner (kv/server/server.py).
        self.service = PeerService(config.node_id, cluster_id, config.members, self._deliver, snapshots=self,
                                   message_port=lambda: self.message_port)

    @property
    def message_port(self) -> int:
        return self._listener.port if self._listener is not None else 0

    def _deliver(self, messages: list[Message]) -> None:
        if self._inbound is not None:
            self._inbound.step(messages)

    async def receive_snapshot(self, leader: str, term: int, meta: SnapshotMeta, total_size: int, sha256: str,
                               chunks: Chunks) -> tuple[bool, str]:
        if self._inbound is None:
            return False, "the node is not started"
        return await self._inbound.receive_snapshot(leader, term, meta, total_size, sha256, chunks)

    async def start(self, inbound: Inbound) -> None:
        config = self._config
        if config.peer_transport == "tcp" and len(config.members) > 1:
            listener = MessageListener(self.service.check, self._deliver)
            await listener.start(split_address(config.listen)[0], config.peer_port)
            self._listener = listener
        self._inbound = inbound
        self._client = PeerClient(config.node_id, self._cluster_id, config.peers, config.rpc_timeout_ms,
                                  on_gone=inbound.peer_unreachable, peer_transport=config.peer_transport,
                                  message_addresses=config.peer_message_addresses)

    def send(self, messages: Sequence[Message]) -> None:
        assert self._client is not None
        self._client.send(messages)

    async def send_snapshot(self, peer: str, term: int, meta: SnapshotMeta, info: SnapshotInfo,
                            chunks: Chunks, timeout_s: float) -> tuple[bool, str]:
        assert self._client is not None
        return await self._client.send_snapshot(peer, term, meta, info.file_size, info.sha256, chunks, timeout_s)

    def client_address(self, member: str) -> str | None:
        return self._config.peers.get(member)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._listener is not None:
            await self._listener.close()
