"""One table of request limits through every face: the native API (kv.Client), etcd's gRPC API (on
the leader and on a follower, which checks before it forwards) and the embedded node each refuse
the same requests with INVALID_ARGUMENT and a message that names the limit, and accept those at the
limit (kv/server/request_checks.py). No refusal moves the leader or the term, every member keeps
serving, and the members agree (etcd's HashKV)."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

import kv.embedded
from kv import errors
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import STEADY_TIMING, Cluster, free_ports, hashes_agree

pytestmark = pytest.mark.integration

MAX_VALUE = 1 << 20  # --max-value-bytes' default
MAX_KEY = 32 << 10  # the key limit (statemachine/commands.py MAX_KEY_BYTES)
KEY_LIMIT = f"{MAX_KEY}-byte key limit"
VALUE_LIMIT = f"{MAX_VALUE}-byte maximum value size"


@dataclass(frozen=True)
class Case:
    name: str
    key: bytes
    value: bytes
    refusal: str | None  # a regex the message matches; None: accepted


CASES = [
    Case("a key at LMDB's limit", b"k" * 511, b"v", None),
    Case("a key one byte over LMDB's limit", b"k" * 512, b"v", None),
    Case("a key at the limit", b"k" * MAX_KEY, b"v", None),
    Case("a key one byte over", b"k" * (MAX_KEY + 1), b"v", KEY_LIMIT),
    Case("a 40000-byte key", b"k" * 40000, b"v", KEY_LIMIT),
    Case("an empty key", b"", b"v", "(?i)empty|not provided"),
    Case("a value at the limit", b"big", b"x" * MAX_VALUE, None),
    Case("a value one byte over", b"big", b"x" * (MAX_VALUE + 1), VALUE_LIMIT),
    Case("a 1.4 MiB value", b"big", b"x" * (1400 << 10), VALUE_LIMIT),
]

# A face's answer to a put of (key, value): None when accepted, else (code, message).
Answer = tuple[grpc.StatusCode, str] | None
Face = Callable[[bytes, bytes], Answer]


def native(call: Callable[[], object]) -> Answer:
    try:
        call()
    except errors.RaftKVError as e:
        return e.code, str(e)
    return None


def etcd(call: Callable[[], object]) -> Answer:
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return None


def etcd_faces(stub: etcd_rpc_pb2_grpc.KVStub) -> dict[str, Face]:
    def put(key: bytes, value: bytes) -> pb.RequestOp:
        return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))
    return {
        "Put": lambda k, v: etcd(lambda: stub.Put(pb.PutRequest(key=k, value=v), timeout=10)),
        "Txn": lambda k, v: etcd(lambda: stub.Txn(pb.TxnRequest(success=[put(k, v)]), timeout=10)),
        "a nested Txn": lambda k, v: etcd(lambda: stub.Txn(pb.TxnRequest(failure=[
            pb.RequestOp(request_txn=pb.TxnRequest(success=[put(k, v)]))]), timeout=10)),
    }


def check_table(faces: dict[str, Face]) -> None:
    for case in CASES:
        for face, send in faces.items():
            answer = send(case.key, case.value)
            if case.refusal is None:
                assert answer is None, (case.name, face, answer)
            else:
                assert answer is not None, (case.name, face, "accepted")
                code, message = answer
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (case.name, face, answer)
                assert re.search(case.refusal, message), (case.name, face, message)


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    cluster = make_cluster(3, extra_args=STEADY_TIMING)
    cluster.wait_for_leader()
    return cluster


def test_every_face_refuses_what_is_over_a_limit_and_the_cluster_goes_on(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    follower = next(node for node in cluster.nodes if node != leader)
    client = cluster.client()
    faces: dict[str, Face] = {
        "kv.Client.put": lambda k, v: native(lambda: client.put(k, v)),
        "kv.Client.batch": lambda k, v: native(lambda: client.batch(puts={k: v})),
    }
    faces |= {f"etcd {name} on the leader": send
              for name, send in etcd_faces(etcd_rpc_pb2_grpc.KVStub(cluster._channel(leader))).items()}
    faces |= {f"etcd {name} on a follower": send
              for name, send in etcd_faces(etcd_rpc_pb2_grpc.KVStub(cluster._channel(follower))).items()}
    check_table(faces)
    assert all(node.running for node in cluster.nodes.values())
    assert cluster.wait_for_leader() == leader and cluster.status(leader)["term"] == term
    for node in cluster.nodes:  # each member still serves a write and a read
        member = cluster.client([node])
        member.put(f"alive/{node}", "yes")
        assert member.get(f"alive/{node}") == b"yes"
    hashes_agree([node.address for node in cluster.nodes.values()])


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[kv.embedded.EmbeddedNode]:
    client_port, = free_ports(1)
    with kv.embedded.open(tmp_path / "e1", listen=f"127.0.0.1:{client_port}") as db:
        yield db


def test_the_embedded_node_refuses_the_same_table(embedded: kv.embedded.EmbeddedNode) -> None:
    check_table({
        "EmbeddedNode.put": lambda k, v: native(lambda: embedded.put(k, v)),
        "EmbeddedNode.batch": lambda k, v: native(lambda: embedded.batch(puts={k: v})),
    })
    assert embedded.get(b"k" * 511) == embedded.get(b"k" * 512) == embedded.get(b"k" * MAX_KEY) == b"v"
