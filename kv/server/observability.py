"""What a node offers its operators beside its client API, started and stopped together: the alarm
watch (alarm_watch.py), the gRPC health service on --listen (health.py) and, with
--listen-metrics-urls, the HTTP listener of /metrics, /health, /readyz and /livez
(http_endpoints.py, metrics.py, http_server.py); the routes also go to etcd's JSON gateway
(--listen-client-http-urls), which serves /metrics and /health as etcd's client URL does."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from grpc_health.v1 import health_pb2_grpc

from kv.server.alarm_watch import AlarmWatch
from kv.server.health import HealthServicer, member_health
from kv.server.http_endpoints import HttpEndpoints, parse_metrics_urls
from kv.server.http_server import HttpServer
from kv.server.kv_handler import KVHandler
from kv.server.kv_service import KVServicer
from kv.server.log_format import follow_term
from kv.server.metrics import HealthCounts, MetricSources, registry_of
from kv.server.replaceable_state import ReplaceableStateMachine
from kv.server.server_group import Service
from kv.server.state_check import PeerStatuses, StateChecker
from raft.node.node import RaftNode
from raft.node.stats import Histogram
from raft.transport.tcp_transport import TcpTransport

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Observability:
    alarm_watch: AlarmWatch
    endpoints: HttpEndpoints | None  # with either HTTP listener
    http: HttpServer | None  # the metrics listener
    health_service: Service

    @classmethod
    def of(cls, node: RaftNode, fsm: ReplaceableStateMachine, handler: KVHandler, kv_service: KVServicer,
           checker: StateChecker, peer_statuses: PeerStatuses) -> Observability:
        config = node.config
        follow_term(lambda: node.core.term)
        listeners = parse_metrics_urls(config.listen_metrics_urls)  # ValueError before anything starts
        http = endpoints = None
        transport = node.transport
        # Timed by the TCP transport (raft/transport/peer_links.py); another PeerTransport times nothing.
        round_trips: Callable[[], dict[str, Histogram]] = (
            transport.round_trip_seconds if isinstance(transport, TcpTransport) else dict)
        if listeners or config.listen_client_http_urls:
            counts = HealthCounts()
            registry = registry_of(MetricSources(
                node, fsm, config.storage.quota_backend_bytes or config.storage.state_max_bytes, counts,
                handled=lambda: kv_service.handled, latency=lambda: kv_service.latency, stream_requests=lambda: kv_service.stream_requests,
                pipeline_held=kv_service.pipeline_held, state_checks=lambda: checker.hashed,
                peer_round_trips=round_trips))
            endpoints = HttpEndpoints(registry, lambda exclude: member_health(node, fsm.alarms, exclude), counts)
        if listeners:
            assert endpoints is not None
            http = HttpServer("--listen-metrics-urls", listeners, endpoints.serve)
        return cls(AlarmWatch(node, fsm.alarms, handler.status, peer_statuses), endpoints, http,
                   (health_pb2_grpc.add_HealthServicer_to_server, HealthServicer(node, fsm.alarms)))

    async def start(self) -> None:
        if self.http is not None:  # first: a port in use fails the start with nothing else running
            await self.http.start()
            log.info("metrics and health on %s", ", ".join(f"http://{a}" for a in self.http.addresses))
        self.alarm_watch.start()

    async def stop(self) -> None:
        await self.alarm_watch.stop()
        if self.http is not None:
            await self.http.stop()
