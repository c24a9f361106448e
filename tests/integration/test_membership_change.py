"""Membership change on real processes (decision 0064), each under a recorded load whose history
is checked for linearizability at the end: replace a SIGKILLed member (add a learner, start it
with --join, promote it, remove the dead one); grow 3 -> 5 and shrink back; remove the leader;
move leadership while writing; a removed member that comes back is refused and stops.

Changes go through etcd's Cluster service (what `raftkv member` and etcdctl use), naming the new
member with the `raftkv-member-name` metadata as raftkv's client does."""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kv.tools.serve_command import EXIT_REMOVED
from raftkv_proto import etcd_rpc_pb2 as etcd_pb
from raftkv_proto import etcd_rpc_pb2_grpc as etcd_grpc
from tests.faults.history import History, Kind, Op, Outcome
from tests.faults.linearizability import check
from tests.faults.workload import Worker, Workload, key_names, perform_all
from tests.integration.cluster import FAST_TIMING, Cluster, module_cluster, wait_until

pytestmark = pytest.mark.slow

MEMBER_NAME_KEY = "raftkv-member-name"
KEYS = key_names(12)
# Operations a history holds before its check is worth making: the load runs until it has them
# (how many it makes during the membership changes themselves depends on the machine's speed).
ENOUGH_OPS = 50


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from module_cluster(tmp_path)  # a cluster of its own for each test: each changes its members


class Load:
    """Clients writing and reading through every member that runs, recorded in a history."""

    def __init__(self, cluster: Cluster, clients: int = 3) -> None:
        self.cluster = cluster
        self.history = History()
        rng = random.Random(7)
        workers = [Worker(f"w{i}", cluster.client(timeout=3.0), KEYS, self.history, random.Random(rng.random()))
                   for i in range(clients)]
        self.workload = Workload(workers).start()

    def ok_after(self, at_ns: int) -> list[Op]:
        return [op for op in self.history.ops() if op.outcome is Outcome.OK and op.call_ns >= at_ns]

    def finish(self, reader_ids: list[str]) -> None:
        """Once the history holds ENOUGH_OPS answered operations, stop, read every key through
        `reader_ids`, and check the whole history."""
        wait_until(f"{ENOUGH_OPS} answered operations", lambda: self.history.count(Outcome.OK) >= ENOUGH_OPS, 60.0)
        self.workload.stop()
        reader = self.cluster.client(reader_ids, timeout=5.0)
        for key in KEYS:
            def final_read() -> Op | None:
                op = perform_all(reader, "final", Kind.GET, key)[-1]
                return op if op.outcome is Outcome.OK else None
            self.history.append(wait_until(f"a final read of {key!r}", final_read, 30.0))
        result = check(self.history.ops())
        print(f"{self.history.summary()}; {result.report()}")
        assert result.ok, result.report()


def members_stub(cluster: Cluster, node_id: str) -> etcd_grpc.ClusterStub:
    return etcd_grpc.ClusterStub(cluster._channel(node_id))


def member_ids(cluster: Cluster, via: str) -> dict[str, tuple[int, bool]]:
    """name -> (etcd member ID, is learner), as `via` lists them."""
    listed = members_stub(cluster, via).MemberList(etcd_pb.MemberListRequest(), timeout=5.0)
    return {m.name: (m.ID, m.isLearner) for m in listed.members}


