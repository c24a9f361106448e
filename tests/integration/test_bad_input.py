"""Bad input gets its own error, and the node keeps serving."""
from __future__ import annotations

import re
import struct

import grpc
import pytest

from kv.errors import InvalidArgumentError
from raftkv_proto import kv_pb2, raft_pb2
from raft.transport.frames import frame
from raft.transport.peer_protocol import MAX_FRAME_BYTES
from tests.integration.cluster import STEADY_TIMING, Cluster
from tests.integration.peer_wire import assert_closed, connect, heartbeat_batch, hello_frame, read_frame, say_hello

pytestmark = pytest.mark.integration

MAX_VALUE = 1024


# The tests check that what they sent moved neither the leader nor the term: steady timing, so that
# a busy machine causes no election of its own.
@pytest.fixture
def cluster(make_cluster) -> Cluster:
    cluster = make_cluster(3, extra_args=STEADY_TIMING)
    cluster.wait_for_leader()
    return cluster


@pytest.fixture
def small_values(make_cluster) -> Cluster:
    cluster = make_cluster(3, extra_args=(*STEADY_TIMING, "--max-value-bytes", str(MAX_VALUE)))
    cluster.wait_for_leader()
    return cluster


def assert_still_serving(cluster: Cluster, leader: str) -> None:
    assert all(node.running for node in cluster.nodes.values())
    client = cluster.client()
    client.put("alive", "yes")
    assert client.get("alive") == b"yes"
    assert cluster.wait_for_leader() == leader


def test_bad_keys_and_values(small_values: Cluster):
    cluster = small_values
    leader = cluster.wait_for_leader()
    client = cluster.client()
    with pytest.raises(InvalidArgumentError, match="(?i)empty"):
        client.put("", "v")
    with pytest.raises(InvalidArgumentError):
        client.get("")
    with pytest.raises(InvalidArgumentError, match="32768-byte key limit"):
        client.put(b"k" * 32769, "v")
    with pytest.raises(InvalidArgumentError):
        client.batch(puts={b"ok": b"v", b"k" * 32769: b"v"})
    with pytest.raises(InvalidArgumentError, match=str(MAX_VALUE)):
        client.put("big", b"x" * (MAX_VALUE + 1))
    assert client.get("ok") is None  # the refused batch changed nothing
    # The limits themselves are allowed.
    client.put(b"k" * 511, b"x" * MAX_VALUE)
    assert client.get(b"k" * 511) == b"x" * MAX_VALUE
    assert_still_serving(cluster, leader)


@pytest.mark.parametrize("case, expected", [
    ("wrong cluster id", "wrong cluster id: got 'not-"),
    ("no member id", "a hello with no member id"),
    ("wrong addressee", "reached"),
])
def test_peer_connections_from_another_cluster_an_unknown_member_or_for_another_member_are_refused(
        cluster: Cluster, case: str, expected: str):
    leader = cluster.wait_for_leader()
    status = cluster.status(leader)
    cluster_id, high_term = status["cluster_id"], status["term"] + 100
    follower, other = [n for n in cluster.nodes if n != leader]
    from_id, to_id, claimed_cluster = {"wrong cluster id": (follower, leader, "not-" + cluster_id),
                                       "no member id": ("", leader, cluster_id),
                                       "wrong addressee": (follower, other, cluster_id)}[case]
    with connect(cluster, leader) as sock:
        # The hello and, right behind it, heartbeats from a far higher term: none may reach the core.
        sock.sendall(hello_frame(claimed_cluster, from_id, to_id) + heartbeat_batch(from_id, leader, high_term))
        reply = raft_pb2.PeerHelloReply.FromString(read_frame(sock))
        assert expected in reply.refusal and not reply.node_id
        assert_closed(sock)
    if case == "wrong addressee":
        assert f"message for '{other}' reached '{leader}': check --peers addresses" in reply.refusal
    after = cluster.status(leader)
    assert after["role"] == "leader" and after["term"] == status["term"]  # the high term was ignored
    assert_still_serving(cluster, leader)


