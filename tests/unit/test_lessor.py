"""The leader's lease deadlines (kv/server/lessor.py), stepped with a fake node and clock."""
from __future__ import annotations

from dataclasses import dataclass, field

from kv.server.lessor import Lessor, min_lease_ttl_s


@dataclass
class Core:
    term: int = 1


@dataclass
class Node:
    id: str = "n1"
    leader: str | None = "n1"
    core: Core = field(default_factory=Core)


class Holder:
    def __init__(self, ttls: dict[int, int], remaining: dict[int, int] | None = None) -> None:
        self.ttls = ttls
        self.remaining = remaining or {}


@dataclass
class Store:
    leases: Holder


def test_deadlines_count_from_the_lead_renewals_and_grants_and_never_early() -> None:
    now = [100.0]
    node, store = Node(), Store(Holder({1: 10, 2: 30}))
    lessor = Lessor(node, store, clock=lambda: now[0])  # type: ignore[arg-type]
    assert lessor.expired() == []
    now[0] = 109.0
    assert lessor.renew(1) == 10  # lease 1 now lives to 119
    now[0] = 115.0
    store.leases = Holder({1: 10, 2: 30, 3: 5})  # a batch granted lease 3: from now
    assert lessor.remaining(3) == 5
    now[0] = 121.0
    assert sorted(lessor.expired()) == [1, 3]
    assert lessor.renew(99) == 0  # no such lease
    # A new term: every lease gets its whole TTL from the moment this member took the lead.
    node.core.term = 2
    assert lessor.expired() == [] and lessor.remaining(1) == 10
    # A follower counts nothing and renews nothing: a renewal there is no answer about the lease
    # (None), never "no such lease" (0), which an etcd client would give the lease up on.
    node.leader = "n2"
    assert lessor.expired() == [] and lessor.renew(2) is None and lessor.remaining(2) is None
    store.leases = Holder({2: 30})  # lease 1 revoked meanwhile
    node.leader = "n1"
    now[0] = 500.0
    assert lessor.expired() == [] and lessor.remaining(2) == 30  # leading again: counted from now


def test_the_minimum_ttl_is_one_and_a_half_election_timeouts() -> None:
    assert min_lease_ttl_s(1000) == 2 and min_lease_ttl_s(500) == 1


def test_long_leases_are_checkpointed_and_a_new_leader_counts_them_from_there() -> None:
    """etcd's lease checkpoints: every interval the leader records the remaining TTL of each lease
    longer than the interval; a member that takes the lead counts a checkpointed lease from its
    remaining TTL, and every other lease from its whole TTL."""
    now = [100.0]
    node, store = Node(), Store(Holder({1: 600, 2: 5}))
    lessor = Lessor(node, store, clock=lambda: now[0], checkpoint_interval_s=60)  # type: ignore[arg-type]
    assert lessor.expired() == [] and lessor.checkpoints_due() == {}  # not due yet
    now[0] = 160.5
    assert lessor.checkpoints_due() == {1: 540}  # rounded up; lease 2 is shorter than the interval
    assert lessor.checkpoints_due() == {}  # once per interval
    # The checkpoint applied, then a new term on another member that takes the lead:
    store.leases = Holder({1: 600, 2: 5}, remaining={1: 540})
    node.core.term = 2
    now[0] = 200.0
    assert lessor.remaining(1) == 540 and lessor.remaining(2) == 5
    node.leader = "n2"
    assert lessor.checkpoints_due() == {}  # a follower checkpoints nothing