def with_retries(what: str, call: callable, timeout: float = 30.0) -> object:  # type: ignore[valid-type]
    """A membership call, retried while the cluster is between states (a change in progress, no
    leader yet after a kill): refusals of those kinds are UNAVAILABLE or FAILED_PRECONDITION."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            retryable = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION,
                                     grpc.StatusCode.DEADLINE_EXCEEDED)
            if not retryable or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {e.code().name}: {e.details()}") from None
        time.sleep(0.1)


def add_member(cluster: Cluster, via: str, name: str, learner: bool) -> None:
    peer = cluster.nodes[name].peer_address
    with_retries(f"add {name}", lambda: members_stub(cluster, via).MemberAdd(
        etcd_pb.MemberAddRequest(peerURLs=[f"http://{peer}"], isLearner=learner), timeout=10.0,
        metadata=[(MEMBER_NAME_KEY, name)]))


def promote(cluster: Cluster, via: str, name: str) -> None:
    with_retries(f"promote {name}", lambda: members_stub(cluster, via).MemberPromote(
        etcd_pb.MemberPromoteRequest(ID=member_ids(cluster, via)[name][0]), timeout=10.0), timeout=60.0)


def remove(cluster: Cluster, via: str, name: str) -> None:
    with_retries(f"remove {name}", lambda: members_stub(cluster, via).MemberRemove(
        etcd_pb.MemberRemoveRequest(ID=member_ids(cluster, via)[name][0]), timeout=10.0))


def configuration(cluster: Cluster, node_id: str) -> tuple[list[str], list[str]]:
    status = cluster.status(node_id)
    return sorted(status["voters"]), sorted(status["learners"])


def wait_configuration(cluster: Cluster, node_ids: list[str], voters: list[str], learners: list[str]) -> None:
    wait_until(f"{node_ids} to have voters {voters} and learners {learners}",
               lambda: all(configuration(cluster, n) == (voters, learners) for n in node_ids), 30.0)


def join(cluster: Cluster, name: str, via: str, learner: bool = True) -> None:
    """Add `name` (a learner by default), start it with --join, wait until it has caught up."""
    node = cluster.joining_member(name, join=[via])
    add_member(cluster, via, name, learner)
    node.start()
    leader = cluster.wait_for_leader(among=[n for n in cluster.nodes if n != name and cluster.nodes[n].running])
    target = cluster.status(leader)["commit_index"]
    cluster.wait_applied(name, target, timeout=60.0)


def test_a_sigkilled_member_is_replaced_by_a_learner_promoted_without_losing_a_write(cluster: Cluster) -> None:
    load = Load(cluster)
    wait_until("some writes", lambda: load.ok_after(0), 20.0)
    cluster.kill("n3")
    join(cluster, "n4", via="n1")
    assert configuration(cluster, "n4") == (["n1", "n2", "n3"], ["n4"])
    promote(cluster, "n1", "n4")
    remove(cluster, "n1", "n3")
    wait_configuration(cluster, ["n1", "n2", "n4"], ["n1", "n2", "n4"], [])
    # The new configuration decides on its own: n4 is one of two voters of three needed.
    cluster.kill("n2")
    leader = cluster.wait_for_leader(among=["n1", "n4"])
    assert leader in ("n1", "n4")
    at = time.monotonic_ns()
    wait_until("a write after n2's death", lambda: load.ok_after(at), 20.0)
    cluster.start_node("n2")
    load.finish(["n1", "n2", "n4"])


@pytest.fixture
def snapshotting(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster whose members snapshot, and compact their logs, every 100 entries."""
    yield from module_cluster(tmp_path, extra_args=(*FAST_TIMING, "--snapshot-threshold", "100"))


def test_a_member_joins_by_snapshot_and_restarts_from_it(snapshotting: Cluster) -> None:
    """A new member whose leader compacted its log gets the snapshot, and with it the members
    (the configuration is part of every snapshot); promoted, killed and restarted, it comes back
    from what it installed as a voter, and a leader can be elected with it."""
    cluster = snapshotting
    with cluster.client() as client:
        for i in range(400):
            client.put(b"s%d" % i, b"v%d" % i)
    leader = cluster.wait_for_leader()
    wait_until("the leader to compact its log", lambda: cluster.status(leader)["log_begin_index"] > 1, 30.0)
    join(cluster, "n4", via="n1")
    assert cluster.status("n4")["snapshot_index"] > 0  # it installed a snapshot
    promote(cluster, "n1", "n4")
    wait_configuration(cluster, ["n1", "n2", "n3", "n4"], ["n1", "n2", "n3", "n4"], [])
    cluster.restart("n4")
    cluster.kill("n1")  # with n1 down, n2, n3 and n4 are the quorum: n4 must vote
    cluster.kill("n2")
    cluster.start_node("n2")
    cluster.wait_for_leader(among=["n2", "n3", "n4"])
    assert configuration(cluster, "n4") == (["n1", "n2", "n3", "n4"], [])
    with cluster.client(["n2", "n3", "n4"]) as client:
        assert client.get(b"s399") == b"v399"