@pytest.mark.parametrize("method", ["/raftkv.kv.KV/Put", "/raftkv.kv.KV/Get"])
def test_garbage_bytes_are_refused(cluster: Cluster, method: str):
    leader = cluster.wait_for_leader()
    channel = grpc.insecure_channel(cluster.nodes[leader].address)
    try:
        send_raw = channel.unary_unary(method)  # no serializers: the bytes go out as they are
        for garbage in (b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256))):
            with pytest.raises(grpc.RpcError) as refused:
                send_raw(garbage, timeout=5)
            # The server parses requests itself (kv/server/input_checks.py) and says so.
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert re.search("malformed", refused.value.details() or "", re.I)
    finally:
        channel.close()
    assert_still_serving(cluster, leader)


@pytest.mark.parametrize("method", ["/raftkv.kv.KV/Stream", "/raftkv.kv.KV/Pipeline"])
def test_garbage_on_a_stream_is_refused(cluster: Cluster, method: str):
    leader = cluster.wait_for_leader()
    channel = grpc.insecure_channel(cluster.nodes[leader].address)
    try:
        garbage = iter([b"\xff" * 64])  # no serializers: the bytes go out as they are
        with pytest.raises(grpc.RpcError) as refused:
            list(channel.stream_stream(method)(garbage, timeout=5))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search("malformed", refused.value.details() or "", re.I)
    finally:
        channel.close()
    assert_still_serving(cluster, leader)


def test_a_refusal_on_the_request_stream_leaves_it_open(cluster: Cluster):
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    channel = grpc.insecure_channel(cluster.nodes[follower].address)
    try:
        requests = [kv_pb2.StreamRequest(),  # names no operation
                    kv_pb2.StreamRequest(put=kv_pb2.PutRequest(key=b"", value=b"v")),
                    kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"never-written")),  # a follower: not the leader
                    kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"never-written", consistency=kv_pb2.STALE))]
        stream = channel.stream_stream("/raftkv.kv.KV/Stream", request_serializer=kv_pb2.StreamRequest.SerializeToString,
                                       response_deserializer=kv_pb2.StreamReply.FromString)
        nothing, empty_key, not_leader, stale = list(stream(iter(requests), timeout=5))
    finally:
        channel.close()
    assert (nothing.error.kind, empty_key.error.kind) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert "empty" in empty_key.error.message
    assert not_leader.error.kind == "NOT_LEADER"
    assert (not_leader.error.leader_id, not_leader.error.leader_address) == (leader, cluster.nodes[leader].address)
    assert stale.WhichOneof("reply") == "get" and not stale.get.found


def test_a_pipeline_answers_every_tagged_request_with_its_tag(cluster: Cluster):
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    refused = [kv_pb2.StreamRequest(),  # names no operation
               kv_pb2.StreamRequest(put=kv_pb2.PutRequest(key=b"", value=b"v")),
               kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"never-written"))]  # a follower: not the leader
    stale = kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"never-written", consistency=kv_pb2.STALE))
    messages = [kv_pb2.PipelineRequest(requests=[kv_pb2.TaggedRequest(tag=10 + i, request=r) for i, r in enumerate(refused)]),
                kv_pb2.PipelineRequest(requests=[kv_pb2.TaggedRequest(tag=99, request=stale)])]
    channel = grpc.insecure_channel(cluster.nodes[follower].address)
    try:
        pipeline = channel.stream_stream("/raftkv.kv.KV/Pipeline",
                                         request_serializer=kv_pb2.PipelineRequest.SerializeToString,
                                         response_deserializer=kv_pb2.PipelineReply.FromString)
        # The call ends once the client has half-closed and every request is answered.
        replies = {r.tag: r.reply for m in pipeline(iter(messages), timeout=5) for r in m.replies}
    finally:
        channel.close()
    assert sorted(replies) == [10, 11, 12, 99]
    assert (replies[10].error.kind, replies[11].error.kind) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert "empty" in replies[11].error.message
    assert replies[12].error.kind == "NOT_LEADER" and replies[12].error.leader_id == leader
    assert replies[99].WhichOneof("reply") == "get" and not replies[99].get.found


