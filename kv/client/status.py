"""The status of a node as a dict with the contract's field names (DESIGN.md): what
`raftkv status --json` prints and `Client.status()` returns. Scripts rely on these names."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raftkv_proto import kv_pb2


def status_dict(s: kv_pb2.StatusResponse, address: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": s.id,
        "role": s.role,
        "term": s.term,
        "leader": s.leader or None,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "snapshot_index": s.snapshot_index,
        "address": address or s.address,
        "cluster_id": s.cluster_id,
        "last_index": s.last_index,
        "leader_address": s.leader_address or None,
        "log_size_bytes": s.log_size_bytes,
        "state_size_bytes": s.state_size_bytes,
        "log_begin_index": s.log_begin_index,
        "log_begin_term": s.log_begin_term,
        "rejoining": s.rejoining,
        "disk_full": s.disk_full,
        "corrupt": s.corrupt or None,
        "max_request_bytes": s.max_request_bytes,
        "pipeline_requests_held": s.pipeline_requests_held,
        "pipeline_reply_bytes_held": s.pipeline_reply_bytes_held,
        "alarms": alarm_dicts(s.alarms),
        "nospace": s.nospace or None,
        "unhealthy": s.unhealthy or None,
        "voters": list(s.voters),
        "learners": list(s.learners),
    }
    if s.role == "leader":
        out["peers"] = dict(s.peers)
    return out


def alarm_dicts(alarms: Iterable[kv_pb2.AlarmMember]) -> list[dict[str, str]]:
    """Raised alarms as [{"member_id": ..., "alarm": "NOSPACE" or "CORRUPT"}, ...]."""
    return [{"member_id": a.member_id, "alarm": kv_pb2.AlarmType.Name(a.alarm)} for a in alarms]
