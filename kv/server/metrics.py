"""The node's Prometheus metrics, read at scrape time (docs/operations.md, "Metrics").

Nothing here runs per request. The node and the services count in plain ints and dicts they own
(raft/node/stats.py, KVServicer.calls / .handled, the health counters of http_endpoints.py); a
scrape, on the node's event loop, reads them and the node's state and turns them into metric
families. The names, types and help strings are etcd's (etcd's docs/metrics and server/etcdserver
/metrics.go) where etcd has a counterpart, so dashboards and alerts written for etcd work; note that
etcd's etcd_server_proposals_committed_total and ..._applied_total are gauges (the commit and
applied indexes), and so they are here. raftkv's own are under raftkv_."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from raft.core.types import Role
from raft.node.node import RaftNode
from raft.node.stats import Histogram
from kv.server.replaceable_state import ReplaceableStateMachine


@dataclass(slots=True)
class HealthCounts:
    """/health answers, as etcd counts them (etcd_server_health_success / _failures)."""

    success: int = 0
    failures: int = 0


@dataclass(slots=True)
class MetricSources:
    node: RaftNode
    fsm: ReplaceableStateMachine
    quota_backend_bytes: int
    health: HealthCounts
    # (method, code) -> finished unary calls (KVServicer.handled); kind -> stream/pipeline requests.
    handled: Callable[[], dict[tuple[str, str], int]]
    latency: Callable[[], dict[str, Histogram]]  # method -> seconds to reply (KVServicer.latency)
    stream_requests: Callable[[], dict[str, int]]
    pipeline_held: Callable[[], tuple[int, int]]  # (requests, reply bytes) the pipeline calls hold
    state_checks: Callable[[], int]  # state checks this member has hashed
    # peer -> seconds of the round trips timed to it (TcpTransport.round_trip_seconds)
    peer_round_trips: Callable[[], dict[str, Histogram]]


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    """Prometheus' cumulative buckets, +Inf last."""
    cumulative = list(accumulate(h.counts))
    return [(repr(float(b)), c) for b, c in zip(h.buckets, cumulative)] + [("+Inf", cumulative[-1])]


def _histogram(name: str, help_text: str, h: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, help_text, buckets=_buckets(h), sum_value=h.total)


