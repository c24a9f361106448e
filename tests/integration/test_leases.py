"""Leases on real members: a kept-alive lease outlives leader kills, an abandoned one takes its
keys once its TTL is over (not before), a revoked one takes them at once."""
from __future__ import annotations

import time

import pytest

from kv.errors import NotFoundError, RaftKVError
from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration


def test_a_lease_kept_alive_outlives_two_leader_kills(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    c = cluster.client(timeout=20)
    with c.lease(ttl=5) as lease:
        c.put("svc/a", "10.0.0.1", lease=lease.id)
        assert c.get_kv("svc/a").lease == lease.id
        started = time.monotonic()
        for _ in range(2):
            time.sleep(4)
            leader = cluster.wait_for_leader()
            cluster.kill(leader)
            cluster.wait_for_leader(among=[n for n in cluster.nodes if n != leader])
            assert c.get("svc/a") == b"10.0.0.1"  # a new leader gives the lease its whole TTL
            cluster.start_node(leader)
        while time.monotonic() - started < 30:
            assert c.get("svc/a") == b"10.0.0.1", f"deleted after {time.monotonic() - started:.1f}s"
            time.sleep(0.5)
        assert lease.alive
    # Leaving the block revoked the lease: its key went with it.
    assert c.get("svc/a") is None
    assert lease.id not in c.leases()


def test_an_abandoned_lease_takes_its_keys_once_its_ttl_is_over(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    c = cluster.client()
    asked = time.monotonic()  # the lease's TTL runs from a moment after this
    lease_id, ttl = c.lease_grant(3)
    c.put("tmp/1", "x", lease=lease_id)
    c.put("tmp/2", "y", lease=lease_id)
    c.put("tmp/3", "kept")  # no lease
    ttl_now = c.lease_time_to_live(lease_id, keys=True)
    assert ttl_now["granted_ttl"] == ttl == 3 and 0 < ttl_now["ttl"] <= 3
    assert sorted(ttl_now["keys"]) == [b"tmp/1", b"tmp/2"]
    revision = c.revision()
    # Not before its TTL; and it does go (how soon after is the machine's speed, not a contract).
    wait_until("the lease's keys deleted", lambda: c.get("tmp/1") is None or None, timeout=ttl + 20)
    assert time.monotonic() - asked >= ttl - 0.5
    assert c.get("tmp/2") is None and c.get("tmp/3") == b"kept"
    assert c.revision() == revision + 1  # both keys in one revision
    assert c.lease_time_to_live(lease_id)["ttl"] == -1
    assert c.lease_keep_alive(lease_id) == 0


def test_a_lease_shorter_than_the_minimum_is_raised_to_it_and_an_unknown_lease_is_refused(cluster: Cluster) -> None:
    c = cluster.client()
    _, ttl = c.lease_grant(1)
    assert ttl == 1  # 1.5 election timeouts of 500 ms round up to 1 s
    with pytest.raises(RaftKVError, match="requested lease not found"):
        c.put("k", "v", lease=12345)


def test_closing_a_lease_that_is_gone_already_is_not_an_error(cluster: Cluster) -> None:
    """A revoke retried after its first attempt was applied (its answer lost to a leader kill)
    finds no lease: closing a Lease takes that as done, and a plain revoke says NOT_FOUND."""
    c = cluster.client()
    lease = c.lease(5)
    c.lease_revoke(lease.id)
    with pytest.raises(NotFoundError, match="requested lease not found"):
        c.lease_revoke(lease.id)
    lease.close()
    assert not lease.alive


def test_a_checkpointed_lease_is_not_restarted_in_full_by_a_new_leader(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """Lease checkpoints (--lease-checkpoint-interval): a long lease abandoned for a while keeps,
    across a change of leader, about the TTL it had left, rather than its whole TTL again; and a
    lease kept alive after a checkpoint is counted from its whole TTL (its checkpoint cleared)."""
    cluster = make_cluster(3, extra_args=("--lease-checkpoint-interval", "1"))
    leader = cluster.wait_for_leader()
    c = cluster.client(timeout=20)
    abandoned, ttl = c.lease_grant(60)
    kept, _ = c.lease_grant(60)
    # Checkpoints are taken every second: once a few seconds of the abandoned lease have passed,
    # its remaining TTL has been recorded through the log.
    wait_until("a few seconds of the lease to pass", lambda: c.lease_time_to_live(abandoned)["ttl"] <= ttl - 4)
    assert c.lease_keep_alive(kept) == 60
    cluster.kill(leader)
    cluster.wait_for_leader(among=[n for n in cluster.nodes if n != leader])
    left = c.lease_time_to_live(abandoned)["ttl"]
    assert 0 < left <= ttl - 2, left  # counted from its checkpoint, not restarted at 60
    assert c.lease_time_to_live(kept)["ttl"] >= ttl - 1  # renewed after its checkpoint: whole again
