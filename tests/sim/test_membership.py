"""Membership change and leadership transfer on the simulator: servers added at run time (started
with NodeConfig.join), promoted, removed (they stop), leadership handed over; and the proof that
the membership overlap check bites."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raft.core import ChangeKind, MembershipChangeError, NotLeaderError, Role
from tests.sim.checkers import SafetyChecker, SimViolation, disjoint_majorities
from tests.sim.cluster import Cluster


def leader_of(c: Cluster) -> str:
    """The leader, once it has committed an entry of its term (it takes changes from then on)."""
    def ready() -> bool:
        lead = c.leader()
        return lead is not None and lead.core is not None and \
            lead.core.log.term(lead.core.commit_index) == lead.core.term
    assert c.run_until(ready, 3000)
    lead = c.leader()
    assert lead is not None
    return lead.id


def applied(c: Cluster, future: Any, ms: int = 3000) -> None:
    assert c.run_until(future.done, ms)
    assert future.exception() is None, future.exception()


def caught_up(c: Cluster, ids: list[str]) -> bool:
    lead = c.leader()
    if lead is None or lead.core is None:
        return False
    commit = lead.core.commit_index
    return all(c.nodes[i].core is not None and c.nodes[i].applied == commit for i in ids)


def test_add_a_learner_promote_it_and_remove_an_old_voter() -> None:
    c = Cluster(3, seed=11)
    try:
        lead = leader_of(c)
        c.propose(lead, [b"before"])
        future = c.change_membership(lead, ChangeKind.ADD_LEARNER, "n4")
        new = c.add_node("n4")
        assert new.config.join and new.core is not None and not new.core.membership.voters
        applied(c, future)
        c.propose(lead, [b"after"])
        assert c.run_until(lambda: caught_up(c, ["n1", "n2", "n3", "n4"]), 3000)
        assert new.role() == Role.FOLLOWER and "n4" in new.core.membership.learners
        assert new.state == c.nodes[lead].state  # the learner holds everything, from before it joined too
        applied(c, c.change_membership(lead, ChangeKind.PROMOTE, "n4"))
        lead = leader_of(c)
        assert set(c.nodes[lead].core.membership.voters) == {"n1", "n2", "n3", "n4"}  # type: ignore[union-attr]
        victim = next(i for i in ("n1", "n2", "n3") if i != lead)
        applied(c, c.change_membership(lead, ChangeKind.REMOVE, victim))
        # The removed node learns its removal committed and stops; the cluster carries on without it.
        assert c.run_until(lambda: victim in c.removed, 2000)
        assert not c.nodes[victim].up
        c.restart(victim)  # a removed server does not come back
        assert not c.nodes[victim].up
        c.propose(lead, [b"without"])
        rest = [i for i in ("n1", "n2", "n3", "n4") if i != victim]
        assert c.run_until(lambda: caught_up(c, rest) and not c.pending(), 3000)
        c.check_all()
    finally:
        c.close()


def test_an_update_moves_a_member_its_peers_reach_it_there_once_it_listens_there() -> None:
    """MemberUpdate: the member's address changes through the log, the voters stay. Once the
    change is applied its peers dial the new address, where nothing listens until the member is
    restarted there; meanwhile the other two commit alone, then it catches up."""
    c = Cluster(3, seed=21)
    try:
        lead = leader_of(c)
        member = next(i for i in ("n1", "n2", "n3") if i != lead)
        others = [i for i in ("n1", "n2", "n3") if i != member]
        applied(c, c.change_membership(lead, ChangeKind.UPDATE, member, f"sim:{member}-moved"))
        assert c.run_until(lambda: all(c.nodes[i].core.membership.address(member) == f"sim:{member}-moved"  # type: ignore[union-attr]
                                       for i in others), 2000)
        assert set(c.nodes[lead].core.membership.voters) == {"n1", "n2", "n3"}  # type: ignore[union-attr]
        c.propose(lead, [b"while-away"])
        assert c.run_until(lambda: caught_up(c, others), 3000)
        behind = c.nodes[member].applied
        c.run_for(1000)  # nothing reaches the member at its old address (the leader dials the new one)
        assert c.nodes[member].applied == behind < c.nodes[lead].applied
        c.move(member, f"sim:{member}-moved")
        assert c.run_until(lambda: caught_up(c, ["n1", "n2", "n3"]), 3000)
        c.check_all()
    finally:
        c.close()


def test_a_leader_refuses_a_second_change_until_the_first_commits() -> None:
    c = Cluster(3, seed=12)
    try:
        lead = leader_of(c)
        c.net.partition([lead], [i for i in c.nodes if i != lead])
        c.change_membership(lead, ChangeKind.ADD_LEARNER, "n4")
        with pytest.raises(MembershipChangeError):
            c.change_membership(lead, ChangeKind.ADD_LEARNER, "n5")
    finally:
        c.close()


def test_removing_the_leader_hands_over_and_it_stops() -> None:
    c = Cluster(5, seed=13)
    try:
        lead = leader_of(c)
        term = c.nodes[lead].core.term  # type: ignore[union-attr]
        removal = c.change_membership(lead, ChangeKind.REMOVE, lead)
        start = c.now
        # (Its future may fail with NodeStoppedError: the leader may stop before it applies it.)
        assert c.run_until(lambda: (new := c.leader()) is not None and new.id != lead, 2000)
        # TimeoutNow: the next leader stood at once instead of waiting out an election timeout.
        assert c.now - start < c.config.election_timeout_ms
        new = c.leader()
        assert new is not None and new.core is not None and new.core.term == term + 1
        assert c.run_until(lambda: lead in c.removed, 2000)
        c.propose(new.id, [b"x"])
        assert c.run_until(lambda: not c.pending(), 2000)
        c.check_all()
    finally:
        c.close()


def test_transfer_hands_leadership_over_within_a_round_trip_or_two() -> None:
    c = Cluster(3, seed=14)
    try:
        lead = leader_of(c)
        target = next(i for i in c.nodes if i != lead)
        start = c.now
        task = c.transfer(lead, target)
        assert c.run_until(task.done, 1000)
        assert task.result() == target
        assert c.leader() is not None and c.leader().id == target  # type: ignore[union-attr]
        assert c.now - start < c.config.election_timeout_ms
        c.propose(target, [b"x"])
        assert c.run_until(lambda: not c.pending(), 1000)
        refused = c.transfer(lead, target)  # no longer the leader
        assert c.run_until(refused.done, 100)
        assert refused.exception() is not None
    finally:
        c.close()


def test_a_write_during_a_transfer_is_held_then_sent_to_the_new_leader() -> None:
    """A write that reaches the leader while it hands leadership over is not refused with the
    target's name before the target leads (its client would bounce between the two): the driver
    holds it, and fails it with "not leader" naming the new leader once that one leads."""
    c = Cluster(3, seed=15)
    try:
        lead = leader_of(c)
        target = next(i for i in c.nodes if i != lead)
        old = c.nodes[lead].raft
        assert old is not None
        held = c.inside_loop(lambda: (old.core.transfer_leadership(target), old.poke(), old.propose(b"during"))[2])
        assert not held.done()
        assert c.run_until(held.done, 1000)
        error = held.exception()
        assert isinstance(error, NotLeaderError) and error.leader == target, error
        assert c.leader() is not None and c.leader().id == target  # type: ignore[union-attr]
    finally:
        c.close()


def test_a_write_held_during_a_failed_transfer_is_written_by_the_leader() -> None:
    c = Cluster(3, seed=16)
    try:
        lead = leader_of(c)
        target = next(i for i in c.nodes if i != lead)
        c.net.partition([target], [i for i in c.nodes if i != target])  # the target cannot win
        old = c.nodes[lead].raft
        assert old is not None
        held = c.inside_loop(lambda: (old.core.transfer_leadership(target), old.poke(), old.propose(b"during"))[2])
        assert c.run_until(held.done, 3 * c.config.election_timeout_ms)
        assert held.exception() is None, held.exception()
        assert c.leader() is not None and c.leader().id == lead  # type: ignore[union-attr]
    finally:
        c.close()


# --- the overlap check --------------------------------------------------------------------------

def test_disjoint_majorities() -> None:
    assert not disjoint_majorities({"a", "b", "c"}, {"a", "b", "c"})
    assert not disjoint_majorities({"a", "b", "c"}, {"a", "b", "c", "d"})  # one added
    assert not disjoint_majorities({"a", "b", "c", "d"}, {"a", "b", "c"})  # one removed
    assert not disjoint_majorities({"a", "b", "c", "d"}, {"a", "b", "c", "e"})  # one replaced: {a,b,?} overlap
    assert disjoint_majorities({"a", "b", "c"}, {"a", "b", "c", "d", "e"})  # two added: {a,b} and {c,d,e}
    assert disjoint_majorities({"a", "b", "c"}, {"c", "d", "e"})  # {a,b} and {d,e}
    assert not disjoint_majorities({"a", "b", "c", "d"}, {"a", "b"})  # every majority of 4 meets {a,b}


def fake(node_id: str, voters: str, top_term: int) -> Any:
    log = SimpleNamespace(before_begin=lambda: (0, 0), term=lambda index: top_term)
    core = SimpleNamespace(membership=SimpleNamespace(voters={v: "" for v in voters}), log=log)
    return SimpleNamespace(id=node_id, core=core)


def test_overlap_check_bites_on_two_configurations_two_changes_apart() -> None:
    checker = SafetyChecker()
    checker.top_commit = (5, 2)
    checker.check_overlap([fake("a", "abc", 2), fake("d", "abcd", 2)])  # one change apart: fine
    with pytest.raises(SimViolation, match="disjoint majorities"):
        checker.check_overlap([fake("a", "abc", 2), fake("e", "abcde", 2)])


def test_overlap_check_ignores_a_node_that_lacks_a_committed_entry() -> None:
    checker = SafetyChecker()
    checker.top_commit = (5, 2)
    # The node on "abc" holds another entry at the committed index 5: it can never be elected.
    checker.check_overlap([fake("a", "abc", 1), fake("e", "abcde", 2)])
