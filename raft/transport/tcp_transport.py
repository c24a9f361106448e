"""TcpTransport: the peer transport a node runs on (raft.node.ports.PeerTransport), one TCP port
per member (--listen-peer) speaking raft/transport/peer_protocol.py: the listener takes the
peers' connections (raft/transport/peer_listener.py), the links dial theirs
(raft/transport/peer_links.py), and both learn the members' advertised client addresses from the
handshakes."""
from __future__ import annotations

from collections.abc import Sequence

from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.node.config import NodeConfig
from raft.node.ports import Chunks, Inbound, SnapshotInfo
from raft.transport.address import split_address
from raft.transport.peer_links import PeerLinks
from raft.transport.peer_listener import PeerListener


class TcpTransport:
    def __init__(self, config: NodeConfig, cluster_id: str) -> None:
        config.validate_addresses()
        self._config = config
        self._cluster_id = cluster_id
        self._members = frozenset(config.members)
        # member id -> the client address it advertises: ours, and the others' once a handshake told.
        self._client_addresses = {config.node_id: config.advertised_client_address}
        self.links = PeerLinks(config.node_id, cluster_id, config.advertised_client_address, config.peers,
                               config.tuning.peer_connect_timeout_ms, learnt=self._learn)
        self.listener: PeerListener | None = None

    @property
    def peer_port(self) -> int:
        """The port the peer listener bound (0 while there is none)."""
        return self.listener.port if self.listener is not None else 0

    def _learn(self, member: str, address: str) -> None:
        if member in self._members:
            self._client_addresses[member] = address

    async def start(self, inbound: Inbound) -> None:
        config = self._config
        self.links.on_gone = inbound.peer_unreachable
        address = config.peer_listen_address
        if address is not None:
            listener = PeerListener(config.node_id, self._cluster_id, self._members, config.advertised_client_address,
                                    inbound.step, inbound.receive_snapshot, self._learn)
            await listener.start(*split_address(address))
            self.listener = listener

    def send(self, messages: Sequence[Message]) -> None:
        self.links.send(messages)

    async def send_snapshot(self, peer: str, term: int, meta: SnapshotMeta, info: SnapshotInfo,
                            chunks: Chunks, timeout_s: float) -> tuple[bool, str]:
        return await self.links.send_snapshot(peer, term, meta, info.file_size, info.sha256, chunks, timeout_s)

    def client_address(self, member: str) -> str | None:
        return self._client_addresses.get(member)

    async def close(self) -> None:
        await self.links.close()
        if self.listener is not None:
            await self.listener.close()
