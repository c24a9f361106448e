"""Client sessions on real `raftkv serve` processes: no other client can write in a kv.Client's
session, whether it reuses the client's name, guesses its id, or jumps its sequence far ahead."""
from __future__ import annotations

import grpc
import pytest
from raftkv_proto import kv_pb2

from kv import Client
from kv.errors import RaftKVError, from_rpc_error
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


def own_session(client: Client) -> tuple[str, int]:
    """The calling thread's client id in `client` and the seq its next write will carry."""
    session = client._local.session
    return session.client_id, session.next_seq


def forged_ids(client: Client) -> list[str]:
    """The ids another client can know or guess for `client`'s writes: the name it was given,
    its client id with any secret part replaced (the registration index is guessable)."""
    client_id, _ = own_session(client)
    ids = [client.client_id]
    index, dot, secret = client_id.partition(".")
    if dot:
        ids += [f"{index}.{'0' * len(secret)}", f"{index}.{secret[:-1]}{'1' if secret[-1] == '0' else '0'}"]
    return list(dict.fromkeys(ids))


def forge(cluster: Cluster, key: bytes, value: bytes, client_id: str, seq: int) -> RaftKVError | None:
    """A write sent by hand to the leader under `client_id`; the error it got, or None."""
    stub = cluster.kv_stub(cluster.wait_for_leader())
    header = kv_pb2.WriteHeader(client_id=client_id, seq=seq)
    try:
        stub.Put(kv_pb2.PutRequest(key=key, value=value, header=header), timeout=10)
    except grpc.RpcError as error:
        return from_rpc_error(error)
    return None


def test_a_second_client_with_the_same_id_and_the_next_seq_does_not_take_the_first_ones_write(cluster: Cluster):
    first = cluster.client(client_id="app")
    first.put("a/1", "mine")
    _, next_seq = own_session(first)
    refusals = [forge(cluster, b"a/2", b"forged", client_id, next_seq) for client_id in forged_ids(first)]

    first.put("a/2", "mine")  # its next seq: must really be applied, not answered as a duplicate
    reader = cluster.client()
    assert reader.get("a/2") == b"mine"
    assert reader.get("a/1") == b"mine"
    assert [getattr(r, "kind", None) for r in refusals] == ["UNKNOWN_SESSION"] * len(refusals)


def test_a_far_ahead_seq_under_a_clients_id_does_not_brick_it(cluster: Cluster):
    first = cluster.client(client_id="app")
    first.put("b/0", "mine")
    _, next_seq = own_session(first)
    refusals = [forge(cluster, b"b/forged", b"forged", client_id, next_seq + 10**12)
                for client_id in forged_ids(first)]

    for i in range(1, 4):  # its own later writes are applied, and read back
        first.put(f"b/{i}", f"mine-{i}")
    reader = cluster.client()
    assert dict(reader.scan(prefix="b/")) == {b"b/0": b"mine", b"b/1": b"mine-1", b"b/2": b"mine-2",
                                             b"b/3": b"mine-3"}
    assert [getattr(r, "kind", None) for r in refusals] == ["UNKNOWN_SESSION"] * len(refusals)


def test_two_clients_given_the_same_name_write_side_by_side(cluster: Cluster):
    one, two = cluster.client(client_id="same"), cluster.client(client_id="same")
    for i in range(5):
        one.put(f"c/one/{i}", "1")
        two.put(f"c/two/{i}", "2")
    assert own_session(one)[0] != own_session(two)[0]
    assert len(cluster.client().scan(prefix="c/", limit=100)) == 10


def test_a_retry_in_a_registered_session_is_applied_once_on_every_member(cluster: Cluster):
    leader = cluster.wait_for_leader()
    stub = cluster.kv_stub(leader)
    client_id = stub.RegisterClient(kv_pb2.RegisterClientRequest(name="by-hand"), timeout=10).client_id
    header = kv_pb2.WriteHeader(client_id=client_id, seq=1)
    first = stub.Put(kv_pb2.PutRequest(key=b"d", value=b"original", header=header), timeout=10)
    again = stub.Put(kv_pb2.PutRequest(key=b"d", value=b"replayed", header=header), timeout=10)
    assert again.index > first.index
    for node_id in cluster.nodes:
        cluster.wait_applied(node_id, again.index)
        assert cluster.client([node_id]).get("d", consistency="stale") == b"original"
