"""Unit tests for the pieces of raft/core: the log view, the follower's push rules, the leader's
fast backup, quorum and read bookkeeping. Whole-protocol behaviour is proven in tests/sim."""
from __future__ import annotations

import random

import pytest

from raft.core import (
    CoreConfig, Entry, HardState, HeartbeatRequest, InstallSnapshotRequest, MemoryLogStore, NotLeaderError, PushCode,
    PushRequest, PushResponse, PushType, RaftCore, Role, SnapshotMeta, VoteRequest,
)
from raft.core.dispatcher import Dispatcher, DispatchState
from raft.core.eager_set import EagerSet
from raft.core.entry_handler import EntryHandler
from raft.core.quorum import QuorumTracker
from raft.core.raft_log import RaftLog
from raft.core.read_index import ReadIndexTracker


def entries(first: int, terms: list[int]) -> list[Entry]:
    return [Entry(first + k, t) for k, t in enumerate(terms)]


def store_with(terms: list[int], hard: HardState = HardState()) -> MemoryLogStore:
    s = MemoryLogStore()
    s.save(hard, None, entries(1, terms))
    return s


# --- RaftLog ---------------------------------------------------------------------------------

def test_raft_log_reads_unstable_over_store() -> None:
    log = RaftLog(store_with([1, 1, 2]))
    log.truncate_from(3)
    log.append(entries(3, [3, 3]))
    assert [log.term(i) for i in range(1, 6)] == [1, 1, 3, 3, None]
    assert log.last_index() == 4
    assert log.last_index_of_term(2) is None  # the store still holds it, but it is truncated away
    assert log.first_index_of_term(3) == 3
    truncate, new = log.take_unpersisted()
    assert truncate == 3 and [e.index for e in new] == [3, 4]


def test_raft_log_write_superseded_by_truncation_is_not_marked_stable() -> None:
    store = store_with([1])
    log = RaftLog(store)
    log.append(entries(2, [1, 1]))
    _, handed = log.take_unpersisted()
    log.truncate_from(2)  # decided while the driver writes `handed`
    log.append(entries(2, [2]))
    store.save(None, None, handed)
    log.stable_to(handed[-1].index, handed[-1].term)
    assert log.persisted_index == 1
    truncate, again = log.take_unpersisted()
    assert truncate == 2 and again == entries(2, [2])  # the next Ready redoes the truncation


def test_raft_log_entries_respect_byte_limit_across_store_and_unstable() -> None:
    log = RaftLog(store_with([1, 1]))
    log.append(entries(3, [1, 1]))
    one = Entry(1, 1).size()
    assert [e.index for e in log.entries(1, 5, max_bytes=3 * one)] == [1, 2, 3]
    assert [e.index for e in log.entries(1, 5, max_bytes=1)] == [1]  # always at least one


# --- EntryHandler (follower side) ------------------------------------------------------------

def handler_for(terms: list[int]) -> tuple[EntryHandler, RaftLog]:
    log = RaftLog(store_with(terms))
    return EntryHandler(log, CoreConfig()), log


def push(type_: PushType, term: int = 5, **kw: object) -> PushRequest:
    return PushRequest(src="L", dst="F", term=term, type=type_, **kw)  # type: ignore[arg-type]


def test_compare_answers_fast_backup_fields() -> None:
    h, _ = handler_for([1, 1, 2, 2, 2])
    [r] = h.handle(push(PushType.COMPARE, pre_index=4, pre_term=3), now=0, commit_index=0)
    assert (r.code, r.x_term, r.x_index, r.end_index) == (PushCode.INCONSISTENT, 2, 3, 5)
    [r] = h.handle(push(PushType.COMPARE, pre_index=9, pre_term=3), now=0, commit_index=0)
    assert (r.code, r.x_term, r.end_index) == (PushCode.INCONSISTENT, 0, 5)
    [r] = h.handle(push(PushType.COMPARE, pre_index=2, pre_term=1), now=0, commit_index=0)
    assert r.code == PushCode.SUCCESS and h.verified_index == 2


def test_truncate_only_removes_a_real_conflict() -> None:
    h, log = handler_for([1, 1, 2, 2])
    # The leader's term at 3 is 2 as well: nothing conflicts, nothing goes.
    [r] = h.handle(push(PushType.TRUNCATE, truncate_index=3, truncate_term=2), now=0, commit_index=0)
    assert r.code == PushCode.SUCCESS and log.last_index() == 4
    # An entry of the request's own term came from this leader: a duplicated TRUNCATE keeps it.
    h2, log2 = handler_for([1, 1, 5])
    [r] = h2.handle(push(PushType.TRUNCATE, term=5, truncate_index=3, truncate_term=0), now=0, commit_index=0)
    assert log2.last_index() == 3
    # A real conflict above the commit index is removed.
    [r] = h.handle(push(PushType.TRUNCATE, truncate_index=3, truncate_term=4), now=0, commit_index=2)
    assert r.code == PushCode.SUCCESS and log.last_index() == 2


