"""Everything a running node is configured with, in typed layers with documented defaults
(docs/tuning.md says when to change each). `raftkv serve`'s flags set these fields."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from raft.core.config import CoreConfig
from raft.node.cluster_id import DEFAULT_CLUSTER_TOKEN
from raft.transport.address import split_address
from raftkv_proto.request_limits import DEFAULT_MAX_REQUEST_BYTES, MIN_MAX_REQUEST_BYTES, smallest_request_limit

DEFAULT_LISTEN = "127.0.0.1:7001"
DEFAULT_DATA_DIR = "./raftkv-data"
DEFAULT_NODE_ID = "n1"
# The event loops a node process can run on (`raftkv serve --event-loop`); "auto": uvloop if installed.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# Hosts that bind every interface: no client can be told to connect there.
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


@dataclass(slots=True)
class StorageConfig:
    """The disk: durability, sizes, snapshots and compaction."""

    # fsync the log before acknowledging (never turn off outside benchmarks of the difference).
    fsync: bool = True
    # The most space the log may take on disk, and the state's LMDB map size (a sparse file that
    # costs nothing until used): past either, writes are refused as DISK_FULL.
    log_max_bytes: int = 8 << 30
    state_max_bytes: int = 8 << 30
    # etcd's --quota-backend-bytes: past this many bytes in use in the state, the leader raises a
    # NOSPACE alarm and the cluster refuses puts until it is disarmed (kv/server/alarm_watch.py).
    # 0: the state's map size (state_max_bytes), where writes are refused anyway.
    quota_backend_bytes: int = 0
    # New writes are refused as DISK_FULL while less than this is free on the data directory's
    # file system: room for the next log segment (64 MiB) and for entries already committed to
    # reach the state, so a disk that fills never leaves committed entries it cannot apply (and
    # linearizable reads waiting on them). 0: no check (a full disk is met by the write itself).
    reserve_free_bytes: int = 64 << 20
    # Take a snapshot after this many applied entries, or after this many bytes of applied
    # payload, whichever comes first (`raftkv serve --snapshot-threshold` sets the entry count).
    snapshot_threshold: int = 100_000
    snapshot_threshold_bytes: int = 256 << 20
    # Entries kept in the log behind a snapshot, so a slightly slow follower catches up by APPEND
    # rather than a full install. Capped at half the threshold.
    snapshot_trailing_entries: int = 10_000
    # Snapshot files kept on disk (the newest is the one sent to followers).
    snapshots_kept: int = 2
    # How often the leader asks every member to hash its state at one log index and the members
    # compare (kv/server/state_check.py). Each check reads the whole state once. 0: never.
    state_check_interval_s: float = 300.0
    # The history of older key versions kept (kv/server/auto_compaction.py; etcd's flags): in
    # "periodic" mode, seconds of it; in "revision" mode, revisions. 0: kept until a Compact.
    auto_compaction_mode: str = "periodic"
    auto_compaction_retention: float = 3600.0
    # How often the leader checkpoints the remaining TTL of leases longer than this through the
    # log, so that a new leader counts them from there (kv/server/lessor.py; etcd's
    # --experimental-lease-checkpoint-interval, 5 minutes). 0: never (a new leader counts every
    # lease from its whole TTL).
    lease_checkpoint_interval_s: float = 300.0

    def __post_init__(self) -> None:
        if self.snapshot_threshold < 1:
            raise ValueError("snapshot_threshold must be at least 1")
        if self.snapshots_kept < 1:
            raise ValueError("snapshots_kept must be at least 1")
        for name in ("log_max_bytes", "state_max_bytes"):
            if getattr(self, name) < 1 << 20:
                raise ValueError(f"{name} must be at least 1MiB, got {getattr(self, name)}")
        if not 0 <= self.quota_backend_bytes <= self.state_max_bytes:
            raise ValueError(f"quota_backend_bytes must be between 0 and state_max_bytes ({self.state_max_bytes}), "
                             f"got {self.quota_backend_bytes}")
        if self.reserve_free_bytes < 0:
            raise ValueError("reserve_free_bytes must not be negative")
        if self.state_check_interval_s < 0:
            raise ValueError("state_check_interval_s must not be negative")
        if self.auto_compaction_mode not in ("periodic", "revision"):
            raise ValueError(f"auto_compaction_mode must be periodic or revision, got {self.auto_compaction_mode!r}")
        if self.auto_compaction_retention < 0:
            raise ValueError("auto_compaction_retention must not be negative")
        if self.lease_checkpoint_interval_s < 0:
            raise ValueError("lease_checkpoint_interval_s must not be negative")

    @property
    def trailing_entries(self) -> int:
        return min(self.snapshot_trailing_entries, self.snapshot_threshold // 2)



@dataclass(slots=True)
class Limits:
    """What a node accepts from clients."""

    # Largest value and key a client may write. The store's own key limit
    # (statemachine/commands.py MAX_KEY_BYTES, 32 KiB) caps a larger max_key_bytes.
    max_value_bytes: int = 1 << 20
    max_key_bytes: int = 32 << 10
    # Client requests waiting for commit or a read round, beyond which new ones get RESOURCE_EXHAUSTED.
    max_pending_requests: int = 10_000
    # Largest message a client may send (gRPC's max_receive_message_length on the client port):
    # gRPC refuses a larger one before it is built, so a client cannot make the node hold more.
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        if self.max_key_bytes < 1:
            raise ValueError("max_key_bytes must be at least 1")
        if self.max_value_bytes < 1 or self.max_pending_requests < 1:
            raise ValueError("max_value_bytes and max_pending_requests must be at least 1")
        if self.max_request_bytes < MIN_MAX_REQUEST_BYTES:
            raise ValueError(f"max_request_bytes must be at least {MIN_MAX_REQUEST_BYTES} (1 MiB), "
                             f"not {self.max_request_bytes}: clients gather requests into messages of up to that much")
        # A value that cannot travel in a request could never be written: refuse the pair now
        # rather than every such put later.
        needed = smallest_request_limit(self.max_value_bytes, self.max_key_bytes)
        if self.max_request_bytes < needed:
            raise ValueError(
                f"max_value_bytes {self.max_value_bytes} does not fit in max_request_bytes {self.max_request_bytes}: "
                f"a put of the largest key and value takes up to {needed} bytes; raise max_request_bytes to "
                f"at least {needed} or lower max_value_bytes")


@dataclass(slots=True)
class Tuning:
    """How a node uses its machine: settings whose best value depends on the machine, not on the
    cluster (docs/tuning.md says what each trades; `raftkv serve --help-tuning` lists the flags)."""

    # grpc.aio servers sharing `listen` (SO_REUSEPORT). Each accepts one call at a time, so with
    # many client connections more servers take calls in faster (kv/server/server_group.py).
    grpc_servers: int = 8
    # On a busy leader, hold a linearizable read up to this long before it joins a ReadIndex
    # round, when at least read_hold_siblings other reads are waiting, so one round serves more
    # reads (raft/node/read_hold.py). 0 turns it off; a lone reader is never held.
    read_hold_ms: float = 1.0
    read_hold_siblings: int = 4
    # While a lone linearizable read waits for its round, and this long after it is served, the
    # leader's event loop polls instead of sleeping (raft/node/loop_spin.py): on a VM each
    # wake-up costs tens of µs. It burns up to two such spans of one core per lone read; 0: off.
    read_spin_us: int = 500
    # A follower that saves or applies more entries than this at once first lets the other
    # runnable processes on its CPU go (sched_yield), and again after every this many applied:
    # on a busy machine the processes on a write's path then run before a lazy follower's batch
    # (raft/node/giving_way.py). 0: never. Leaders never yield.
    follower_yield_entries: int = 8
    # Tick period of the driver: how often the core learns the time.
    tick_interval_ms: int = 10
    # How long a peer gets to accept a connection and answer its hello.
    peer_connect_timeout_ms: int = 1000
    # Snapshot streams to followers: chunk size and bandwidth cap (bytes/s; 0 = unthrottled).
    snapshot_chunk_bytes: int = 1 << 20
    snapshot_bandwidth_bytes_per_s: int = 128 << 20

    def __post_init__(self) -> None:
        if self.grpc_servers < 1:
            raise ValueError("grpc_servers must be at least 1")
        if min(self.read_hold_ms, self.read_hold_siblings, self.read_spin_us, self.follower_yield_entries) < 0:
            raise ValueError("read_hold_ms, read_hold_siblings, read_spin_us and follower_yield_entries cannot be "
                             "negative")
        if self.tick_interval_ms < 1 or self.peer_connect_timeout_ms < 1 or self.snapshot_chunk_bytes < 1:
            raise ValueError("tick_interval_ms, peer_connect_timeout_ms and snapshot_chunk_bytes must be at least 1")


@dataclass(slots=True, frozen=True)
class TLSFiles:
    """The PEM files of one TLS port, as etcd's flags name them (--cert-file, --key-file,
    --trusted-ca-file, --client-cert-auth, --client-crl-file; the peer port's carry a --peer-
    prefix). No cert_file: the port speaks plaintext. Each file is read again when it changes
    (raft/transport/tls_reload.py)."""

    cert_file: Path | None = None
    key_file: Path | None = None
    # The CA that signs the certificates this port accepts from the other side (and, on the peer
    # port, the CA that signed the other members' certificates when this node dials them).
    trusted_ca_file: Path | None = None
    # Require a client certificate signed by trusted_ca_file from whoever connects.
    client_cert_auth: bool = False
    # A certificate revocation list (PEM or DER): a connection whose certificate's serial it lists
    # is refused on this port (etcd's --client-crl-file / --peer-crl-file).
    crl_file: Path | None = None

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "trusted_ca_file", "crl_file"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))

    def check(self, prefix: str = "") -> None:
        """ValueError, naming the field (with `prefix`: "peer_"), unless the files make sense together."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(f"{prefix}cert_file and {prefix}key_file go together: give both or neither")
        if self.client_cert_auth and self.trusted_ca_file is None:
            raise ValueError(f"{prefix}client_cert_auth needs {prefix}trusted_ca_file: the CA whose certificates "
                             f"it accepts")
        if self.cert_file is None and (self.client_cert_auth or self.trusted_ca_file is not None):
            raise ValueError(f"{prefix}client_cert_auth and {prefix}trusted_ca_file need {prefix}cert_file and "
                             f"{prefix}key_file: TLS is off without them")
        if self.crl_file is not None and self.trusted_ca_file is None:
            raise ValueError(f"{prefix}crl_file needs {prefix}trusted_ca_file: only a verified certificate is checked "
                             f"against the revocation list")

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    def check_files(self, prefix: str = "") -> None:
        """ValueError, naming the field, unless each file given can be read."""
        for name in ("cert_file", "key_file", "trusted_ca_file", "crl_file"):
            path = getattr(self, name)
            if path is not None:
                try:
                    path.read_bytes()
                except OSError as e:
                    raise ValueError(f"{prefix}{name} {path}: {e.strerror or e}") from None


