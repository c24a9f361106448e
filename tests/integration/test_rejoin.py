"""The recovery of a member whose data is lost (a corrupt log, a dead disk): stop it, remove its
data directory, start it again with the same id and peers. It asks its peers what the cluster
holds, rejoins (voting for no candidate less up to date than its peers until it has caught up),
and an idle leader, which has no appends for it to refuse, brings it up to date at once."""
from __future__ import annotations

import shutil
import threading

import pytest

from kv.server.data_dir import REJOINING_FILE
from tests.integration.cluster import STEADY_TIMING, Cluster, wait_until

pytestmark = pytest.mark.integration


def test_a_wiped_follower_rejoins_and_an_idle_leader_catches_it_up(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    with cluster.client() as client:
        for i in range(200):
            client.put(f"k{i:03d}", f"v{i}")
    follower = next(n for n in cluster.nodes if n != leader)
    status = cluster.status(leader)
    cluster.wait_applied(follower, status["commit_index"])
    # The leader learns what the follower holds from its next acknowledgement, which can come after
    # this status was read (the other follower's made the commit): ask the leader again until it
    # knows the follower holds everything. From here on only a heartbeat can tell it otherwise.
    wait_until(f"the leader to know that {follower} holds index {status['commit_index']}",
               lambda: cluster.status(leader)["peers"][follower] >= status["commit_index"])

    cluster.kill(follower)
    data_dir = cluster.nodes[follower].spec.data_dir
    shutil.rmtree(data_dir)
    cluster.start_node(follower)

    # No writes from here on: only heartbeats can tell the leader that the follower lost its log.
    def caught_up() -> dict | None:
        mine, theirs = cluster.status(follower), cluster.status(leader)
        done = (mine["applied_index"] >= theirs["commit_index"] and not mine["rejoining"]
                and theirs["peers"].get(follower) == theirs["last_index"])
        return mine if done else None

    mine = wait_until("the wiped follower to catch up", caught_up, timeout=20.0)
    assert mine["term"] >= status["term"]
    assert not (data_dir / REJOINING_FILE).exists()  # caught up: it votes freely again
    with cluster.client([follower]) as client:
        assert client.get("k199", consistency="stale") == b"v199"
    assert cluster.wait_for_leader() == leader  # its return deposed no one
    assert cluster.status(leader)["term"] == status["term"]


def test_a_wiped_follower_rejoins_under_a_writer_without_deposing_the_leader(make_cluster) -> None:
    """The README's recovery (SIGKILL, remove the data directory, the same command again) while a
    client writes: the rejoining member takes its peers' term, not one above it, so the leader a
    majority follows keeps leading in its term and no write sees a leader change."""
    cluster = make_cluster(3, extra_args=STEADY_TIMING)
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    follower = next(n for n in cluster.nodes if n != leader)
    stop = threading.Event()
    written: list[int] = []
    failures: list[BaseException] = []

    def write() -> None:
        with cluster.client([leader], timeout=10) as client:
            while not stop.is_set():
                try:
                    client.put(f"w{len(written)}", "v")
                    written.append(len(written))
                except BaseException as error:  # noqa: BLE001 - the test reports it
                    failures.append(error)
                    return

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_until("writes before the wipe", lambda: len(written) >= 50)
        cluster.kill(follower)
        shutil.rmtree(cluster.nodes[follower].spec.data_dir)
        cluster.start_node(follower)
        before = len(written)
        wait_until("the wiped follower to catch up", lambda: (
            not (mine := cluster.status(follower))["rejoining"] and mine["applied_index"] > 0
            and len(written) > before + 50))
    finally:
        stop.set()
        writer.join()
    assert not failures, failures
    statuses = cluster.statuses()
    assert {s["leader"] for s in statuses.values()} == {leader}
    assert {s["term"] for s in statuses.values()} == {term}  # nobody stood, nobody stepped down
