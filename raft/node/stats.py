"""What a node counts about itself, for kv/server/metrics.py to read at scrape time.

Plain ints and a small fixed-bucket histogram, bumped where the node already does the work: no
locks, no labels, no library on the node's path. A scrape reads them from the event loop, between
two steps of the node, so it never sees a half-made update. The histograms observe once per batch
(one WAL write, one apply transaction), never once per request."""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# etcd's buckets for etcd_disk_wal_fsync_duration_seconds and
# etcd_disk_backend_commit_duration_seconds: 1 ms doubling up to about 8 s.
DISK_BUCKETS_S: tuple[float, ...] = tuple(0.001 * 2 ** i for i in range(14))
# Client calls: 0.5 ms to 10 s (a put takes a fsync and a round trip).
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# etcd's buckets for etcd_network_peer_round_trip_time_seconds (rafthttp/metrics.go): 0.1 ms
# doubling up to 3.2768 s.
PEER_RTT_BUCKETS_S: tuple[float, ...] = tuple(0.0001 * 2 ** i for i in range(16))
# Snapshot sends and installs take from milliseconds to minutes.
SNAPSHOT_BUCKETS_S: tuple[float, ...] = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass(slots=True)
class Histogram:
    """Counts per bucket (the last one is +Inf) and their sum, as Prometheus exposes them."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value


@dataclass(slots=True)
class NodeStats:
    leader_changes: int = 0  # times this member saw a new leader (etcd_server_leader_changes_seen_total)
    proposals_failed: int = 0  # proposals that failed (lost leadership, dropped, node stopped)
    read_index_rounds: int = 0  # ReadIndex rounds answered (one serves every read waiting)
    reads: dict[str, int] = field(default_factory=lambda: {"linearizable": 0, "lease": 0, "stale": 0})
    snapshots_sent: int = 0
    snapshot_sent_bytes: int = 0
    snapshots_installed: int = 0
    snapshot_installed_bytes: int = 0
    snapshot_send_seconds: Histogram = field(default_factory=lambda: Histogram(SNAPSHOT_BUCKETS_S))
    snapshot_install_seconds: Histogram = field(default_factory=lambda: Histogram(SNAPSHOT_BUCKETS_S))
    wal_fsync_seconds: Histogram = field(default_factory=lambda: Histogram(DISK_BUCKETS_S))
    apply_seconds: Histogram = field(default_factory=lambda: Histogram(DISK_BUCKETS_S))
