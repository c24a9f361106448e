"""Crashes: the leader SIGKILLed under load, every node SIGKILLed and restarted."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import grpc
import pytest

from kv.errors import NotLeaderError, RaftKVError, from_rpc_error
from raftkv_proto import kv_pb2
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


@dataclass
class Writer:
    """Writes 1, 2, 3, ... to its own counter key, one write after another, and a unique key per
    write. It records which writes were acknowledged and which had an unknown outcome."""

    name: str
    acked: dict[bytes, bytes] = field(default_factory=dict)
    unknown: dict[bytes, bytes] = field(default_factory=dict)
    applied_twice: list[bytes] = field(default_factory=list)
    last_acked: int = 0
    last_tried: int = 0

    @property
    def counter_key(self) -> bytes:
        return f"counter/{self.name}".encode()

    def run(self, client, stop: threading.Event, progress: threading.Semaphore) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            self.last_tried = n
            key, value = f"w/{self.name}/{n:06d}".encode(), str(n).encode()
            try:
                existed = client.batch(puts={key: value, self.counter_key: value})
            except RaftKVError:
                self.unknown[key] = value  # timed out or no leader: may or may not be applied
                continue
            if len(existed) != 2 or existed[0]:
                # The key is new: only a second application of this very batch (a retry not
                # recognised as one) can have found it already there.
                self.applied_twice.append(key)
            self.acked[key] = value
            self.last_acked = n
            progress.release()


def run_writers(cluster: Cluster, count: int) -> tuple[list[Writer], threading.Event, threading.Semaphore, list[threading.Thread]]:
    stop, progress = threading.Event(), threading.Semaphore(0)
    writers = [Writer(f"t{i}") for i in range(count)]
    threads = [threading.Thread(target=w.run, args=(cluster.client(timeout=10.0), stop, progress), daemon=True)
               for w in writers]
    for t in threads:
        t.start()
    return writers, stop, progress, threads


def await_acks(progress: threading.Semaphore, n: int, timeout: float = 30.0) -> None:
    for _ in range(n):
        assert progress.acquire(timeout=timeout), "writers stopped making progress"


def test_sigkill_leader_while_writing(cluster: Cluster):
    old_leader = cluster.wait_for_leader()
    old_term = cluster.status(old_leader)["term"]
    writers, stop, progress, threads = run_writers(cluster, 4)
    try:
        await_acks(progress, 100)
        cluster.kill(old_leader)
        new_leader = cluster.wait_for_leader(not_in_term=old_term)
        await_acks(progress, 200)  # the new leader serves writes
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert new_leader != old_leader

    reader = cluster.client()
    for writer in writers:
        assert not writer.applied_twice, f"retried writes applied again: {writer.applied_twice[:5]}"
        stored = dict(reader.scan(prefix=f"w/{writer.name}/", limit=1_000_000))
        # Every acknowledged write is there, with its value.
        missing = {k: v for k, v in writer.acked.items() if stored.get(k) != v}
        assert not missing, f"acknowledged writes lost: {sorted(missing)[:5]}"
        # Nothing appears that was never written.
        assert set(stored) <= set(writer.acked) | set(writer.unknown)
        # Applied at most once: had an earlier write been applied again after a later one, the
        # counter would have gone back.
        counter = int(reader.get(writer.counter_key))
        assert writer.last_acked <= counter <= writer.last_tried
        assert stored[f"w/{writer.name}/{counter:06d}".encode()] == str(counter).encode()

    # The old leader comes back as a follower and converges on the new leader's log.
    cluster.restart(old_leader)
    index = reader.put("rejoined", old_leader)
    cluster.wait_applied(old_leader, index)
    assert cluster.client([old_leader]).get("rejoined", consistency="stale") == old_leader.encode()


def test_a_replayed_write_is_not_applied_again_by_a_new_leader(cluster: Cluster):
    old_leader = cluster.wait_for_leader()
    old_term = cluster.status(old_leader)["term"]
    stub = cluster.kv_stub(old_leader)
    client_id = stub.RegisterClient(kv_pb2.RegisterClientRequest(name="replay"), timeout=10).client_id
    header = kv_pb2.WriteHeader(client_id=client_id, seq=1)
    first = stub.Put(kv_pb2.PutRequest(key=b"once", value=b"original", header=header), timeout=10)
    for node_id in cluster.nodes:  # every member has the write, and its session
        cluster.wait_applied(node_id, first.index)

    cluster.kill(old_leader)
    new_leader = cluster.wait_for_leader(not_in_term=old_term)
    # The same (client id, seq) again, as a client retrying a write it never saw answered; the
    # different value shows whether the write was applied a second time.
    replay = kv_pb2.PutRequest(key=b"once", value=b"replayed", header=header)
    cluster.kv_stub(new_leader).Put(replay, timeout=10)
    assert cluster.client().get("once") == b"original"


def test_sigkill_and_restart_every_node(cluster: Cluster):
    client = cluster.client()
    acked = {f"d/{i:04d}".encode(): f"v{i}".encode() for i in range(300)}
    for start in range(0, 300, 50):
        client.batch(puts=dict(list(acked.items())[start:start + 50]))
    last = client.put("d/last", "yes")
    acked[b"d/last"] = b"yes"
    leader = cluster.wait_for_leader()
    applied_before = {node_id: s["applied_index"] for node_id, s in cluster.statuses().items()}
    assert applied_before[leader] >= last

    for node_id in cluster.nodes:
        cluster.kill(node_id)
    for node_id in cluster.nodes:
        cluster.start_node(node_id)
    cluster.wait_for_leader()

    reader = cluster.client(timeout=20.0)
    assert dict(reader.scan(prefix="d/", limit=1000)) == acked
    # The applied index resumes where it was: nothing reapplied from zero, nothing lost.
    for node_id, before in applied_before.items():
        status = cluster.wait_applied(node_id, before)
        assert status["applied_index"] >= before
    assert reader.put("after", "restart") > last


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
def test_restarted_follower_catches_up(cluster: Cluster, stop: str):
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    client = cluster.client()
    client.put("before", "1")
    if stop == "sigterm":
        assert cluster.terminate(follower) == 0  # serve stops cleanly
    else:
        cluster.kill(follower)
    for i in range(100):
        index = client.put(f"while-down/{i}", str(i))
    cluster.start_node(follower)
    cluster.wait_applied(follower, index)
    assert cluster.client([follower]).get("while-down/99", consistency="stale") == b"99"


def test_raw_follower_answers_not_leader_with_the_leader_address(cluster: Cluster):
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    with pytest.raises(grpc.RpcError) as refused:
        cluster.kv_stub(follower).Put(kv_pb2.PutRequest(key=b"k", value=b"v"), timeout=5)
    error = from_rpc_error(refused.value)
    assert isinstance(error, NotLeaderError)
    assert error.leader_address == cluster.nodes[leader].address