def test_the_peer_port_answers_a_member_with_its_id_and_client_address(cluster: Cluster):
    leader = cluster.wait_for_leader()
    cluster_id = cluster.status(leader)["cluster_id"]
    follower = next(n for n in cluster.nodes if n != leader)
    with connect(cluster, leader) as sock:
        reply = say_hello(sock, cluster_id, follower, leader)
        assert not reply.refusal
        assert (reply.node_id, reply.client_address) == (leader, cluster.nodes[leader].address)
        # The peer port is no gRPC port, nor the other way round.
        assert cluster.nodes[leader].peer_address != cluster.nodes[leader].address
    assert_still_serving(cluster, leader)


@pytest.mark.parametrize("case", ["unparsable hello", "oversized frame before the hello", "a gRPC client",
                                  "unparsable batch", "oversized frame after the hello", "another sender",
                                  "another addressee"])
def test_bad_bytes_on_the_peer_port_get_a_reason_and_a_close(cluster: Cluster, case: str):
    leader = cluster.wait_for_leader()
    status = cluster.status(leader)
    cluster_id, high_term = status["cluster_id"], status["term"] + 100
    follower, other = [n for n in cluster.nodes if n != leader]
    greeting = hello_frame(cluster_id, follower, leader)
    sent, stage, expected = {
        "unparsable hello": (frame(b"\xff" * 16), "hello", "malformed hello"),
        "oversized frame before the hello": (b"\xff\xff\xff\xff", "hello", "over the limit"),
        "a gRPC client": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "hello", "clients connect to a member's client address"),
        "unparsable batch": (greeting + b"\x00\x00\x00\x10" + b"\xff" * 16, "batch", "malformed peer message"),
        "oversized frame after the hello": (greeting + struct.pack(">I", MAX_FRAME_BYTES + 1), "batch", "over the limit"),
        # Heartbeats from a far higher term: had any reached the core, the leader would be deposed.
        "another sender": (greeting + heartbeat_batch(other, leader, high_term), "batch",
                           f"a message from '{other}' on the connection from '{follower}'"),
        "another addressee": (greeting + heartbeat_batch(follower, other, high_term), "batch",
                              "check --peers addresses"),
    }[case]
    with connect(cluster, leader) as sock:
        sock.sendall(sent)
        answer = raft_pb2.PeerHelloReply.FromString(read_frame(sock))
        if stage == "hello":
            assert expected in answer.refusal
        else:
            assert answer.node_id == leader and not answer.refusal
            assert expected in raft_pb2.Refusal.FromString(read_frame(sock)).reason
        assert_closed(sock)
    after = cluster.status(leader)
    assert after["role"] == "leader" and after["term"] == status["term"]  # nothing reached the core
    assert_still_serving(cluster, leader)


def test_a_peer_connection_takes_good_batches_until_a_bad_one(cluster: Cluster):
    """A refusal ends one connection only: the listener takes new ones, and a good batch (in two
    pieces, as TCP may deliver it) leaves its connection open until bad bytes follow."""
    leader = cluster.wait_for_leader()
    cluster_id = cluster.status(leader)["cluster_id"]
    follower = next(n for n in cluster.nodes if n != leader)
    with connect(cluster, leader) as sock:
        sock.sendall(b"\xff\xff\xff\xff")
        assert "malformed hello" in raft_pb2.PeerHelloReply.FromString(read_frame(sock)).refusal
        assert_closed(sock)
    good = frame(raft_pb2.MessageBatch().SerializeToString())
    with connect(cluster, leader) as sock:
        assert not say_hello(sock, cluster_id, follower, leader).refusal
        sock.sendall(good[:3])
        sock.sendall(good[3:] + b"\x00\x00\x00\x10" + b"\xff" * 16)
        # Had the good batch been refused, its reason would come back instead.
        assert "malformed peer message" in raft_pb2.Refusal.FromString(read_frame(sock)).reason
        assert_closed(sock)
    assert_still_serving(cluster, leader)
