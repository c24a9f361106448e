"""Bad input gets its own error, and the node keeps serving."""
from __future__ import annotations

import re
import socket
import struct

import grpc
import pytest

from kv.errors import InvalidArgumentError
from raftkv_proto import kv_pb2, raft_pb2
from raft.transport.frames import frame
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration

MAX_VALUE = 1024


@pytest.fixture
def small_values(make_cluster) -> Cluster:
    from tests.integration.cluster import FAST_TIMING

    cluster = make_cluster(3, extra_args=(*FAST_TIMING, "--max-value-bytes", str(MAX_VALUE)))
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
    with pytest.raises(InvalidArgumentError, match="511"):
        client.put(b"k" * 512, "v")
    with pytest.raises(InvalidArgumentError):
        client.batch(puts={b"ok": b"v", b"k" * 512: b"v"})
    with pytest.raises(InvalidArgumentError, match=str(MAX_VALUE)):
        client.put("big", b"x" * (MAX_VALUE + 1))
    assert client.get("ok") is None  # the refused batch changed nothing
    # The limits themselves are allowed.
    client.put(b"k" * 511, b"x" * MAX_VALUE)
    assert client.get(b"k" * 511) == b"x" * MAX_VALUE
    assert_still_serving(cluster, leader)


def peer_batch(cluster_id: str, from_id: str, to: str, term: int) -> raft_pb2.MessageBatch:
    # A heartbeat from a far higher term: accepted, it would depose the leader.
    message = raft_pb2.PeerMessage(src=from_id, dst=to, term=term,
                                   heartbeat_request=raft_pb2.HeartbeatRequest(commit_index=0, seq=1))
    return raft_pb2.MessageBatch(cluster_id=cluster_id, from_id=from_id, messages=[message])


def test_peer_messages_from_another_cluster_or_an_unknown_member_are_refused(cluster: Cluster):
    leader = cluster.wait_for_leader()
    status = cluster.status(leader)
    follower = next(n for n in cluster.nodes if n != leader)
    stub = cluster.peer_stub(leader)
    refused_batches = {
        "wrong cluster id": peer_batch("not-" + status["cluster_id"], follower, leader, status["term"] + 100),
        "unknown member": peer_batch(status["cluster_id"], "n99", leader, status["term"] + 100),
    }
    for expected, batch in refused_batches.items():
        with pytest.raises(grpc.RpcError) as refused:
            stub.Send(batch, timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert expected in refused.value.details()
    after = cluster.status(leader)
    assert after["role"] == "leader" and after["term"] == status["term"]  # the high term was ignored
    assert_still_serving(cluster, leader)


@pytest.mark.parametrize("method", ["/raftkv.raft.RaftPeer/Send", "/raftkv.kv.KV/Put", "/raftkv.kv.KV/Get"])
def test_garbage_bytes_are_refused(cluster: Cluster, method: str):
    leader = cluster.wait_for_leader()
    channel = grpc.insecure_channel(cluster.nodes[leader].address)
    try:
        send_raw = channel.unary_unary(method)  # no serializers: the bytes go out as they are
        for garbage in (b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256))):
            with pytest.raises(grpc.RpcError) as refused:
                send_raw(garbage, timeout=5)
            # The server parses requests itself (raft/transport/input_checks.py) and says so.
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert re.search("malformed", refused.value.details() or "", re.I)
    finally:
        channel.close()
    assert_still_serving(cluster, leader)


@pytest.mark.parametrize("method", ["/raftkv.kv.KV/Stream", "/raftkv.kv.KV/Pipeline", "/raftkv.raft.RaftPeer/Stream",
                                    "/raftkv.raft.RaftPeer/InstallSnapshot"])
def test_garbage_on_a_stream_is_refused(cluster: Cluster, method: str):
    leader = cluster.wait_for_leader()
    channel = grpc.insecure_channel(cluster.nodes[leader].address)
    try:
        garbage = iter([b"\xff" * 64])  # no serializers: the bytes go out as they are
        with pytest.raises(grpc.RpcError) as refused:
            if method.startswith("/raftkv.kv.KV/"):
                list(channel.stream_stream(method)(garbage, timeout=5))
            else:
                channel.stream_unary(method)(garbage, timeout=5)
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


def hello(cluster: Cluster, node_id: str, cluster_id: str, from_id: str) -> raft_pb2.HelloReply:
    return cluster.peer_stub(node_id).Hello(raft_pb2.HelloRequest(cluster_id=cluster_id, from_id=from_id), timeout=5)