def test_truncate_never_goes_at_or_below_commit() -> None:
    h, log = handler_for([1, 1, 2, 2])
    [r] = h.handle(push(PushType.TRUNCATE, truncate_index=3, truncate_term=4), now=0, commit_index=3)
    assert r.code == PushCode.REFUSED and log.last_index() == 4


def test_append_never_deletes_and_holds_out_of_order_batches() -> None:
    h, log = handler_for([1, 1, 2])
    [r] = h.handle(push(PushType.APPEND, pre_index=2, pre_term=1, entries=entries(3, [4])), now=0, commit_index=0)
    assert r.code == PushCode.INCONSISTENT and log.term(3) == 2  # conflict answered, not deleted
    # A batch from past our end waits for the gap to fill.
    ahead = push(PushType.APPEND, pre_index=4, pre_term=2, entries=entries(5, [2]))
    assert h.handle(ahead, now=0, commit_index=0) == []
    out = h.handle(push(PushType.APPEND, pre_index=3, pre_term=2, entries=entries(4, [2])), now=1, commit_index=0)
    assert [(x.code, x.index) for x in out] == [(PushCode.SUCCESS, 4), (PushCode.SUCCESS, 5)]
    # One that never gets its gap filled is answered INCONSISTENT after the hold time.
    h.handle(push(PushType.APPEND, pre_index=9, pre_term=2, entries=entries(10, [2])), now=10, commit_index=0)
    assert h.expire_held(10 + CoreConfig().out_of_order_hold_ms - 1) == []
    [late] = h.expire_held(10 + CoreConfig().out_of_order_hold_ms)
    assert late.code == PushCode.INCONSISTENT and late.end_index == 5


def test_commit_learned_is_capped_at_verified_prefix() -> None:
    h, _ = handler_for([1, 1, 2, 2])
    assert h.commit_bound(4) == 0  # nothing verified against this leader yet
    h.handle(push(PushType.COMPARE, pre_index=2, pre_term=1), now=0, commit_index=0)
    assert h.commit_bound(4) == 2


# --- Dispatcher (leader side) ------------------------------------------------------------------

class _Leader:
    def __init__(self, terms: list[int], term: int) -> None:
        self.id, self.term, self.commit_index = "L", term, 0
        self.log = RaftLog(store_with(terms))
        self.config = CoreConfig()


def test_fast_backup_jumps_to_our_last_entry_of_the_followers_term() -> None:
    leader = _Leader([1, 1, 1, 4, 4, 5, 5, 6, 6, 6], term=8)
    d = Dispatcher("F", leader)
    [c] = d.start(0)
    assert (c.type, c.pre_index) == (PushType.COMPARE, 10)
    # The follower holds term 4 at 10, running from index 7 (Figure 7 (f)-like): we hold term 4
    # up to index 5, so the next compare is at 5, not at 6 (x_index - 1) nor 9.
    [c] = d.on_push_response(PushResponse("F", "L", 8, type=PushType.COMPARE, code=PushCode.INCONSISTENT,
                                          pre_index=10, end_index=11, x_term=4, x_index=7), 0)
    assert c.pre_index == 5
    # A term we never had: jump before its first index.
    [c] = d.on_push_response(PushResponse("F", "L", 8, type=PushType.COMPARE, code=PushCode.INCONSISTENT,
                                          pre_index=5, end_index=11, x_term=3, x_index=4), 0)
    assert c.pre_index == 3
    [t] = d.on_push_response(PushResponse("F", "L", 8, type=PushType.COMPARE, code=PushCode.SUCCESS,
                                          pre_index=3, end_index=11), 0)
    assert d.state == DispatchState.TRUNCATE and (t.truncate_index, t.truncate_term) == (4, 4)


def test_dispatcher_goes_to_install_snapshot_below_the_compaction_point() -> None:
    store = store_with([1] * 10)
    store.compact(8)
    leader = _Leader([], term=2)
    leader.log = RaftLog(store)
    d = Dispatcher("F", leader)
    d.start(0)
    out = d.on_push_response(PushResponse("F", "L", 2, type=PushType.COMPARE, code=PushCode.INCONSISTENT,
                                          pre_index=10, end_index=3), 0)
    assert d.state == DispatchState.INSTALL_SNAPSHOT and len(out) == 1 and out[0].peer == "F"