def test_the_cluster_grows_to_five_and_shrinks_back(cluster: Cluster) -> None:
    load = Load(cluster)
    for name in ("n4", "n5"):
        join(cluster, name, via="n1")
        promote(cluster, "n1", name)
    everyone = ["n1", "n2", "n3", "n4", "n5"]
    wait_configuration(cluster, everyone, everyone, [])
    # Five voters: two may die.
    cluster.kill("n1")
    cluster.kill("n2")
    cluster.wait_for_leader(among=["n3", "n4", "n5"])
    at = time.monotonic_ns()
    wait_until("a write with two of five down", lambda: load.ok_after(at), 20.0)
    cluster.start_node("n1")
    cluster.start_node("n2")
    for name in ("n5", "n4"):
        remove(cluster, "n1", name)
    wait_configuration(cluster, ["n1", "n2", "n3"], ["n1", "n2", "n3"], [])
    load.finish(["n1", "n2", "n3"])


def test_a_removed_leader_steps_down_and_the_others_go_on(cluster: Cluster) -> None:
    load = Load(cluster)
    leader = cluster.wait_for_leader()
    others = [n for n in cluster.nodes if n != leader]
    remove(cluster, others[0], leader)
    new = cluster.wait_for_leader(among=others)
    assert new != leader
    wait_configuration(cluster, others, others, [])
    assert cluster.nodes[leader].wait_exit() == EXIT_REMOVED
    assert "removed from the cluster" in cluster.nodes[leader].log_tail(200)
    at = time.monotonic_ns()
    wait_until("a write after the leader's removal", lambda: load.ok_after(at), 20.0)
    load.finish(others)


def test_a_removed_member_that_comes_back_is_refused_and_stops(cluster: Cluster) -> None:
    cluster.kill("n3")
    remove(cluster, "n1", "n3")
    wait_configuration(cluster, ["n1", "n2"], ["n1", "n2"], [])
    with cluster.client(["n1", "n2"]) as client:
        client.put(b"after-removal", b"1")
    cluster.start_node("n3")
    assert cluster.nodes["n3"].wait_exit() == EXIT_REMOVED
    assert "removed from the cluster" in cluster.nodes["n3"].log_tail(200)
    # It disturbed nothing: same leader, same term.
    leader = cluster.wait_for_leader(among=["n1", "n2"])
    term = cluster.status(leader)["term"]
    with cluster.client(["n1", "n2"]) as client:
        client.put(b"after-return", b"1")
    assert cluster.status(leader)["term"] == term
    # And the id is never a member again.
    with pytest.raises(AssertionError, match="removed from this cluster"):
        add_member(cluster, "n1", "n3", learner=True)


def test_leadership_moves_while_writing_with_a_stall_of_about_a_round_trip(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    target = next(n for n in cluster.nodes if n != leader)
    maintenance = etcd_grpc.MaintenanceStub(cluster._channel(leader))
    target_id = member_ids(cluster, leader)[target][0]
    acked: list[float] = []  # when each put was acknowledged
    moved: list[float] = []  # when MoveLeader was called, and when it returned

    def move() -> None:
        moved.append(time.monotonic())
        maintenance.MoveLeader(etcd_pb.MoveLeaderRequest(targetID=target_id), timeout=10.0)
        moved.append(time.monotonic())

    mover = threading.Thread(target=move)
    with cluster.client(timeout=5.0) as client:
        for n in range(600):
            client.put(b"transfer-%d" % n, b"v")
            acked.append(time.monotonic())
            if n == 200:
                mover.start()
    mover.join()
    assert cluster.wait_for_leader() == target
    gaps = [b - a for a, b in zip(acked, acked[1:])]
    during = [b - a for a, b in zip(acked, acked[1:]) if b >= moved[0] and a <= moved[1]]
    print(f"leadership transfer: MoveLeader took {(moved[1] - moved[0]) * 1000:.1f} ms; the longest gap between "
          f"two acknowledged puts meanwhile {max(during) * 1000:.1f} ms (median put {sorted(gaps)[len(gaps) // 2] * 1000:.1f} ms)")
