"""Membership change and leadership transfer in the core (decision 0064): the rules of
Membership.changed, MembershipLog's bookkeeping along the log, and RaftCore's behaviour, driven
directly (MemoryLogStore, Ready/advance) over a tiny in-process network. Whole-cluster behaviour
under faults is in tests/sim (test_membership.py there, and the random schedules)."""
from __future__ import annotations

import random
from typing import Callable

import pytest

from raft.core import (
    ChangeKind, CoreConfig, MemoryLogStore, Membership, MembershipChangeError, Message, NotLeaderError, PushResponse,
    RaftCore, Role, TimeoutNowRequest, VoteRequest, VoteResponse,
)
from raft.core.errors import TransferringError
from raft.core.membership import MembershipLog

CFG = CoreConfig(election_timeout_ms=100, heartbeat_interval_ms=20, lease_ms=80, push_timeout_ms=100,
                 lazy_push_ms=0, eager_trial_every_ms=0, out_of_order_hold_ms=20)
TICK = 10


def m(voters: str, learners: str = "") -> Membership:
    return Membership({v: f"addr-{v}" for v in voters}, {x: f"addr-{x}" for x in learners})


def same(a: Membership, b: Membership) -> bool:
    """The same voters and learners, with the same addresses."""
    return dict(a.voters) == dict(b.voters) and dict(a.learners) == dict(b.learners)


# --- Membership.changed -------------------------------------------------------------------------

def test_changed_adds_promotes_and_removes() -> None:
    base = m("abc")
    assert same(base.changed(ChangeKind.ADD_VOTER, "d", "addr-d"), m("abcd"))
    learner = base.changed(ChangeKind.ADD_LEARNER, "d", "addr-d")
    assert same(learner, m("abc", "d")) and not learner.is_voter("d") and "d" in learner
    assert learner.quorum() == 2  # learners count in no majority
    promoted = learner.changed(ChangeKind.PROMOTE, "d")
    assert same(promoted, m("abcd")) and promoted.address("d") == "addr-d"  # the address goes along
    assert same(promoted.changed(ChangeKind.REMOVE, "a"), m("bcd"))
    assert same(learner.changed(ChangeKind.REMOVE, "d"), base)
    assert Membership.decode(learner.encode()) == learner
    assert same(base, m("abc"))  # changed() never changes the configuration it is called on


def test_an_update_changes_only_the_members_address() -> None:
    base = m("abc", "d")
    moved = base.changed(ChangeKind.UPDATE, "b", "addr-b2")
    assert moved.address("b") == "addr-b2" and moved.moved == {"b"}
    assert dict(moved.voters) == {**base.voters, "b": "addr-b2"} and moved.learners == base.learners
    assert moved.quorum() == base.quorum()
    learner = moved.changed(ChangeKind.UPDATE, "d", "addr-d2")
    assert learner.address("d") == "addr-d2" and not learner.is_voter("d") and learner.moved == {"b", "d"}
    assert Membership.decode(learner.encode()) == learner
    assert b'"moved"' not in base.encode()  # a configuration no update touched is encoded as before
    assert learner.changed(ChangeKind.REMOVE, "b").moved == {"d"}
    assert learner.changed(ChangeKind.PROMOTE, "d").moved == {"b", "d"}  # (kept by the other changes)
    assert base.changed(ChangeKind.UPDATE, "b", "addr-b").address("b") == "addr-b"  # the same address: taken


@pytest.mark.parametrize("start, kind, member, why", [
    (m("abc"), ChangeKind.UPDATE, "z", "not a member"),
    (m("abc"), ChangeKind.UPDATE, "a", "addr-b is the peer address of b"),
    (m("abc"), ChangeKind.ADD_VOTER, "a", "already a member"),
    (m("abc", "d"), ChangeKind.ADD_LEARNER, "d", "already a member"),
    (m("abc"), ChangeKind.ADD_LEARNER, "", "needs an id"),
    (m("abc"), ChangeKind.PROMOTE, "a", "already a voter"),
    (m("abc"), ChangeKind.PROMOTE, "z", "not a member"),
    (m("abc"), ChangeKind.REMOVE, "z", "not a member"),
    (m("a", "b"), ChangeKind.REMOVE, "a", "only voter"),
])
def test_changed_refuses(start: Membership, kind: ChangeKind, member: str, why: str) -> None:
    with pytest.raises(MembershipChangeError, match=why):
        start.changed(kind, member, "addr-b" if kind is ChangeKind.UPDATE and member == "a" else "x")