class NodeCollector(Collector):
    def __init__(self, sources: MetricSources) -> None:
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        yield from self._server()
        yield from self._disk()
        yield from self._network()
        yield from self._mvcc()
        yield from self._raftkv()
        yield from self._grpc()

    def _server(self) -> Iterator[Metric]:
        node, stats = self._s.node, self._s.node.stats
        core = node.core
        yield _gauge("etcd_server_has_leader", "Whether or not a leader exists. 1 is existence, 0 is not.",
                     core.leader is not None)
        yield _gauge("etcd_server_is_leader", "Whether or not this member is a leader. 1 if is, 0 otherwise.",
                     core.role is Role.LEADER)
        yield _counter("etcd_server_leader_changes_seen", "The number of leader changes seen.", stats.leader_changes)
        yield _gauge("etcd_server_proposals_committed_total", "The total number of consensus proposals committed.",
                     core.commit_index)
        yield _gauge("etcd_server_proposals_applied_total", "The total number of consensus proposals applied.",
                     node.applied_index)
        yield _gauge("etcd_server_proposals_pending", "The current number of pending proposals to commit.",
                     len(node.proposals))
        yield _counter("etcd_server_proposals_failed", "The total number of failed proposals seen.",
                       node.proposals.failed)
        yield _counter("etcd_server_health_success", "The total number of successful health checks",
                       self._s.health.success)
        yield _counter("etcd_server_health_failures", "The total number of failed health checks",
                       self._s.health.failures)
        yield _gauge("etcd_server_quota_backend_bytes", "Current backend storage quota size in bytes.",
                     self._s.quota_backend_bytes)
        yield _gauge("raftkv_server_term", "The member's current Raft term.", core.term)

    def _disk(self) -> Iterator[Metric]:
        stats = self._s.node.stats
        yield _histogram("etcd_disk_wal_fsync_duration_seconds",
                         "The latency distributions of fsync called by WAL.", stats.wal_fsync_seconds)
        yield _histogram("etcd_disk_backend_commit_duration_seconds",
                         "The latency distributions of commit called by backend.", stats.apply_seconds)
        size = getattr(self._s.node.log, "size_bytes", None)
        yield _gauge("raftkv_wal_size_bytes", "Bytes the log takes on disk.", size() if callable(size) else 0)

    def _network(self) -> Iterator[Metric]:
        # etcd's rafthttp: the round trip of a probe to each peer, labelled by the peer's id.
        rtt = HistogramMetricFamily("etcd_network_peer_round_trip_time_seconds",
                                    "Round-Trip-Time histogram between peers", labels=["To"])
        for peer, histogram in sorted(self._s.peer_round_trips().items()):
            rtt.add_metric([peer], _buckets(histogram), sum_value=histogram.total)
        yield rtt

    def _mvcc(self) -> Iterator[Metric]:
        fsm = self._s.fsm
        yield _gauge("etcd_mvcc_db_total_size_in_bytes",
                     "Total size of the underlying database physically allocated in bytes.", fsm.size_bytes())
        yield _gauge("etcd_mvcc_db_total_size_in_use_in_bytes",
                     "Total size of the underlying database logically in use in bytes.", fsm.in_use_bytes())
        yield _gauge("etcd_debugging_mvcc_keys_total", "Total number of keys.", fsm.count())

    def _raftkv(self) -> Iterator[Metric]:
        s, stats = self._s, self._s.node.stats
        yield _counter("raftkv_read_index_rounds", "ReadIndex rounds the member answered (one serves every "
                       "linearizable read waiting for it).", stats.read_index_rounds)
        reads = CounterMetricFamily("raftkv_reads", "Reads begun, by consistency (a lease read that finds no "
                                    "lease goes through a ReadIndex round and still counts as lease).",
                                    labels=["consistency"])
        for level, count in stats.reads.items():
            reads.add_metric([level], count)
        yield reads
        yield _counter("raftkv_snapshot_sends", "Snapshots sent to followers.", stats.snapshots_sent)
        yield _counter("raftkv_snapshot_send_bytes", "Bytes of the snapshots sent to followers.",
                       stats.snapshot_sent_bytes)
        yield _histogram("raftkv_snapshot_send_duration_seconds", "How long sending a snapshot to a follower took.",
                         stats.snapshot_send_seconds)
        yield _counter("raftkv_snapshot_installs", "Snapshots received from the leader and installed.",
                       stats.snapshots_installed)
        yield _counter("raftkv_snapshot_install_bytes", "Bytes of the snapshots installed.",
                       stats.snapshot_installed_bytes)
        yield _histogram("raftkv_snapshot_install_duration_seconds", "How long installing a snapshot took.",
                         stats.snapshot_install_seconds)
        yield _gauge("raftkv_client_sessions", "Client sessions the state keeps (exactly-once writes).",
                     s.fsm.session_stats().clients)
        held, held_bytes = s.pipeline_held()
        yield _gauge("raftkv_pipeline_requests_held", "Requests the open Pipeline calls hold (in flight or "
                     "replied but not yet sent).", held)
        yield _gauge("raftkv_pipeline_reply_bytes_held", "Bytes of replies the open Pipeline calls hold.", held_bytes)
        yield _counter("raftkv_state_checks", "State checks this member hashed (kv/server/state_check.py).",
                       s.state_checks())
        alarms = GaugeMetricFamily("raftkv_alarm", "1 for each alarm raised in the cluster, by member and type.",
                                   labels=["member_id", "alarm"])
        for alarm in s.fsm.alarms.listed():
            alarms.add_metric([alarm.member_id, alarm.name], 1)
        yield alarms

    def _grpc(self) -> Iterator[Metric]:
        handled = CounterMetricFamily("grpc_server_handled", "Total number of RPCs completed on the server, "
                                      "regardless of success or failure (unary calls).",
                                      labels=["grpc_service", "grpc_method", "grpc_code"])
        for (method, code), count in sorted(self._s.handled().items()):
            handled.add_metric(["raftkv.kv.KV", method, code], count)
        yield handled
        latency = HistogramMetricFamily("grpc_server_handling_seconds", "Histogram of response latency (seconds) of "
                                        "gRPC that had been application-level handled by the server (unary calls, "
                                        "and each request of a Stream call).", labels=["grpc_service", "grpc_method"])
        for method, histogram in sorted(self._s.latency().items()):
            latency.add_metric(["raftkv.kv.KV", method], _buckets(histogram), sum_value=histogram.total)
        yield latency
        requests = CounterMetricFamily("raftkv_stream_requests", "Requests begun on Stream and Pipeline calls, "
                                       "by kind.", labels=["kind"])
        for kind, count in sorted(self._s.stream_requests().items()):
            requests.add_metric([kind], count)
        yield requests


def registry_of(sources: MetricSources) -> CollectorRegistry:
    """A registry of this node's metrics alone (a process may run several embedded nodes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(sources))
    # The process's own (process_resident_memory_bytes ...), as etcd's /metrics has them:
    # `etcdctl check datascale` reads the memory one.
    ProcessCollector(registry=registry)
    return registry