def test_pipelined_appends_and_resend_from_match_after_timeout() -> None:
    leader = _Leader([1] * 40, term=1)
    leader.config = CoreConfig(max_batch_entries=5, max_inflight_batches=3)
    d = Dispatcher("F", leader)
    d.start(0)
    out = d.on_push_response(PushResponse("F", "L", 1, type=PushType.COMPARE, code=PushCode.SUCCESS,
                                          pre_index=40, end_index=0), 0)
    assert d.state == DispatchState.APPEND
    d.match_index = 10
    d._change_state(DispatchState.APPEND, 0)
    d._inflight.clear(); d.next_index = 11
    out = d.poll(0)
    assert [(m.pre_index, len(m.entries)) for m in out] == [(10, 5), (15, 5), (20, 5)]
    assert d.tick(leader.config.push_timeout_ms - 1) == []
    again = d.tick(leader.config.push_timeout_ms)
    assert again[0].pre_index == 10  # resent from match + 1


def test_answer_time_is_a_moving_average_of_append_round_trips() -> None:
    leader = _Leader([1] * 4, term=1)
    leader.config = CoreConfig(max_batch_entries=1, max_inflight_batches=4)
    d = Dispatcher("F", leader)
    d.start(0)
    # An empty follower: the compare at our last index fails, the one at 0 matches.
    d.on_push_response(PushResponse("F", "L", 1, type=PushType.COMPARE, code=PushCode.INCONSISTENT,
                                    pre_index=4, end_index=0), 90)
    sent = d.on_push_response(PushResponse("F", "L", 1, type=PushType.COMPARE, code=PushCode.SUCCESS,
                                           pre_index=0, end_index=0), 100)
    assert [(m.type, m.pre_index) for m in sent] == [(PushType.APPEND, i) for i in range(4)]  # at 100
    assert d.answer_ms is None  # COMPARE answers are not timed

    def ack(index: int, at: int) -> None:
        d.on_push_response(PushResponse("F", "L", 1, type=PushType.APPEND, code=PushCode.SUCCESS,
                                        index=index, end_index=index), at)

    ack(1, 104)
    assert d.answer_ms == 4.0
    ack(3, 120)  # two batches answered at once, each 20 ms after it left
    assert d.answer_ms == pytest.approx(4 + 16 / 8 + (20 - 6) / 8)