def test_an_update_needs_an_address() -> None:
    with pytest.raises(MembershipChangeError, match="peer address for a is needed"):
        m("abc").changed(ChangeKind.UPDATE, "a", "")


def test_membership_refuses_a_member_both_voter_and_learner() -> None:
    with pytest.raises(ValueError):
        Membership({"a": ""}, {"a": ""})


# --- MembershipLog ------------------------------------------------------------------------------

def test_membership_log_follows_appends_and_truncation_reverts() -> None:
    configs = MembershipLog(3, m("abc"))
    configs.appended(5, m("abc", "d"))
    configs.appended(8, m("abcd"))
    assert same(configs.latest, m("abcd")) and configs.latest_index == 8
    assert same(configs.at(4), m("abc")) and same(configs.at(5), m("abc", "d")) and same(configs.at(7), m("abc", "d"))
    configs.truncated_from(8)  # the entry at 8 left the log: the one at 5 is in force again
    assert same(configs.latest, m("abc", "d")) and configs.latest_index == 5
    configs.truncated_from(6)  # nothing at or past 6 any more: no change
    assert configs.latest_index == 5
    configs.truncated_from(2)
    assert same(configs.latest, m("abc")) and configs.latest_index == 3
    with pytest.raises(AssertionError):
        configs.appended(3, m("ab"))  # not after the latest


def test_membership_log_committed_through_makes_the_base() -> None:
    configs = MembershipLog(0, m("abc"), logged=False)
    assert not configs.logged
    configs.appended(1, m("abc"))
    configs.appended(4, m("abc", "d"))
    assert configs.logged
    configs.committed_through(3)  # the entry at 1 is the base now, the one at 4 still pending
    configs.truncated_from(1)  # (cannot happen to committed entries, but shows which is the base)
    assert same(configs.latest, m("abc")) and configs.latest_index == 1


def test_membership_log_reset_by_a_snapshot() -> None:
    configs = MembershipLog(0, m("abc"))
    configs.appended(2, m("abc", "d"))
    configs.reset(10, m("abcd"))
    assert same(configs.latest, m("abcd")) and configs.latest_index == 10
    configs.reset(20, None)  # a snapshot naming no configuration keeps the base
    assert same(configs.latest, m("abcd")) and configs.latest_index == 20


def test_membership_log_of_a_joining_node_knows_nothing_until_a_config_arrives() -> None:
    configs = MembershipLog(0, Membership(), known=False)
    assert not configs.known and not configs.latest.voters
    configs.appended(7, m("abc", "d"))
    assert configs.known and configs.latest.learners.keys() == {"d"}


# --- RaftCore over a tiny network ---------------------------------------------------------------