@dataclass(slots=True)
class Security:
    """TLS on the client port (`client`) and between members (`peer`), and client authentication
    (docs/security.md). Off by default: a node on a loopback address is reached by its own machine only;
    `raftkv serve` warns when it listens elsewhere without TLS."""

    client: TLSFiles = field(default_factory=TLSFiles)
    peer: TLSFiles = field(default_factory=TLSFiles)
    # How long an authentication token is valid (etcd's simple tokens: 300 s).
    auth_token_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        self.client.check()
        self.peer.check("peer_")
        if self.peer.enabled and self.peer.trusted_ca_file is None:
            raise ValueError("peer_cert_file needs peer_trusted_ca_file: the CA that signed the other members' "
                             "certificates, which this node checks when it dials them")
        if self.auth_token_ttl_s <= 0:
            raise ValueError("auth_token_ttl_s must be positive")

    def check_files(self) -> None:
        self.client.check_files()
        self.peer.check_files("peer_")


@dataclass(slots=True)
class NodeConfig:
    """A node's configuration, in layers: who it is and where (the fields here), the protocol
    (`core`, raft/core/config.py), the disk (`storage`), what it accepts (`limits`), how it
    uses its machine (`tuning`) and TLS and authentication (`security`). Errors name the field;
    the command line names its flags."""

    node_id: str = DEFAULT_NODE_ID
    # Where this node binds its gRPC services for clients (KV, export).
    listen: str = DEFAULT_LISTEN
    # Where clients reach this node (what peers put in not-leader hints and status when this node
    # leads): None means `listen`, which must then name a host, not a wildcard like 0.0.0.0.
    advertise_client: str | None = None
    # member id -> the PEER address where this node reaches that member (its listen_peer, or a
    # proxy or NAT in front of it, so it may differ from node to node). Must include this node.
    # Empty means a single-node cluster of just us, with no peer listener.
    peers: dict[str, str] = field(default_factory=dict)
    # This node joins an existing cluster (raftkv serve --join) that added it as a member: it founds
    # nothing and knows no configuration until its leader sends one; `peers` then only names
    # where it reaches the members it was told of.
    join: bool = False
    # etcd's --strict-reconfig-check: refuse a membership change after which the voters the leader
    # hears from would be too few for a quorum (kv/server/etcd_cluster.py). False lets such a
    # change through; the cluster then commits nothing until enough of its voters run.
    strict_reconfig_check: bool = True
    # Where this node takes its peers' connections (raft/transport/peer_protocol.py); None means
    # its own entry in `peers`.
    listen_peer: str | None = None
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    # Peers refuse messages carrying another cluster id (raft/node/cluster_id.py). Fixed on the
    # first start and kept in the data directory: this id when given, else one derived from the
    # member ids and initial_cluster_token (never from the addresses in peers, which may differ
    # from member to member). Once kept, the kept id is used and a different one here is refused.
    cluster_id: str | None = None
    # Distinguishes clusters with the same member ids (etcd's --initial-cluster-token): read only
    # on the first start, when cluster_id is None.
    initial_cluster_token: str = DEFAULT_CLUSTER_TOKEN
    core: CoreConfig = field(default_factory=CoreConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    limits: Limits = field(default_factory=Limits)
    tuning: Tuning = field(default_factory=Tuning)
    security: Security = field(default_factory=Security)
    # etcd's --listen-metrics-urls: where /metrics, /health, /readyz and /livez are served, as
    # comma-separated http://HOST:PORT (kv/server/http_endpoints.py); empty: nowhere.
    listen_metrics_urls: str = ""
    # etcd 3.5's --listen-client-http-urls: where etcd's HTTP/JSON gateway is served, as
    # comma-separated http(s)://HOST:PORT (kv/server/etcd_gateway.py); empty: nowhere.
    listen_client_http_urls: str = ""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.peers and self.node_id not in self.peers:
            raise ValueError(f"peers must name this node ({self.node_id!r}); they name {sorted(self.peers)}")
        # With join, the cluster names the peers (kv/server/join.py): they come after this check.
        if self.listen_peer is not None and not self.peers and not self.join:
            raise ValueError("listen_peer needs peers or join: a single node without peers has none to listen for")
        if not self.initial_cluster_token:
            raise ValueError("initial_cluster_token must not be empty")
        # The core takes a gap between ticks longer than a heartbeat interval for a stall.
        if self.core.heartbeat_interval_ms <= self.tuning.tick_interval_ms:
            raise ValueError(f"heartbeat_interval_ms ({self.core.heartbeat_interval_ms}) must be longer than "
                             f"tick_interval_ms ({self.tuning.tick_interval_ms})")

    def validate_addresses(self) -> None:
        """ValueError, naming the field, unless every address is host:port and clients can be
        told where this node is. Called by whatever binds or dials them (the server, the command
        line); the simulator's configurations name no real addresses."""
        _check_address("listen", self.listen)
        if self.advertise_client is not None:
            host, _ = _check_address("advertise_client", self.advertise_client)
            if host in WILDCARD_HOSTS:
                raise ValueError(f"advertise_client {self.advertise_client}: give the address clients reach this "
                                 f"node at, not a wildcard")
        elif split_address(self.listen)[0] in WILDCARD_HOSTS:
            raise ValueError(f"listen {self.listen} binds every interface, so it is no address to give clients: "
                             f"give advertise_client HOST:PORT, where clients reach this node")
        for member, address in self.peers.items():
            _check_address(f"peers: {member}", address)
        if self.listen_peer is not None:
            _check_address("listen_peer", self.listen_peer)
        parse_http_urls("listen_metrics_urls", self.listen_metrics_urls, tls=False)
        parse_http_urls("listen_client_http_urls", self.listen_client_http_urls, tls=self.security.client.enabled,
                        https_needs="https serves the client port's TLS: give cert_file and key_file")

    @property
    def advertised_client_address(self) -> str:
        """Where clients reach this node: advertise_client, else listen."""
        return self.advertise_client if self.advertise_client is not None else self.listen

    @property
    def advertised_client_http_address(self) -> str | None:
        """Where HTTP clients reach this node's gateway (host:port of the first of
        listen_client_http_urls, a wildcard host replaced by the advertised client host); None
        without a gateway."""
        first = next((u.strip() for u in self.listen_client_http_urls.split(",") if u.strip()), None)
        if first is None:
            return None
        host, port = split_address(first.split("://", 1)[-1].rstrip("/"))
        if host in WILDCARD_HOSTS:
            host = split_address(self.advertised_client_address)[0]
        return f"{host}:{port}"

    @property
    def peer_listen_address(self) -> str | None:
        """Where this node takes its peers' connections: listen_peer, else its own entry in
        peers; None for a single node without peers."""
        return self.listen_peer if self.listen_peer is not None else self.peers.get(self.node_id)

    @property
    def members(self) -> list[str]:
        return sorted(self.peers) or [self.node_id]



def _check_address(name: str, address: str) -> tuple[str, int]:
    try:
        return split_address(address)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def parse_http_urls(name: str, urls: str, tls: bool, https_needs: str = "") -> list[tuple[str, int]]:
    """Comma-separated URLs of an HTTP listener (`name`, the field that holds them): (host, port)
    of each. https://HOST:PORT when the listener speaks TLS (`tls`), else http://HOST:PORT;
    ValueError, naming the field (and `https_needs`, what https would take), on anything else."""
    scheme = "https" if tls else "http"
    listeners = []
    for url in filter(None, (u.strip() for u in urls.split(","))):
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != scheme or not parts.hostname or port is None or parts.path not in ("", "/"):
            why = f" ({https_needs})" if parts.scheme == "https" and https_needs else ""
            raise ValueError(f"{name}: {url!r} is not {scheme}://HOST:PORT{why}")
        listeners.append((parts.hostname, port))
    return listeners


def parse_peers(spec: str) -> dict[str, str]:
    """Parse "n1=127.0.0.1:7101,n2=127.0.0.1:7102" into {"n1": "127.0.0.1:7101", ...}."""
    peers: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, addr = part.partition("=")
        if not sep or not name or ":" not in addr:
            raise ValueError(f"bad peer {part!r}: expected id=host:port, e.g. n1=127.0.0.1:7101")
        if name in peers:
            raise ValueError(f"peer {name!r} named twice")
        peers[name] = addr
    return peers
