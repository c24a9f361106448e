"""Random operations through both client APIs of one node, against one model: the native API
(kv.Client) and etcd's gRPC API must give the same answers for the same store, and refuse the same
requests (keys and values around every limit) with INVALID_ARGUMENT."""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kv.embedded
from kv import Client, errors
from raft.node.config import Limits
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import free_ports

pytestmark = pytest.mark.integration

MAX_VALUE = 256
_examples = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kv.embedded.EmbeddedNode]:
    port, = free_ports(1)
    path: Path = tmp_path_factory.mktemp("faces")
    with kv.embedded.open(path, listen=f"127.0.0.1:{port}", limits=Limits(max_value_bytes=MAX_VALUE)) as db:
        yield db


class Faces:
    """Both APIs of one node, each answering as (accepted, what it returned)."""

    def __init__(self, address: str) -> None:
        self.native = Client([address], timeout=10)
        self.channel = grpc.insecure_channel(address)
        self.etcd = etcd_rpc_pb2_grpc.KVStub(self.channel)

    def close(self) -> None:
        self.native.close()
        self.channel.close()

    def put(self, face: str, key: bytes, value: bytes) -> bool:
        """Whether the put was accepted; a refusal must be INVALID_ARGUMENT."""
        try:
            if face == "native":
                self.native.put(key, value)
            else:
                self.etcd.Put(pb.PutRequest(key=key, value=value), timeout=10)
        except errors.InvalidArgumentError:
            return False
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            return False
        return True

    def get(self, face: str, key: bytes) -> bytes | None:
        if face == "native":
            return self.native.get(key)
        kvs = self.etcd.Range(pb.RangeRequest(key=key), timeout=10).kvs
        return kvs[0].value if kvs else None

    def delete(self, face: str, key: bytes) -> bool:
        if face == "native":
            return self.native.delete(key)
        return self.etcd.DeleteRange(pb.DeleteRangeRequest(key=key), timeout=10).deleted == 1

    def count(self, prefix: bytes) -> int:
        """The keys under `prefix`, by etcd's Range and by the native scan, which must agree."""
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        counted = self.etcd.Range(pb.RangeRequest(key=prefix, range_end=end, count_only=True), timeout=10).count
        assert counted == len(self.native.scan(prefix=prefix, limit=1000))
        return counted


@pytest.fixture(scope="module")
def faces(node: kv.embedded.EmbeddedNode) -> Iterator[Faces]:
    both = Faces(node.address)
    yield both
    both.close()


MAX_KEY = 32 << 10  # the key limit (statemachine/commands.py MAX_KEY_BYTES)
# Key lengths at and around every limit (the key itself gets a per-example prefix of 8 bytes).
KEY_LENGTHS = st.sampled_from([0, 1, 5, 502, 503, 504, 600, 32759, 32760, 32761])
VALUE_LENGTHS = st.sampled_from([0, 1, MAX_VALUE - 1, MAX_VALUE, MAX_VALUE + 1, 3 * MAX_VALUE])
OPS = st.lists(st.tuples(st.sampled_from(["put", "get", "delete"]), st.sampled_from(["native", "etcd"]),
                         KEY_LENGTHS, st.integers(0, 3), VALUE_LENGTHS), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_both_faces_answer_as_one_model(faces: Faces, ops: list[tuple[str, str, int, int, int]]) -> None:
    prefix = b"p%06d/" % next(_examples)  # each example starts from an empty part of the store
    model: dict[bytes, bytes] = {}
    for kind, face, length, variant, value_length in ops:
        key = (prefix + bytes([97 + variant]) * length)[:length + len(prefix)] if length else b""
        value = bytes([48 + variant]) * value_length
        valid_key = 0 < len(key) <= MAX_KEY
        if kind == "put":
            accepted = faces.put(face, key, value)
            assert accepted == (valid_key and value_length <= MAX_VALUE), (face, len(key), value_length)
            if accepted:
                model[key] = value
        elif not valid_key:
            with pytest.raises((errors.InvalidArgumentError, grpc.RpcError)):
                faces.get(face, key) if kind == "get" else faces.delete(face, key)
        elif kind == "get":
            assert faces.get(face, key) == model.get(key), (face, len(key))
        else:
            assert faces.delete(face, key) == (key in model), (face, len(key))
            model.pop(key, None)
    assert faces.count(prefix) == len(model)
