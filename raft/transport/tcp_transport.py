"""TcpTransport: the peer transport a node runs on (raft.node.ports.PeerTransport), one TCP port
per member (--listen-peer) speaking raft/transport/peer_protocol.py: the listener takes the
peers' connections (raft/transport/peer_listener.py), the links dial theirs
(raft/transport/peer_links.py), and both learn the members' advertised client addresses from the
handshakes. With config.security.peer set (--peer-cert-file ...), both halves speak mutual TLS
(raft/transport/peer_tls.py).

Once started, the transport times a round trip to each peer every ROUND_TRIP_EVERY_S
(PeerLinks.time_round_trips: a PROBE hello and its answer, on the peer path), for
etcd_network_peer_round_trip_time_seconds (`round_trip_seconds()`)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from raft.core.messages import Message
from raft.core.types import SnapshotMeta
from raft.node.config import NodeConfig
from raft.node.ports import Chunks, ClientAddresses, Inbound, SnapshotInfo
from raft.node.stats import Histogram
from raft.transport.address import LONE_PEER_PORT_OFFSET, split_address
from raft.transport.peer_links import PeerLinks
from raft.transport.peer_listener import PeerListener
from raft.transport.peer_tls import ReloadingPeerTLS, peer_revocations

log = logging.getLogger(__name__)

# How often each member times a round trip to each peer. etcd's rafthttp probes every 4 s and
# records its smoothed round trip every 30 s; raftkv records every probe's own.
ROUND_TRIP_EVERY_S = 5.0


class TcpTransport:
    """`disk_state()`: the node's term and the end of its log (last term, last index), as the log
    store says; a hello's reply tells them (peer_protocol.py's PROBE). `round_trip_every_s`: how
    often, once started, a round trip to each peer is timed."""

    def __init__(self, config: NodeConfig, cluster_id: str, disk_state: Callable[[], tuple[int, int, int]],
                 round_trip_every_s: float = ROUND_TRIP_EVERY_S) -> None:
        config.validate_addresses()
        self._config = config
        self._cluster_id = cluster_id
        self._disk_state = disk_state
        self._round_trip_every_s = round_trip_every_s
        self._inbound: Inbound | None = None
        self._removed: frozenset[str] = frozenset()
        # member id -> where it takes clients: ours, and the others' once a handshake told.
        own = ClientAddresses(config.advertised_client_address, config.advertised_client_http_address or "")
        self._client_addresses = {config.node_id: own}
        tls = config.security.peer
        reloading = ReloadingPeerTLS(tls) if tls.enabled else None
        self._listener_tls = reloading.listener_context() if reloading is not None else None
        self._revocations = peer_revocations(tls)
        self.links = PeerLinks(config.node_id, cluster_id, own, config.peers,
                               config.tuning.peer_connect_timeout_ms, learnt=self._learn,
                               ack_timeout_ms=2 * config.core.election_timeout_ms,
                               tls=reloading.dial_context if reloading is not None else None,
                               peer_address=config.peer_listen_address or "")
        self.listener: PeerListener | None = None
        self._growing: asyncio.Task[None] | None = None  # listen_grown, from reconfigure

    @property
    def peer_port(self) -> int:
        """The port the peer listener bound (0 while there is none)."""
        return self.listener.port if self.listener is not None else 0

    def _learn(self, member: str, addresses: ClientAddresses) -> None:
        if member not in self._removed:
            self._client_addresses[member] = addresses

    def _learn_peer(self, member: str, address: str) -> None:
        """A dialer announced its peer address: a member our configuration does not name yet
        gets a link there (ours may lag the cluster's), as etcd adds a remote from X-PeerURLs."""
        if member not in self._removed and self.links.add_peer(member, address):
            log.info("peer %s at %s: a member this node's configuration does not name yet", member, address)

    def reconfigure(self, addresses: Mapping[str, str], removed: Collection[str]) -> None:
        """The members' peer addresses (member -> address, as the node resolves them: a link to
        each, moved when its address changed) and the members seen removed (refused from now on)."""
        for member, address in addresses.items():
            if not self.links.add_peer(member, address):
                self.links.move_peer(member, address)
        own = addresses.get(self._config.node_id)
        if own and len(addresses) > 1 and self.listener is None and self._growing is None:
            # A member started alone whose configuration names others (it grew, and restarted).
            self._growing = asyncio.get_running_loop().create_task(self._listen_grown_logged(own),
                                                                   name="raft-peer-listen")
        self._removed = frozenset(removed)
        for member in self._removed:
            self._client_addresses.pop(member, None)
        if self.listener is not None:
            self.listener.refuse_removed(self._removed)

    @property
    def peer_address(self) -> str:
        """Where the other members reach this node: its --peers entry, else --listen-peer, else (a
        member started alone, with neither) its client host and client port + LONE_PEER_PORT_OFFSET
        (7001 -> 7101), where it listens once it has peers (`listen_grown`)."""
        config = self._config
        given = config.peers.get(config.node_id) or config.listen_peer
        if given:
            return given
        host, _ = split_address(config.advertised_client_address)
        return f"{host}:{split_address(config.listen)[1] + LONE_PEER_PORT_OFFSET}"

    async def listen_grown(self, address: str) -> None:
        """A member started alone has peers now: take their connections on `address`'s port (on
        --listen's host), unless it does already. OSError when it cannot bind."""
        if self.listener is None:
            await self.listen(f"{split_address(self._config.listen)[0]}:{split_address(address)[1]}")
            self.links.peer_address = address

    async def listen(self, address: str | None = None) -> None:
        """Start taking the peers' connections (at `address`, else at this node's peer address if
        it has one), before the node itself starts when it must first ask its peers whether the
        cluster is new (what arrives meanwhile is dropped; a hello is answered)."""
        address = address or self._config.peer_listen_address
        if address is None or self.listener is not None:
            return
        config = self._config
        listener = PeerListener(config.node_id, self._cluster_id, self._client_addresses[config.node_id],
                                self._deliver, self._receive_snapshot, self._learn, self._disk_state,
                                tls=self._listener_tls, revocations=self._revocations)
        listener.removed = self._removed
        listener.learnt_peer = self._learn_peer
        await listener.start(*split_address(address))
        self.listener = listener
        tls = config.security.peer
        if tls.enabled:
            log.info("peer port %s: mutual TLS with certificate %s, the other members' checked against %s%s",
                     address, tls.cert_file, tls.trusted_ca_file,
                     "" if tls.client_cert_auth else " when they present one (no --peer-client-cert-auth: "
                                                     "a member that presents none is taken at its word)")
            if tls.crl_file is not None:
                log.info("peer port %s: a member whose certificate %s revokes is refused", address, tls.crl_file)

    async def _listen_grown_logged(self, address: str) -> None:
        try:
            await self.listen_grown(address)
        except OSError as e:
            log.error("%s cannot take its peers' connections at %s (%s): restart it with --listen-peer HOST:PORT",
                      self._config.node_id, address, e)

    async def start(self, inbound: Inbound) -> None:
        self.links.on_gone = inbound.peer_unreachable
        self.links.on_removed = inbound.removed_from_cluster
        self._inbound = inbound
        await self.listen()
        self.links.time_round_trips(self._round_trip_every_s)

    def _deliver(self, messages: list[Message]) -> None:
        if self._inbound is not None:
            self._inbound.step(messages)

    async def _receive_snapshot(self, leader: str, term: int, meta: SnapshotMeta, total_size: int, sha256: str,
                                chunks: Chunks) -> tuple[bool, str]:
        if self._inbound is None:
            return False, "the node is not started yet"
        return await self._inbound.receive_snapshot(leader, term, meta, total_size, sha256, chunks)

    async def probe(self) -> dict[str, tuple[int, int, int]]:
        """Each answering peer's term and the end of its log (PeerLinks.probe)."""
        return await self.links.probe()

    def send(self, messages: Sequence[Message]) -> None:
        self.links.send(messages)

    async def send_snapshot(self, peer: str, term: int, meta: SnapshotMeta, info: SnapshotInfo,
                            chunks: Chunks, timeout_s: float) -> tuple[bool, str]:
        return await self.links.send_snapshot(peer, term, meta, info.file_size, info.sha256, chunks, timeout_s)

    def client_address(self, member: str) -> str | None:
        addresses = self._client_addresses.get(member)
        return addresses.grpc if addresses is not None else None

    def client_http_address(self, member: str) -> str | None:
        addresses = self._client_addresses.get(member)
        return addresses.http or None if addresses is not None else None

    def round_trip_seconds(self) -> dict[str, Histogram]:
        """Peer -> the seconds of the round trips timed to it (every peer; read at scrape time)."""
        return self.links.round_trip_seconds()

    async def close(self) -> None:
        await self.links.close()
        if self.listener is not None:
            await self.listener.close()
