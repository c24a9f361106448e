"""kv.Client's revisions and transactions on a real three-member cluster, through a follower (its
etcd calls are forwarded to the leader), and across a leader kill: every member applies the same
revisions."""
from __future__ import annotations

import pytest

from kv.errors import RevisionError
from kv.txn import CreateRevision, ModRevision, Value, Version, delete, get, put, txn
from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration


def test_reads_at_past_revisions_transactions_and_compaction_through_a_follower(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    c = cluster.client([follower])
    start = c.revision()
    # Its etcd-API calls asked the follower for the leader instead of a forwarded answer: it went there.
    assert c._router.preferred == cluster.nodes[leader].address
    c.put("cfg", "v1")
    c.put("cfg", "v2")
    first = c.get_kv("cfg")
    assert (first.value, first.version, first.mod_revision - first.create_revision) == (b"v2", 2, 1)
    assert c.get("cfg", revision=first.create_revision) == b"v1"
    assert c.get("cfg", revision=start) is None
    # A compare-and-swap that holds, and one that does not: the second changes nothing.
    assert c.compare_and_swap("cfg", b"v2", b"v3") is True
    assert c.compare_and_swap("cfg", b"v2", b"v4") is False
    assert c.get("cfg") == b"v3"
    assert c.put_if_absent("lock", "me") is True and c.put_if_absent("lock", "you") is False
    result = c.txn(compare=[Value("cfg") == b"v3", Version("lock") == 1, CreateRevision("nope") == 0,
                            ModRevision("cfg") > first.mod_revision],
                   success=[put("a/1", "x", prev_kv=True), put("a/2", "y"), get("a/", prefix=True),
                            txn([Value("a/1") == b"x"], [delete("lock")])],
                   failure=[get("cfg")])
    assert result.succeeded
    assert result.responses[0] is None  # a/1 did not exist before
    assert [(kv.key, kv.value) for kv in result.responses[2]] == [(b"a/1", b"x"), (b"a/2", b"y")]
    # The nested compare was judged before the outer ops ran: a/1 did not exist then.
    assert result.responses[3].succeeded is False and c.get("lock") == b"me"
    assert {kv.mod_revision for kv in c.scan_at(result.revision, prefix="a/")} == {result.revision}
    assert c.scan(prefix="a/", revision=result.revision - 1) == []
    c.compact(result.revision)
    with pytest.raises(RevisionError, match="required revision has been compacted"):
        c.get("cfg", revision=result.revision - 1)
    with pytest.raises(RevisionError, match="required revision is a future revision"):
        c.get("cfg", revision=result.revision + 1000)


def test_every_member_applies_the_same_revisions_across_a_leader_kill(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    c = cluster.client()
    for i in range(20):
        c.put(f"k/{i}", str(i))
    cluster.kill(leader)
    cluster.wait_for_leader(among=[n for n in cluster.nodes if n != leader])
    for i in range(20):
        c.txn(compare=[Version(f"k/{i}") == 1], success=[put(f"k/{i}", f"{i}!")])
    cluster.restart(leader)
    revision = c.revision()
    assert revision == 1 + 20 + 20
    # Each member, read locally (stale) once it has applied everything, holds the same versions.
    views = {}
    for node in cluster.nodes:
        member = cluster.client([node])
        wait_until(f"{node} applied every write", lambda: (kv := member.get_kv("k/19", consistency="stale"))
                   is not None and kv.version == 2, timeout=30)
        views[node] = [(kv.key, kv.mod_revision, kv.version) for kv in member.scan_at(revision, prefix="k/", limit=0,
                                                                                consistency="stale")]
    assert len({tuple(view) for view in views.values()}) == 1
    assert len(views[leader]) == 20


def test_the_leader_compacts_the_history_by_itself_past_the_retention(make_cluster) -> None:
    cluster = make_cluster(1, extra_args=("--auto-compaction-retention", "2s"))
    cluster.wait_for_leader()
    c = cluster.client()
    c.put("k", "1")
    first = c.revision()
    c.put("k", "2")
    wait_until("history before the retention compacted",
               lambda: _compacted(c, first) or None, timeout=20)
    assert c.get("k") == b"2"


def _compacted(client, revision: int) -> bool:
    try:
        client.get("k", revision=revision)
    except RevisionError:
        return True
    return False
