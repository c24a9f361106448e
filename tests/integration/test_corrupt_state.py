"""A member whose state is damaged on its disk never serves it: a value that fails its checksum is
refused on read, and a state that is consistent but differs from the majority's is found by the
members' periodic state check. Either way the member raises its alarm (`corrupt` in status, an
error in its log) and stops serving, while the others go on serving reads; and once the leader has
raised CORRUPT for it through the log, every member refuses writes, as etcd's corrupt cluster does,
until an operator has replaced its data and disarmed the alarm."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from kv.errors import CorruptClusterError, UnavailableError
from statemachine.value_checksum import seal
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until

CHECKED = (*FAST_TIMING, "--state-check-interval", "1")
PRECIOUS = b"precious-value-" * 8


def state_file(cluster: Cluster, node_id: str) -> Path:
    return cluster.nodes[node_id].spec.data_dir / "state" / "data.mdb"


def written_everywhere(cluster: Cluster) -> tuple[str, str]:
    """(leader, a follower) once PRECIOUS is applied on every member."""
    leader = cluster.wait_for_leader()
    index = cluster.client().put("k", PRECIOUS)
    for node_id in cluster.nodes:
        cluster.wait_applied(node_id, index)
    return leader, next(n for n in cluster.nodes if n != leader)


def test_a_value_that_rotted_on_disk_is_refused_and_the_member_stops_serving(
        make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, extra_args=(*FAST_TIMING, "--state-check-interval", "0"))
    _, victim = written_everywhere(cluster)
    cluster.kill(victim)
    data = bytearray(state_file(cluster, victim).read_bytes())
    at = data.find(PRECIOUS)
    assert at >= 0 and data.find(PRECIOUS, at + 1) < 0
    data[at + 5] ^= 0x01  # one bit of the value, as a bad sector would change it
    state_file(cluster, victim).write_bytes(bytes(data))
    cluster.start_node(victim)

    assert "error" not in cluster.status(victim)  # it answers: a process takes seconds to start on a busy machine
    with pytest.raises(UnavailableError, match="corrupt.*b'k' fails its checksum"):
        cluster.client([victim], timeout=3.0).get("k", consistency="stale")
    status = cluster.status(victim)
    assert status["corrupt"] and "fails its checksum" in status["corrupt"]
    assert "CORRUPT" in cluster.nodes[victim].log_path.read_text(errors="replace")
    # The others serve the right value; once CORRUPT is raised for the victim, they refuse writes.
    others = [n for n in cluster.nodes if n != victim]
    client = cluster.client(others)
    assert client.get("k") == PRECIOUS
    corrupt_cluster_refuses_writes_then_disarmed(cluster, others, victim)


def test_a_member_whose_state_differs_from_the_majority_finds_it_and_stops_serving(
        make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, extra_args=CHECKED)
    _, victim = written_everywhere(cluster)
    cluster.kill(victim)
    # Rewritten whole, checksum and all: no read can tell; only comparing with the others can.
    env = lmdb.open(str(state_file(cluster, victim).parent), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"k", seal(b"k", b"something else"), db=env.open_db(b"data", txn=txn))
    env.close()
    cluster.start_node(victim)

    status = wait_until("the member finds its state corrupt",
                        lambda: (s := cluster.status(victim))["corrupt"] and s, timeout=30)
    assert "agree on" in status["corrupt"]
    assert "CORRUPT" in cluster.nodes[victim].log_path.read_text(errors="replace")
    with pytest.raises(UnavailableError, match="corrupt"):
        cluster.client([victim], timeout=3.0).get("k", consistency="stale")
    others = [n for n in cluster.nodes if n != victim]
    client = cluster.client(others)
    assert client.get("k") == PRECIOUS
    assert all(not cluster.status(n)["corrupt"] for n in others)
    corrupt_cluster_refuses_writes_then_disarmed(cluster, others, victim)


def corrupt_cluster_refuses_writes_then_disarmed(cluster: Cluster, others: list[str], victim: str) -> None:
    """The leader raises CORRUPT for `victim` through the log: every member that still applies it
    lists it, and refuses writes (etcd's "etcdserver: corrupt cluster") while reads go on; once the
    alarm is disarmed, writes are taken again."""
    for node_id in others:
        assert wait_until(f"{node_id} lists CORRUPT", lambda: cluster.status(node_id)["alarms"]) == \
            [{"member_id": victim, "alarm": "CORRUPT"}]
    client = cluster.client(others)
    with pytest.raises(CorruptClusterError, match="etcdserver: corrupt cluster"):
        client.put("after", "1")
    assert client.get("k") == PRECIOUS and client.get("after") is None
    cluster.kill(victim)  # as an operator would, before replacing its data
    client.alarm_disarm()
    client.put("after", "1")
    assert client.get("after") == b"1"
