"""Three real nodes elect a leader and serve the whole client API through any endpoint."""
from __future__ import annotations

import pytest

from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration


def test_three_nodes_elect_one_leader_and_report_the_status_contract(cluster: Cluster):
    leader = cluster.wait_for_leader()
    statuses = cluster.statuses()
    roles = sorted(s["role"] for s in statuses.values())
    assert roles == ["follower", "follower", "leader"]
    assert {s["leader"] for s in statuses.values()} == {leader}
    assert len({s["term"] for s in statuses.values()}) == 1
    for node_id, status in statuses.items():
        assert status["id"] == node_id
        assert {"commit_index", "applied_index", "snapshot_index"} <= status.keys()
    # The leader reports every follower's match index.
    assert set(statuses[leader]["peers"]) >= set(cluster.nodes) - {leader}


@pytest.mark.parametrize("via", ["n1", "n2", "n3"])
def test_put_get_delete_scan_batch_through_any_endpoint(cluster: Cluster, via: str):
    client = cluster.client([via])  # one endpoint: a follower must lead the client to the leader
    first = client.put(f"{via}/a", "1")
    second = client.put(f"{via}/b", b"2")
    assert second > first > 0
    assert client.get(f"{via}/a") == b"1"
    assert client.get(f"{via}/missing") is None
    assert client.batch(puts={f"{via}/c": "3", f"{via}/a": "one"}, deletes=[f"{via}/b", f"{via}/zz"]) \
        == [False, True, True, False]
    assert client.scan(prefix=f"{via}/") == [(f"{via}/a".encode(), b"one"), (f"{via}/c".encode(), b"3")]
    assert client.delete(f"{via}/a") is True
    assert client.delete(f"{via}/a") is False
    assert client.scan(prefix=f"{via}/") == [(f"{via}/c".encode(), b"3")]


def test_reads_at_every_consistency_level(cluster: Cluster):
    client = cluster.client()
    index = client.put("k", "v")
    assert client.get("k", consistency="linearizable") == b"v"
    assert client.get("k", consistency="lease") == b"v"
    for node_id in cluster.nodes:
        # A stale read is served by whichever node is asked, once it has applied the write.
        cluster.wait_applied(node_id, index)
        assert cluster.client([node_id]).get("k", consistency="stale") == b"v"


def test_scan_range_and_limit(cluster: Cluster):
    client = cluster.client()
    client.batch(puts={f"r/{i:03d}": str(i) for i in range(250)})
    assert len(client.scan(prefix="r/", limit=1000)) == 250
    assert [k for k, _ in client.scan(start="r/010", end="r/013")] == [b"r/010", b"r/011", b"r/012"]
    page = client.scan(prefix="r/", limit=7)
    assert [k for k, _ in page] == [f"r/{i:03d}".encode() for i in range(7)]


def test_followers_apply_what_the_leader_commits(cluster: Cluster):
    client = cluster.client()
    for i in range(50):
        index = client.put(f"f/{i}", str(i))
    for node_id in cluster.nodes:
        cluster.wait_applied(node_id, index)
    leader = cluster.wait_for_leader()
    peers = wait_until("the leader to see every follower caught up",
                       lambda: (p := cluster.status(leader)["peers"]) and all(m >= index for m in p.values()) and p)
    assert all(match >= index for match in peers.values())