def test_hello_tells_a_member_the_message_port_and_refuses_strangers(cluster: Cluster):
    leader = cluster.wait_for_leader()
    cluster_id = cluster.status(leader)["cluster_id"]
    follower = next(n for n in cluster.nodes if n != leader)
    grpc_port = int(cluster.nodes[leader].address.rpartition(":")[2])
    port = hello(cluster, leader, cluster_id, follower).message_port
    assert port != 0 and port != grpc_port  # 0 would mean "no listener: use the gRPC Stream"
    assert hello(cluster, leader, cluster_id, follower).message_port == port  # the same listener each time
    for expected, (wrong_cluster, from_id) in {"wrong cluster id": ("not-" + cluster_id, follower),
                                               "unknown member id": (cluster_id, "n99")}.items():
        with pytest.raises(grpc.RpcError) as refused:
            hello(cluster, leader, wrong_cluster, from_id)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert expected in (refused.value.details() or "")
    assert_still_serving(cluster, leader)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """recv may return part of what was sent; b"" (closed) before n bytes fails the test."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"connection closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def refusal(sock: socket.socket) -> str:
    """The one frame a node sends back on a refused message connection: its reason. The node must
    then close the connection (a timeout here fails the test)."""
    (length,) = struct.unpack(">I", recv_exactly(sock, 4))
    assert 0 < length < 64 << 10, f"a reason of {length} bytes"
    reason = recv_exactly(sock, length).decode()
    assert sock.recv(1) == b"", "the node kept the connection open after refusing it"
    return reason


def message_connection(cluster: Cluster, node_id: str, cluster_id: str, from_id: str) -> socket.socket:
    """A TCP connection to the node's message port, found as peers find it: with Hello."""
    port = hello(cluster, node_id, cluster_id, from_id).message_port
    assert port != 0
    host = cluster.nodes[node_id].address.rpartition(":")[0].strip("[]")
    return socket.create_connection((host, port), timeout=5)


@pytest.mark.parametrize("case", ["unparsable frame", "oversized frame header", "wrong cluster id",
                                  "unknown member", "wrong addressee"])
def test_bad_bytes_on_the_message_port_get_a_reason_and_a_close(cluster: Cluster, case: str):
    leader = cluster.wait_for_leader()
    status = cluster.status(leader)
    cluster_id, high_term = status["cluster_id"], status["term"] + 100
    follower, other = [n for n in cluster.nodes if n != leader]
    sent, expected = {
        "unparsable frame": (b"\x00\x00\x00\x10" + b"\xff" * 16, "malformed peer message"),
        "oversized frame header": (b"\xff\xff\xff\xff", "malformed peer message"),
        # Heartbeats from a far higher term: had any reached the core, the leader would be deposed.
        "wrong cluster id": (frame(peer_batch("not-" + cluster_id, follower, leader, high_term).SerializeToString()),
                             "wrong cluster id"),
        "unknown member": (frame(peer_batch(cluster_id, "n99", leader, high_term).SerializeToString()),
                           "unknown member id"),
        "wrong addressee": (frame(peer_batch(cluster_id, follower, other, high_term).SerializeToString()),
                            "check --peers addresses"),
    }[case]
    with message_connection(cluster, leader, cluster_id, follower) as sock:
        sock.sendall(sent)
        assert expected in refusal(sock)
    after = cluster.status(leader)
    assert after["role"] == "leader" and after["term"] == status["term"]  # nothing reached the core
    assert_still_serving(cluster, leader)


def test_a_message_connection_takes_good_batches_until_a_bad_one(cluster: Cluster):
    """A refusal ends one connection only: the listener takes new ones, and a good batch (in two
    pieces, as TCP may deliver it) leaves its connection open until bad bytes follow."""
    leader = cluster.wait_for_leader()
    cluster_id = cluster.status(leader)["cluster_id"]
    follower = next(n for n in cluster.nodes if n != leader)
    with message_connection(cluster, leader, cluster_id, follower) as sock:
        sock.sendall(b"\xff\xff\xff\xff")
        assert "malformed peer message" in refusal(sock)
    good = frame(raft_pb2.MessageBatch(cluster_id=cluster_id, from_id=follower).SerializeToString())
    with message_connection(cluster, leader, cluster_id, follower) as sock:
        sock.sendall(good[:3])
        sock.sendall(good[3:] + b"\x00\x00\x00\x10" + b"\xff" * 16)
        # Had the good batch been refused, its reason would come back instead.
        assert "malformed peer message" in refusal(sock)
    assert_still_serving(cluster, leader)
