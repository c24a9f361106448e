"""Processes stopped with SIGSTOP and continued with SIGCONT: a lagging follower catches up; a
deposed leader never serves a stale linearizable read."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kv.errors import NotLeaderError, from_rpc_error
from raftkv_proto import kv_pb2
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration

WRITES = 5000
WRITER_THREADS = 8


def test_paused_follower_catches_up_after_5000_writes(cluster: Cluster):
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    live = [n for n in cluster.nodes if n != follower]
    client = cluster.client(live, timeout=20.0)
    cluster.pause(follower)

    def write(thread: int) -> int:
        return max(client.put(f"c/{i:05d}", f"v{i}") for i in range(thread, WRITES, WRITER_THREADS))

    with ThreadPoolExecutor(WRITER_THREADS) as pool:
        last_index = max(pool.map(write, range(WRITER_THREADS)))
    assert cluster.status(follower, timeout=0.3).get("error")  # it really was stopped meanwhile

    cluster.resume(follower)
    status = cluster.wait_applied(follower, last_index, timeout=120.0)
    assert status["role"] == "follower" and status["leader"] == leader
    caught_up = cluster.client([follower])
    for i in (0, 1234, WRITES - 1):
        assert caught_up.get(f"c/{i:05d}", consistency="stale") == f"v{i}".encode()
    assert len(caught_up.scan(prefix="c/", limit=WRITES + 1, consistency="stale")) == WRITES


def linearizable_get(key: bytes) -> kv_pb2.GetRequest:
    return kv_pb2.GetRequest(key=key, consistency=kv_pb2.LINEARIZABLE)


def answer_of(call: grpc.Future) -> bytes | NotLeaderError:
    """What a node answered a Get: its value, or the NOT_LEADER it refused with. Any other
    answer fails the test."""
    try:
        response = call.result()
    except grpc.RpcError as rpc_error:
        error = from_rpc_error(rpc_error)
        if isinstance(error, NotLeaderError):
            return error
        raise AssertionError(f"expected the new value or NOT_LEADER, got {error.kind}: {error}") from None
    assert response.found
    return response.value


def test_deposed_leader_never_serves_a_stale_linearizable_read(cluster: Cluster):
    old_leader = cluster.wait_for_leader()
    old_term = cluster.status(old_leader)["term"]
    index = cluster.client().put("k", "old")
    for node_id in cluster.nodes:
        cluster.wait_applied(node_id, index)

    stub = cluster.kv_stub(old_leader)
    stub.Status(kv_pb2.StatusRequest(), timeout=5)  # connected before the pause
    cluster.pause(old_leader)
    others = [n for n in cluster.nodes if n != old_leader]
    new_leader = cluster.wait_for_leader(among=others, not_in_term=old_term)
    assert cluster.client(others).put("k", "new") > index

    # Reads sent while it is still stopped, so they are among the first things it sees on waking
    # up, before it hears of the new term; then more while it finds out.
    early = [stub.Get.future(linearizable_get(b"k"), timeout=10) for _ in range(8)]
    cluster.resume(old_leader)
    later = [stub.Get.future(linearizable_get(b"k"), timeout=10) for _ in range(20)]
    answers = [answer_of(call) for call in early + later]

    stale = [a for a in answers if a == b"old"]
    assert not stale, f"{len(stale)} of {len(answers)} reads on the deposed leader returned the old value"
    assert all(a == b"new" or isinstance(a, NotLeaderError) for a in answers)
    hints = {a.leader_id for a in answers if isinstance(a, NotLeaderError) and a.leader_id}
    assert hints <= {new_leader}
    cluster.wait_for_leader()  # the old leader rejoins as a follower
