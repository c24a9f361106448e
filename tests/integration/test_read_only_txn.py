"""A Txn without puts or deletes is a read (etcd's isTxnReadonly): the member asked answers it (the
leader, after a ReadIndex round, unless every range is serializable), and it never enters the log,
where every member would run it. One client's txn of many whole-keyspace ranges once grew every
follower to gigabytes and cost the cluster its leader."""
from __future__ import annotations

import grpc
import pytest

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import STEADY_TIMING, Cluster

pytestmark = pytest.mark.integration

KEYS = 500


@pytest.fixture
def cluster(make_cluster) -> Cluster:  # type: ignore[no-untyped-def]
    cluster = make_cluster(3, extra_args=STEADY_TIMING)
    cluster.wait_for_leader()
    return cluster


def whole_keyspace_txn(ranges: int, serializable: bool) -> pb.TxnRequest:
    everything = pb.RangeRequest(key=b"\0", range_end=b"\0", serializable=serializable)
    return pb.TxnRequest(success=[pb.RequestOp(request_range=everything)] * ranges)


def test_read_only_txns_are_answered_as_reads_and_never_logged(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    with cluster.client() as client:
        client.batch(puts={b"key/%04d" % i: b"v" * 1024 for i in range(KEYS)})
    commit = cluster.status(leader)["commit_index"]
    for node in cluster.nodes:  # every member holds the log as it stands before the reads
        cluster.wait_applied(node, commit)
    before = cluster.statuses()
    with grpc.insecure_channel(cluster.nodes[follower].address,
                               options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        kv = etcd_rpc_pb2_grpc.KVStub(channel)
        for serializable in (True, False):
            response = kv.Txn(whole_keyspace_txn(16, serializable), timeout=30)
            assert response.succeeded and len(response.responses) == 16
            assert all(len(r.response_range.kvs) == KEYS for r in response.responses)
    after = cluster.statuses()
    for node in cluster.nodes:  # nothing entered the log: no member ran the transaction as an entry
        assert after[node]["last_index"] == before[node]["last_index"], node
        assert after[node]["term"] == before[node]["term"] and after[node]["leader"] == leader, node
