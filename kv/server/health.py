"""Whether a member is healthy: the one rule behind HTTP /health and /readyz (kv/server
/http_endpoints.py), gRPC's standard health service on --listen (grpc.health.v1.Health, below) and
`raftkv endpoint health` (which reads it from status: `unhealthy`).

A member is healthy, as etcd's /health says it, when

- it runs (not stopped: a corrupt member stops serving);
- it is the leader (which steps down after an election timeout without hearing from a quorum), or
  it heard from the leader it knows within the election timeout;
- no alarm is raised in the cluster (NOSPACE refuses every member's writes; CORRUPT says a member
  must be replaced);
- it is not rejoining after losing its data (it votes for no one until it has caught up).

The reason strings are etcd's where etcd has one ("RAFT NO LEADER", "ALARM NOSPACE")."""
from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raft.node.node import RaftNode
from statemachine.alarms import AlarmHolder

# The service names the gRPC health service answers for: "" (the whole server) and raftkv's.
SERVICES = ("", "raftkv")


@dataclass(frozen=True, slots=True)
class Health:
    healthy: bool
    reason: str = ""  # why not, when not


def member_health(node: RaftNode, alarms: AlarmHolder, exclude: frozenset[str] = frozenset()) -> Health:
    """`exclude`: alarm types ("NOSPACE", "CORRUPT") not to count, as etcd's /health?exclude=NOSPACE."""
    if node.stopped is not None:
        return Health(False, f"STOPPED {node.stopped}")
    raised = [a for a in alarms.listed() if a.name not in exclude]
    if raised:
        return Health(False, "ALARM " + ", ".join(f"{a.name} (member {a.member_id})" for a in raised))
    if not node.leader_is_recent():
        return Health(False, "RAFT NO LEADER")
    if node.core.rejoining:  # lost its data and still catching up: it votes for no one yet
        return Health(False, "RAFT REJOINING")
    return Health(True)


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health: SERVING or NOT_SERVING by `member_health`, worked out per call (a
    probe's rate), so it is never stale. Watch is not offered (UNIMPLEMENTED): Kubernetes' and
    grpc-health-probe's checks call Check."""

    def __init__(self, node: RaftNode, alarms: AlarmHolder) -> None:
        self._node = node
        self._alarms = alarms

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        healthy = member_health(self._node, self._alarms).healthy
        return health_pb2.HealthCheckResponse(
            status=health_pb2.HealthCheckResponse.SERVING if healthy else health_pb2.HealthCheckResponse.NOT_SERVING)