def test_a_lazy_follower_gets_a_batch_at_once_when_its_tail_fills_one_and_each_entry_is_read_once() -> None:
    leader = _Leader([1] * 3, term=1)
    payload = b"x" * 100
    size = Entry(0, 1, payload=payload).size()
    leader.config = CoreConfig(max_batch_entries=8, max_batch_bytes=3 * size)
    d = Dispatcher("F", leader)
    d.state, d.match_index, d.next_index, d.eager = DispatchState.APPEND, 3, 4, False
    d._tail_due = 1_000  # a tail batch went at 900: the next one that is not full waits until 1000
    reads: list[int] = []
    read = leader.log.entries

    def counted(lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        got = read(lo, hi, max_bytes)
        reads.extend(e.index for e in got)
        return got

    leader.log.entries = counted  # type: ignore[method-assign]
    for index in (4, 5, 6):  # three entries: exactly max_batch_bytes, not past it
        leader.log.append([Entry(index, 1, payload=payload)])
        assert d.poll(index) == []
    assert sorted(reads) == [4, 5, 6]  # the growing tail is added up, not read again at each poll
    leader.log.append([Entry(7, 1, payload=payload)])
    [batch] = d.poll(7)  # past max_batch_bytes: a full batch goes at once, as log.entries cuts it
    assert [e.index for e in batch.entries] == [4, 5, 6]
    assert d.poll(8) == []  # entry 7 alone is a tail again: it waits
    [tail] = d.poll(1_000)
    assert [e.index for e in tail.entries] == [7]


def test_a_lazy_follower_gets_a_batch_at_once_when_its_tail_reaches_max_batch_entries() -> None:
    leader = _Leader([1] * 3, term=1)
    leader.config = CoreConfig(max_batch_entries=4)
    d = Dispatcher("F", leader)
    d.state, d.match_index, d.next_index, d.eager = DispatchState.APPEND, 3, 4, False
    d._tail_due = 1_000
    leader.log.append(entries(4, [1, 1, 1]))
    assert d.poll(0) == []
    leader.log.append(entries(7, [1]))
    [batch] = d.poll(0)
    assert [e.index for e in batch.entries] == [4, 5, 6, 7]


def _appending(peer: str, leader: _Leader, answer_ms: float | None, eager: bool) -> Dispatcher:
    d = Dispatcher(peer, leader)
    d.state, d.answer_ms, d.eager = DispatchState.APPEND, answer_ms, eager
    return d


@pytest.mark.parametrize("eager_ms, lazy_ms, swapped", [
    (7.0, 2.0, True),    # more than twice as slow and by more than a tenth of eager_timeout_ms (2)
    (6.0, 2.0, False),   # not by enough
    (2.5, 0.1, True),
    (2.1, 0.0, True),
    (1.9, 0.0, False),   # twice as slow, but within 2 ms
    (50.0, None, False),  # nothing to compare with
    (None, 1.0, False),
])
def test_an_eager_follower_much_slower_than_a_lazy_one_gives_its_place(
        eager_ms: float | None, lazy_ms: float | None, swapped: bool) -> None:
    leader = _Leader([1], term=1)  # eager_timeout_ms 20
    e, lz = _appending("E", leader, eager_ms, True), _appending("Z", leader, lazy_ms, False)
    EagerSet([e, lz], 1, leader.config, now=0).tick(0)  # (its first trial would come at 1 s)
    assert (lz.eager, e.eager) == (swapped, not swapped)


def test_the_core_clock_only_moves_forward() -> None:
    core = RaftCore("a", ["a", "b", "c"], MemoryLogStore(), CoreConfig(), random.Random(1), now=10)
    core.clock(50)
    core.clock(30)
    assert core.now == 50
    core.tick(40)
    assert core.now == 50


# --- quorum, reads -------------------------------------------------------------------------------

def test_quorum_index_is_what_a_majority_holds() -> None:
    q = QuorumTracker(["a", "b", "c", "d", "e"])
    for m, i in zip("abcde", [9, 7, 5, 3, 1]):
        q.update(m, i)
    assert q.quorum_index() == 5
    assert not q.update("a", 4)  # never backwards


def test_one_round_serves_every_read_that_arrived_before_it() -> None:
    r = ReadIndexTracker()
    r.add("a", 5); r.add("b", 6)
    r.round_sent(1)
    r.add("c", 7)  # arrived after round 1 was sent: round 1 cannot prove it
    assert not r.wants_round()  # one round in flight at a time
    r.round_confirmed(1)
    assert [s.ctx for s in r.take_ready(applied_index=10)] == ["a", "b"]
    assert r.wants_round()


# --- RaftCore bits that need no network --------------------------------------------------------

def test_single_node_elects_itself_and_commits_after_persisting() -> None:
    store = MemoryLogStore()
    core = RaftCore("a", ["a"], store, CoreConfig(), random.Random(1), now=0)
    for now in range(10, 2001, 10):  # ticks as a driver makes them (one gap of 2 s would be a stall)
        core.tick(now)
    assert core.role == Role.LEADER
    rd = core.ready()
    assert rd.hard_state == HardState(1, "a") and rd.entries and rd.committed_entries == []
    store.save(rd.hard_state, rd.truncate_from, rd.entries)
    core.advance(rd)
    assert core.commit_index == 1  # counted itself only once its own write was durable
    with pytest.raises(RuntimeError):
        core.advance(rd)


def test_stale_term_push_is_refused_not_obeyed() -> None:
    store = store_with([1, 1, 3], HardState(3))
    core = RaftCore("f", ["f", "L"], store, CoreConfig(), random.Random(1), now=0)
    core.step(PushRequest("L", "f", 2, type=PushType.TRUNCATE, truncate_index=2, truncate_term=9))
    rd = core.ready()
    [reply] = rd.messages
    assert reply.code == PushCode.STALE_TERM and reply.term == 3
    assert core.log.last_index() == 3 and rd.truncate_from is None


def test_vote_needs_an_up_to_date_log_and_is_persisted_before_the_reply() -> None:
    store = store_with([1, 2], HardState(2))
    core = RaftCore("f", ["f", "a", "b"], store, CoreConfig(), random.Random(1), now=0)
    core.step(VoteRequest("a", "f", 3, last_log_index=5, last_log_term=1))  # older last term
    rd = core.ready()
    assert rd.messages[0].granted is False and rd.hard_state == HardState(3, None)
    core.advance(rd)
    core.step(VoteRequest("b", "f", 3, last_log_index=2, last_log_term=2))
    rd = core.ready()
    assert rd.messages[0].granted is True and rd.hard_state == HardState(3, "b")


def test_not_leader_carries_the_known_leader() -> None:
    core = RaftCore("f", ["f", "L"], store_with([1]), CoreConfig(), random.Random(1), now=0)
    core.step(PushRequest("L", "f", 1, type=PushType.COMMIT))
    with pytest.raises(NotLeaderError) as info:
        core.propose([b"x"])
    assert info.value.leader == "L"


def test_snapshot_install_resets_log_and_indexes() -> None:
    store = store_with([1, 1])
    core = RaftCore("f", ["f", "L"], store, CoreConfig(), random.Random(1), now=0)
    core.step(InstallSnapshotRequest("L", "f", 2, meta=SnapshotMeta(50, 2)))
    rd = core.ready()
    assert rd.snapshot == SnapshotMeta(50, 2) and rd.committed_entries == []
    store.reset_to_snapshot(50, 2)
    core.advance(rd)
    st = core.status()
    assert (st.commit_index, st.applied_index, st.snapshot_index, st.last_index) == (50, 50, 50, 50)


def test_truncate_after_compaction_past_the_match_goes_to_install_not_a_false_truncate() -> None:
    """Regression (sim seed 9008): a COMPARE answered after we compacted past the match point
    must not become TRUNCATE(term 0), which told the follower we hold nothing there."""
    store = store_with([1] * 30)
    leader = _Leader([], term=1)
    leader.log = RaftLog(store)
    d = Dispatcher("F", leader)
    d.start(0)
    d._probe = 20
    store.compact(25)
    d.on_push_response(PushResponse("F", "L", 1, type=PushType.COMPARE, code=PushCode.SUCCESS,
                                    pre_index=20, end_index=28), 0)
    assert d.state == DispatchState.INSTALL_SNAPSHOT


def test_follower_refuses_a_truncate_claiming_no_entry_below_the_leaders_commit() -> None:
    h, log = handler_for([1, 1, 2, 2])
    [r] = h.handle(push(PushType.TRUNCATE, truncate_index=3, truncate_term=0, commit_index=4), now=0, commit_index=1)
    assert r.code == PushCode.REFUSED and log.last_index() == 4


def test_a_stall_between_ticks_counts_as_one_heartbeat_interval() -> None:
    """A follower whose ticks stop for 3 T (its loop held) does not stand at the first tick after:
    its leader's heartbeats wait unread in its socket. Silence it sees while ticking still counts
    in full: it stands within 2 T of ticking without a word from its leader."""
    config = CoreConfig()
    t = config.election_timeout_ms
    core = RaftCore("f", ["f", "L", "o"], store_with([1]), config, random.Random(7), now=0)
    core.step(HeartbeatRequest("L", "f", 1, commit_index=0, seq=1))
    core.advance(core.ready())
    resumed = 3 * t
    core.tick(resumed)
    assert core.role is Role.FOLLOWER and core.leader == "L"
    for now in range(resumed + 10, resumed + 3 * t, 10):
        core.tick(now)
        if core.role is not Role.FOLLOWER:
            break
    assert core.role is Role.PRE_CANDIDATE and now - resumed <= 2 * t + config.heartbeat_interval_ms


def _pre_vote_time(reports: int) -> int:
    """When a follower that last heard its leader at 1000 ms, and is then told `reports` times
    that the leader's connection failed, stands for election (virtual ms)."""
    core = RaftCore("f", ["f", "L", "o"], store_with([1]), CoreConfig(), random.Random(7), now=0)
    core.tick(1000)
    core.step(HeartbeatRequest("L", "f", 1, commit_index=0, seq=1))
    core.advance(core.ready())
    for _ in range(reports):
        core.peer_unreachable("L")
    for now in range(1001, 5000):
        core.tick(now)
        if core.role is Role.PRE_CANDIDATE:
            return now
    raise AssertionError("the follower never stood")


def test_repeated_reports_of_a_gone_leader_draw_the_jitter_once() -> None:
    """The transport reports a gone leader on every failed reconnect (every 50 ms). Each report
    used to draw the jitter again and keep the earliest deadline, so after twenty reports both
    followers stood within a few ms of T and split the vote (W7: one kill in four took a second
    election). Only the first report of a silence moves the timer."""
    once = _pre_vote_time(1)
    t = CoreConfig().election_timeout_ms
    assert 1000 + t <= once < 1000 + t + t // 4
    assert _pre_vote_time(20) == once
