"""A Txn without puts or deletes is a read (etcd's isTxnReadonly): the member asked answers it (the
leader, after a ReadIndex round, unless every range is serializable), and it never enters the log,
where every member would run it. One client's txn of many whole-keyspace ranges once grew every
follower to gigabytes and cost the cluster its leader; its ranges together are one reply, measured
before it is built and refused when over what a member sends."""
from __future__ import annotations

import grpc
import pytest

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from kv.server.server_group import MAX_SEND_BYTES
from tests.integration.cluster import STEADY_TIMING, Cluster
from tests.integration.member_memory import AnonPeak

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


def test_a_read_only_txn_too_large_together_is_refused_before_it_is_built(cluster: Cluster) -> None:
    """The issue's txn, scaled down: 128 ranges over a keyspace of 2,000 keys of 1 KiB (about 2 MB
    each, 270 MB together, over the 64 MiB a member sends) is one reply too large, refused as gRPC
    refuses a message over its limit before any range is read, through a follower as on the
    leader; the leader's memory does not grow by the reply (by 0.1 MiB, measured)."""
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    follower = next(n for n in cluster.nodes if n != leader)
    with cluster.client() as client:
        for first in range(0, 2000, 500):
            client.batch(puts={b"key/%04d" % i: b"v" * 1024 for i in range(first, first + 500)})
    for node in (leader, follower):
        with grpc.insecure_channel(cluster.nodes[node].address, options=[("grpc.max_receive_message_length", -1)]) \
                as channel, AnonPeak(cluster.nodes[leader].process.pid) as memory:
            with pytest.raises(grpc.RpcError) as refused:
                etcd_rpc_pb2_grpc.KVStub(channel).Txn(whole_keyspace_txn(128, False), timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert refused.value.details().startswith("grpc: trying to send message larger than max ("), refused.value
        assert refused.value.details().endswith(f" vs. {MAX_SEND_BYTES})"), refused.value
        assert memory.growth_mib < 32, memory.growth_mib  # one range built alone would be 4 MB; all, 500 MB
    for node, status in cluster.statuses().items():
        assert (status["leader"], status["term"]) == (leader, term), (node, status)