class Net:
    """Cores over MemoryLogStores; a Ready is handled whole (persist, send, apply) at once; messages
    are delivered in order, except to or from nodes `cut` off, and those `drop` refuses."""

    def __init__(self, membership: Membership, ids: str | None = None) -> None:
        self.now = 0
        self.stores = {i: MemoryLogStore() for i in (ids or membership.members)}
        self.cores = {i: RaftCore(i, membership, s, CFG, random.Random(f"seed/{i}"), 0) for i, s in self.stores.items()}
        self.cut: set[str] = set()
        self.drop: Callable[[Message], bool] = lambda msg: False
        self.sent: list[tuple[int, Message]] = []
        self.inflight: list[Message] = []

    def drive(self) -> None:
        for _ in range(10_000):
            busy = False
            for core in self.cores.values():
                if core.has_ready():
                    busy = True
                    rd = core.ready()
                    self.inflight.extend(rd.leader_messages)
                    self.stores[core.id].save(rd.hard_state, rd.truncate_from, rd.entries)
                    self.inflight.extend(rd.messages)
                    core.advance(rd)
                    if rd.committed_entries:
                        core.applied_to(rd.committed_entries[-1].index)
            batch, self.inflight = self.inflight, []
            for msg in batch:
                busy = True
                self.sent.append((self.now, msg))
                if msg.src in self.cut or msg.dst in self.cut or self.drop(msg) or msg.dst not in self.cores:
                    continue
                self.cores[msg.dst].step(msg)
            if not busy:
                return
        raise AssertionError("no quiescence")

    def run(self, ms: int) -> None:
        for _ in range(ms // TICK):
            self.now += TICK
            for core in self.cores.values():
                core.tick(self.now)
            self.drive()

    def run_until(self, pred: Callable[[], bool], ms: int = 5000) -> bool:
        for _ in range(ms // TICK):
            if pred():
                return True
            self.run(TICK)
        return pred()

    def leader(self) -> RaftCore | None:
        leaders = [c for c in self.cores.values() if c.role == Role.LEADER and c.id not in self.cut]
        return max(leaders, key=lambda c: c.term) if leaders else None

    def elect(self) -> RaftCore:
        assert self.run_until(lambda: (lead := self.leader()) is not None and lead.commit_index >= 1
                              and lead.log.term(lead.commit_index) == lead.term)
        lead = self.leader()
        assert lead is not None
        return lead

    def timeout_nows(self, since: int = 0) -> list[TimeoutNowRequest]:
        return [msg for at, msg in self.sent if at >= since and isinstance(msg, TimeoutNowRequest)]


def test_a_new_clusters_first_leader_writes_its_configuration_as_a_config_entry() -> None:
    net = Net(m("abc"))
    lead = net.elect()
    first = net.stores[lead.id].entries(1, 2)[0]
    assert first.type.name == "CONFIG" and same(Membership.decode(first.payload), m("abc"))


def test_a_leader_takes_one_change_at_a_time() -> None:
    net = Net(m("abc"))
    lead = net.elect()
    others = [i for i in "abc" if i != lead.id]
    net.cut.update(others)  # the change cannot commit
    index, term = lead.propose_membership(ChangeKind.ADD_LEARNER, "d", "addr-d")
    assert same(lead.membership, m("abc", "d"))  # in force at once, uncommitted
    with pytest.raises(MembershipChangeError, match="in progress"):
        lead.propose_membership(ChangeKind.ADD_LEARNER, "e", "addr-e")
    net.run(30)
    net.cut.clear()
    assert net.run_until(lambda: lead.commit_index >= index)
    lead.propose_membership(ChangeKind.ADD_LEARNER, "e", "addr-e")  # the first committed: taken
    assert set(lead.membership.learners) == {"d", "e"}


def test_an_update_goes_through_the_log_one_change_at_a_time_and_keeps_the_quorum() -> None:
    net = Net(m("abc"))
    lead = net.elect()
    follower = next(net.cores[i] for i in "abc" if i != lead.id)
    index, _ = lead.propose_membership(ChangeKind.UPDATE, follower.id, "addr-moved")
    assert lead.membership.address(follower.id) == "addr-moved"  # in force at once, as any change
    with pytest.raises(MembershipChangeError, match="in progress"):
        lead.propose_membership(ChangeKind.ADD_LEARNER, "d", "addr-d")
    assert net.run_until(lambda: all(c.commit_index >= index for c in net.cores.values()))
    for core in net.cores.values():
        assert core.membership.address(follower.id) == "addr-moved" and core.membership.moved == {follower.id}
        assert set(core.membership.voters) == {"a", "b", "c"}
    first, _ = lead.propose([b"after"])  # the same three voters commit
    assert net.run_until(lambda: lead.commit_index >= first)


def test_a_new_leader_takes_no_change_before_it_committed_an_entry_of_its_term() -> None:
    net = Net(m("abc"))
    old = net.elect()
    net.run(2 * CFG.heartbeat_interval_ms)  # the followers learn the commit index
    net.cut.add(old.id)
    # The new leader's entries reach its followers, but no answer comes back: nothing of its term commits.
    net.drop = lambda msg: isinstance(msg, PushResponse)
    assert net.run_until(lambda: (lead := net.leader()) is not None and lead.id != old.id)
    lead = net.leader()
    assert lead is not None and lead.log.term(lead.commit_index) != lead.term
    assert lead._configs.latest_index <= lead.commit_index  # noqa: SLF001 - only the term rule refuses
    with pytest.raises(MembershipChangeError, match="of its term"):
        lead.propose_membership(ChangeKind.REMOVE, old.id)
    net.drop = lambda msg: False
    assert net.run_until(lambda: lead.log.term(lead.commit_index) == lead.term)
    lead.propose_membership(ChangeKind.REMOVE, old.id)


def test_a_learners_acknowledgement_counts_in_no_majority() -> None:
    net = Net(m("abc", "d"))
    lead = net.elect()
    others = [i for i in "abc" if i != lead.id]
    net.cut.update(others)
    first, _ = lead.propose([b"x"])
    net.run(CFG.election_timeout_ms // 2)  # (check-quorum would depose it after an election timeout)
    assert lead._lead is not None and lead._lead.match_index("d") >= first  # noqa: SLF001 - the learner has it
    assert lead.commit_index < first  # leader + learner are no majority of three voters
    net.cut.clear()
    assert net.run_until(lambda: lead.commit_index >= first)


def test_a_learner_never_campaigns() -> None:
    net = Net(m("abc", "d"))
    net.elect()
    learner = net.cores["d"]
    term = learner.term
    net.cut.add("d")  # hears no leader for many election timeouts
    net.run(20 * CFG.election_timeout_ms)
    assert learner.role == Role.FOLLOWER and learner.term == term
    assert not [msg for _, msg in net.sent if msg.src == "d" and isinstance(msg, VoteRequest)]


@pytest.mark.parametrize("pre_vote", [False, True])
def test_a_vote_request_from_a_non_voter_is_refused_without_moving_the_term(pre_vote: bool) -> None:
    store = MemoryLogStore()
    core = RaftCore("b", m("abc", "d"), store, CFG, random.Random(1), 0)
    for src in ("d", "z"):  # a learner, a stranger
        core.step(VoteRequest(src, "b", 7, last_log_index=50, last_log_term=6, pre_vote=pre_vote))
        rd = core.ready()
        assert core.term == 0 and rd.hard_state is None
        assert all(isinstance(r, VoteResponse) and not r.granted for r in rd.messages)
        core.advance(rd)
    core.step(VoteRequest("a", "b", 7, last_log_index=50, last_log_term=6, pre_vote=pre_vote))
    rd = core.ready()
    assert [r.granted for r in rd.messages] == [True]  # a voter's, the same request, is granted


def test_a_removed_leader_steps_down_once_the_change_commits_and_another_voter_leads() -> None:
    net = Net(m("abc"))
    lead = net.elect()
    index, _ = lead.propose_membership(ChangeKind.REMOVE, lead.id)
    assert lead.role == Role.LEADER  # leads on until the change commits
    removed_at = net.now
    assert net.run_until(lambda: lead.removed_at is not None and (new := net.leader()) is not None and new.id != lead.id,
                         CFG.election_timeout_ms)
    assert lead.role != Role.LEADER and lead.commit_index >= index
    new = net.leader()
    assert new is not None and new.term > lead.term - 1 and lead.id not in new.membership
    # It handed over: the best voter stood at once, without waiting out an election timeout.
    assert [msg.dst for msg in net.timeout_nows(removed_at)] == [new.id]
    assert net.now - removed_at < CFG.election_timeout_ms


def test_transfer_catches_the_target_up_then_it_wins_at_once() -> None:
    net = Net(m("abc"))
    lead = net.elect()
    target = next(i for i in "abc" if i != lead.id)
    net.cut.add(target)
    first, _ = lead.propose([b"x", b"y"])
    net.run(30)
    net.cut.clear()
    start = net.now
    lead.transfer_leadership(target)
    with pytest.raises(TransferringError) as refused:
        lead.propose([b"z"])
    assert refused.value.leader == target
    assert isinstance(refused.value, NotLeaderError)  # clients retry it as any not-leader answer
    assert lead.status().transferring_to == target
    assert net.run_until(lambda: net.leader() is not None and net.leader().id == target,  # type: ignore[union-attr]
                         CFG.election_timeout_ms)
    assert net.now - start < CFG.election_timeout_ms  # no election timer could have fired
    [timeout_now] = net.timeout_nows(start)
    assert timeout_now.dst == target
    # Sent only once the target held the whole log (it was behind by two entries).
    assert net.cores[target].log.last_index() >= first + 1
    new = net.cores[target]
    assert new.term == lead.term and lead.role == Role.FOLLOWER and lead.leader == target


def test_transfer_to_a_target_that_cannot_win_ends_after_an_election_timeout() -> None:
    net = Net(m("abc"))
    lead = net.elect()
    target = next(i for i in "abc" if i != lead.id)
    net.cut.add(target)
    lead.transfer_leadership(target)
    with pytest.raises(TransferringError):
        lead.propose([b"z"])
    net.run(CFG.election_timeout_ms // 2)
    with pytest.raises(TransferringError):
        lead.propose([b"z"])
    net.run(CFG.election_timeout_ms // 2 + TICK)
    assert lead.role == Role.LEADER and lead.status().transferring_to is None
    index, _ = lead.propose([b"z"])  # takes proposals again
    assert net.run_until(lambda: lead.commit_index >= index)
    assert net.cores[target].role != Role.LEADER  # (its TimeoutNowRequest never arrived)


def test_a_stall_of_the_leader_does_not_run_out_a_transfer() -> None:
    """A transfer's deadline counts a stall between the leader's ticks as one heartbeat interval,
    as its election timer and check-quorum do (stall.py): a leader whose loop was held past an
    election timeout while its target caught up hands over once it runs, where etcd's raft, which
    counts ticks, would too."""
    net = Net(m("abc"))
    lead = net.elect()
    target = next(i for i in "abc" if i != lead.id)
    net.cut.add(target)
    lead.propose([b"x"])
    net.run(30)
    lead.transfer_leadership(target)
    net.now += 2 * CFG.election_timeout_ms  # every loop held (the host paused) for two election timeouts
    for core in net.cores.values():
        core.tick(net.now)
    assert lead.role == Role.LEADER and lead.status().transferring_to == target
    net.cut.clear()
    start = net.now
    assert net.run_until(lambda: net.leader() is not None and net.leader().id == target,  # type: ignore[union-attr]
                         CFG.election_timeout_ms)
    assert [msg.dst for msg in net.timeout_nows(start)] == [target]


def test_transfer_refuses_a_learner_and_itself() -> None:
    net = Net(m("abc", "d"))
    lead = net.elect()
    with pytest.raises(ValueError, match="learner"):
        lead.transfer_leadership("d")
    with pytest.raises(ValueError):
        lead.transfer_leadership(lead.id)
    follower = next(c for c in net.cores.values() if c.role != Role.LEADER)
    with pytest.raises(NotLeaderError):
        follower.transfer_leadership(lead.id)


def test_a_leader_of_two_that_removed_itself_and_lost_leadership_stands_again_to_finish() -> None:
    """Two voters; the leader removes itself, the change reaches no one, and it loses its
    leadership. The other needs its vote (it still counts both), which the longer log refuses, so
    the removed one must stand (counting the other's vote only) to commit the change."""
    net = Net(m("ab"))
    lead = net.elect()
    other = net.cores["b" if lead.id == "a" else "a"]
    net.cut.add(other.id)
    index, _ = lead.propose_membership(ChangeKind.REMOVE, lead.id)
    assert net.run_until(lambda: lead.role != Role.LEADER, 3 * CFG.election_timeout_ms)  # check-quorum
    assert lead.commit_index < index
    net.cut.clear()
    assert net.run_until(lambda: other.role == Role.LEADER and other.commit_index >= index,
                         20 * CFG.election_timeout_ms)
    assert set(other.membership.voters) == {other.id}
    assert net.run_until(lambda: lead.removed_at is not None, 5 * CFG.election_timeout_ms)
