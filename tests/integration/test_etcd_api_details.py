"""The etcd API details real clients hit (python-etcd3's defaults among them), sent as raw gRPC
calls to a real etcd 3.4 and to a raftkv node, and compared answer by answer: alarms raised,
listed and cleared for member 0 (python-etcd3's default member id), compactions at and below the
compacted revision, Maintenance.Hash, and what a CORRUPT alarm refuses (writes) and lets through
(reads). Member-specific header fields (cluster_id, member_id,
raft_term) are left out; a value that differs by design is named in the comparison."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.test_etcd_differential import etcd_and_raftkv
from tests.integration.real_etcd import needs_etcd

pytestmark = [
    pytest.mark.integration,
    needs_etcd,
]

# An answer: ("ok", the response as JSON without member fields) or ("error", code name, message).
Answer = tuple[Any, ...]


def answer(call: Callable[[], Any]) -> Answer:
    try:
        response = call()
    except grpc.RpcError as e:
        return ("error", e.code().name, e.details())
    as_json = MessageToDict(response, preserving_proto_field_name=True)
    for name in ("cluster_id", "member_id", "raft_term"):
        as_json.get("header", {}).pop(name, None)
    return ("ok", as_json)


def alarm(action: int, member: int = 0, kind: int = pb.NONE) -> pb.AlarmRequest:
    return pb.AlarmRequest(action=action, memberID=member, alarm=kind)


def script(endpoint: str) -> dict[str, Answer]:
    """The same calls, in order, against one store; what each answered."""
    out: dict[str, Answer] = {}
    with grpc.insecure_channel(endpoint) as channel:
        kv = etcd_rpc_pb2_grpc.KVStub(channel)
        maintenance = etcd_rpc_pb2_grpc.MaintenanceStub(channel)
        lease = etcd_rpc_pb2_grpc.LeaseStub(channel)
        for i in range(4):
            kv.Put(pb.PutRequest(key=b"k", value=b"%d" % i), timeout=10)
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("alarms at first", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.GET), timeout=10)),
            ("raise NOSPACE for member 0", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.ACTIVATE, 0, pb.NOSPACE),
                                                                     timeout=10)),
            ("raise it again", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.ACTIVATE, 0, pb.NOSPACE), timeout=10)),
            ("list every alarm", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.GET), timeout=10)),
            ("list NOSPACE", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.GET, 0, pb.NOSPACE), timeout=10)),
            ("list CORRUPT", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.GET, 0, pb.CORRUPT), timeout=10)),
            ("a put while NOSPACE", lambda: kv.Put(pb.PutRequest(key=b"k", value=b"no"), timeout=10)),
            ("clear it", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.DEACTIVATE, 0, pb.NOSPACE), timeout=10)),
            ("clear it again", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.DEACTIVATE, 0, pb.NOSPACE), timeout=10)),
            ("alarms at last", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.GET), timeout=10)),
            ("a put after", lambda: kv.Put(pb.PutRequest(key=b"k", value=b"4"), timeout=10)),
            ("compact at 3", lambda: kv.Compact(pb.CompactionRequest(revision=3), timeout=10)),
            ("compact at 3 again", lambda: kv.Compact(pb.CompactionRequest(revision=3), timeout=10)),
            ("compact at 2", lambda: kv.Compact(pb.CompactionRequest(revision=2), timeout=10)),
            ("compact at 0", lambda: kv.Compact(pb.CompactionRequest(revision=0), timeout=10)),
            ("compact in the future", lambda: kv.Compact(pb.CompactionRequest(revision=100), timeout=10)),
            ("compact at 4", lambda: kv.Compact(pb.CompactionRequest(revision=4), timeout=10)),
            ("hash", lambda: maintenance.Hash(pb.HashRequest(), timeout=10)),
            ("raise CORRUPT for member 0", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.ACTIVATE, 0, pb.CORRUPT),
                                                                     timeout=10)),
            ("a range while CORRUPT", lambda: kv.Range(pb.RangeRequest(key=b"k"), timeout=10)),
            ("a read-only txn while CORRUPT", lambda: kv.Txn(pb.TxnRequest(success=[
                pb.RequestOp(request_range=pb.RangeRequest(key=b"k"))]), timeout=10)),
            ("a put while CORRUPT", lambda: kv.Put(pb.PutRequest(key=b"k", value=b"c"), timeout=10)),
            ("a delete while CORRUPT", lambda: kv.DeleteRange(pb.DeleteRangeRequest(key=b"k"), timeout=10)),
            ("a write txn while CORRUPT", lambda: kv.Txn(pb.TxnRequest(success=[
                pb.RequestOp(request_put=pb.PutRequest(key=b"k", value=b"c"))]), timeout=10)),
            ("a compaction while CORRUPT", lambda: kv.Compact(pb.CompactionRequest(revision=5), timeout=10)),
            ("a lease grant while CORRUPT", lambda: lease.LeaseGrant(pb.LeaseGrantRequest(TTL=60, ID=7), timeout=10)),
            ("clear CORRUPT", lambda: maintenance.Alarm(alarm(pb.AlarmRequest.DEACTIVATE, 0, pb.CORRUPT), timeout=10)),
            ("a put after CORRUPT", lambda: kv.Put(pb.PutRequest(key=b"k", value=b"5"), timeout=10)),
        ]
        for name, call in steps:
            out[name] = answer(call)
    return out


def hash_answered(found: Answer) -> Answer:
    """Hash's value is each store's own (etcd hashes its bolt file): only its presence compares."""
    if found[0] != "ok":
        return found
    body = dict(found[1])
    assert isinstance(body.pop("hash", 0), int)
    return ("ok", body)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Answer], dict[str, Answer]]]:
    with etcd_and_raftkv(tmp_path_factory.mktemp("api-details")) as (etcd, node):
        yield script(etcd.endpoint), script(node.address)


def test_raftkv_answers_as_etcd(answers: tuple[dict[str, Answer], dict[str, Answer]]) -> None:
    theirs, ours = answers
    theirs["hash"], ours["hash"] = hash_answered(theirs["hash"]), hash_answered(ours["hash"])
    differing = [f"{name}:\n  etcd   {theirs[name]}\n  raftkv {ours[name]}" for name in theirs if theirs[name] != ours[name]]
    assert not differing, "\n".join(differing)


def test_raising_no_alarm_type_changes_nothing_and_the_member_serves_on(cluster: Cluster) -> None:
    """etcd 3.4.23 stops on it ("mvcc/backend: cannot put key into bucket (key required)"): raftkv
    answers with no alarm, as later etcd does, and serves on."""
    node = cluster.nodes[cluster.wait_for_leader()]
    with grpc.insecure_channel(node.address) as channel:
        maintenance = etcd_rpc_pb2_grpc.MaintenanceStub(channel)
        assert not maintenance.Alarm(alarm(pb.AlarmRequest.ACTIVATE, 0, pb.NONE), timeout=10).alarms
        assert not maintenance.Alarm(alarm(pb.AlarmRequest.GET), timeout=10).alarms
        etcd_rpc_pb2_grpc.KVStub(channel).Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    assert node.running
