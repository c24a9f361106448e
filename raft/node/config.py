"""Everything a running node is configured with, in one typed place with documented defaults.
`raftkv serve` flags map one to one onto these fields."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raft.core.config import CoreConfig
from raft.transport.address import split_address

DEFAULT_LISTEN = "127.0.0.1:7001"
DEFAULT_DATA_DIR = "./raftkv-data"
DEFAULT_NODE_ID = "n1"
# The event loops a node process can run on (`raftkv serve --event-loop`); "auto": uvloop if installed.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# How a node sends Raft messages to its peers (`raftkv serve --peer-transport`).
PEER_TRANSPORTS = ("tcp", "grpc")


@dataclass(slots=True)
class NodeConfig:
    node_id: str = DEFAULT_NODE_ID
    # Where this node binds its gRPC services (peer, client, export).
    listen: str = DEFAULT_LISTEN
    # grpc.aio servers sharing `listen` (SO_REUSEPORT). Each accepts one call at a time, so with
    # many client connections more servers take calls in faster (kv/server/server_group.py).
    grpc_servers: int = 8
    # member id -> address where this node reaches it (may differ from the member's --listen, e.g.
    # through a proxy). Must include this node. Empty means a single-node cluster of just us.
    peers: dict[str, str] = field(default_factory=dict)
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    # Peers refuse messages carrying another cluster id. Generated on first start and kept in the
    # data directory; set it explicitly for a multi-node cluster started from scratch (every
    # member must agree), or leave it None and the members agree on a hash of the member list.
    cluster_id: str | None = None
    core: CoreConfig = field(default_factory=CoreConfig)
    # Tick period of the driver: how often the core learns the time.
    tick_interval_ms: int = 10
    # Largest value a client may write; LMDB's own limit on keys is 511 bytes.
    max_value_bytes: int = 1 << 20
    max_key_bytes: int = 511
    # On a busy leader, hold a linearizable read up to this long before it joins a ReadIndex
    # round, when at least read_hold_siblings other reads are waiting, so one round serves more
    # reads (raft/node/read_hold.py). 0 turns it off; a lone reader is never held. Since clients
    # send on streams a round takes about 0.5 ms, and a 2 ms hold cost 8 readers 20% (README).
    read_hold_ms: float = 1.0
    read_hold_siblings: int = 4
    # While a lone linearizable read waits for its round, and this long after it is served, the
    # leader's event loop polls instead of sleeping (raft/node/loop_spin.py): on a VM each
    # wake-up costs tens of µs. It burns up to two such spans of one core per lone read; 0: off.
    read_spin_us: int = 500
    # Client requests waiting for commit or a read round, beyond which new ones get RESOURCE_EXHAUSTED.
    max_pending_requests: int = 10_000
    # How message batches travel to peers: "tcp" (framed protobuf on a plain TCP connection to
    # the peer's message port, learnt by a gRPC Hello) or "grpc" (a gRPC stream per peer: one
    # port per node, at about five times the cost per message; raft/transport/message_listener.py).
    peer_transport: str = "tcp"
    # Where this node takes peers' message connections, on --listen's host: 0 picks a free port
    # (peers learn it by Hello). Set it where a firewall or proxy must know the port in advance.
    peer_port: int = 0
    # member id -> where this node sends it messages on the TCP transport, for members reached
    # through a proxy or NAT that forwards their --peer-port too. Members not named here are
    # reached at the host of their `peers` address and the port their Hello tells.
    peer_message_addresses: dict[str, str] = field(default_factory=dict)
    # Every peer RPC carries this deadline.
    rpc_timeout_ms: int = 1000
    # The most space the log may take on disk, and the state's LMDB map size (a sparse file that
    # costs nothing until used).
    log_map_size: int = 8 << 30
    state_map_size: int = 8 << 30
    # fsync the log before acknowledging (never turn off outside benchmarks of the difference).
    fsync: bool = True
    # Take a snapshot after this many applied entries, or after this many bytes of applied
    # payload, whichever comes first (`raftkv serve --snapshot-threshold` sets the entry count).
    snapshot_threshold: int = 100_000
    snapshot_threshold_bytes: int = 256 << 20
    # Entries kept in the log behind a snapshot, so a slightly slow follower catches up by APPEND
    # rather than a full install. Capped at half the threshold.
    snapshot_trailing_entries: int = 10_000
    # Snapshot streams to followers: chunk size and bandwidth cap (bytes/s; 0 = unthrottled).
    snapshot_chunk_bytes: int = 1 << 20
    snapshot_bandwidth_bytes_per_s: int = 128 << 20
    # Snapshot files kept on disk (the newest is the one sent to followers).
    snapshots_kept: int = 2

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not self.peers:
            self.peers = {self.node_id: self.listen}
        if self.node_id not in self.peers:
            raise ValueError(f"--peers must name this node ({self.node_id!r}); it names {sorted(self.peers)}")
        if self.grpc_servers < 1:
            raise ValueError("--grpc-servers must be at least 1")
        if self.read_hold_ms < 0 or self.read_hold_siblings < 0:
            raise ValueError("--read-hold-ms and --read-hold-siblings cannot be negative")
        if self.read_spin_us < 0:
            raise ValueError("--read-spin-us cannot be negative")
        if self.peer_transport not in PEER_TRANSPORTS:
            raise ValueError(f"--peer-transport must be tcp or grpc, not {self.peer_transport!r}")
        if not 0 <= self.peer_port <= 65535:
            raise ValueError(f"--peer-port must be a port number (0 for any free one), not {self.peer_port}")
        strangers = sorted(set(self.peer_message_addresses) - set(self.peers))
        if strangers:
            raise ValueError(f"--peer-message-addresses names {strangers}, which --peers does not")
        for member, address in self.peer_message_addresses.items():
            try:
                split_address(address)
            except ValueError as e:
                raise ValueError(f"--peer-message-addresses: {member}: {e}") from None
        if self.snapshot_threshold < 1:
            raise ValueError("--snapshot-threshold must be at least 1")
        if self.max_key_bytes > 511:
            raise ValueError("max_key_bytes cannot exceed LMDB's limit of 511 bytes")

    @property
    def members(self) -> list[str]:
        return sorted(self.peers)

    @property
    def trailing_entries(self) -> int:
        return min(self.snapshot_trailing_entries, self.snapshot_threshold // 2)


def parse_peers(spec: str) -> dict[str, str]:
    """Parse "n1=127.0.0.1:7001,n2=127.0.0.1:7002" into {"n1": "127.0.0.1:7001", ...}."""
    peers: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, addr = part.partition("=")
        if not sep or not name or ":" not in addr:
            raise ValueError(f"bad peer {part!r}: expected id=host:port, e.g. n1=127.0.0.1:7001")
        if name in peers:
            raise ValueError(f"peer {name!r} named twice")
        peers[name] = addr
    return peers
