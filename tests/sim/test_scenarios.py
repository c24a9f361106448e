"""Named scenarios from the Raft paper and DLedger's design, each on the simulator with every
safety checker running after every step."""
from __future__ import annotations

import copy
import statistics

import pytest

from raft.core import (
    Entry,
    EntryType,
    HardState,
    HeartbeatRequest,
    HeartbeatResponse,
    MemoryLogStore,
    Message,
    PushCode,
    PushRequest,
    PushResponse,
    PushType,
    Role,
    VoteRequest,
)
from tests.sim.cluster import SIM_CONFIG, TICK_MS, Cluster, SimNode
from tests.sim.disk import SLOW, SLOW_APPLY_MS

T = SIM_CONFIG.election_timeout_ms


def make_log(terms: list[int], hard_term: int) -> MemoryLogStore:
    """A disk holding entries of the given terms; the payload names (index, term), so two logs
    holding the same (index, term) hold the same entry."""
    log = MemoryLogStore()
    entries = [Entry(i, t, EntryType.NORMAL, f"{i}:{t}".encode()) for i, t in enumerate(terms, start=1)]
    log.save(HardState(hard_term, None), None, entries)
    return log


def log_terms(c: Cluster, nid: str) -> list[int]:
    log = c.nodes[nid].log
    return [e.term for e in log.entries(log.before_begin()[0] + 1, log.last_index() + 1)]


def is_leader(c: Cluster, nid: str) -> bool:
    lead = c.leader()
    return lead is not None and lead.id == nid


def elect_first(c: Cluster, nid: str) -> None:
    """The cluster was built with every other node paused: only `nid`'s clock runs past 2T, so it
    campaigns first. Then the others' clocks resume."""
    assert c.run_until(lambda: is_leader(c, nid), 3 * T), f"{nid} was not elected"
    for other in c.nodes:
        c.resume(other)


def elected(c: Cluster) -> SimNode:
    """Run until some node leads; that leader (up, with its core)."""
    assert c.run_until(lambda: c.leader() is not None, 5 * T)
    lead = c.leader()
    assert lead is not None and lead.core is not None
    return lead


def converged(c: Cluster) -> bool:
    lead = c.leader()
    if lead is None or lead.core is None:
        return False
    commit = lead.core.commit_index
    return commit == lead.log.last_index() and all(
        n.core is not None and n.applied == commit and n.log.last_index() == commit for n in c.nodes.values())


def settle(c: Cluster, timeout_ms: int = 20 * T) -> None:
    assert c.run_until(lambda: converged(c), timeout_ms), "cluster did not converge"
    c.check_all()


def count_delivered(c: Cluster, kind: type[Message], src: str, dst: str, **fields: object) -> int:
    return sum(1 for d in c.net.delivered if isinstance(d.msg, kind) and d.msg.src == src and d.msg.dst == dst
               and all(getattr(d.msg, k) == v for k, v in fields.items()))


# --- Figure 7: every follower log is brought in line with the leader's ---

LEADER_LOG = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIGURE7 = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


def figure7_cluster(case: str, record: bool = False) -> Cluster:
    # The leader's disk says term 7, so its election makes it leader of term 8 as in the figure.
    follower = FIGURE7[case]
    logs = {"L": make_log(LEADER_LOG, 7), "F": make_log(follower, max(follower)), "X": make_log(LEADER_LOG, 7)}
    c = Cluster(["L", "F", "X"], seed=7, logs=logs, paused=["F", "X"], record=record)
    elect_first(c, "L")
    return c


@pytest.mark.parametrize("case", sorted(FIGURE7))
def test_figure7_follower_brought_in_line(case: str) -> None:
    c = figure7_cluster(case)
    assert c.nodes["L"].core is not None and c.nodes["L"].core.term == 8
    settle(c)
    assert log_terms(c, "F") == log_terms(c, "L")
    assert log_terms(c, "L")[:10] == LEADER_LOG and set(log_terms(c, "L")[10:]) == {8}
    assert c.nodes["F"].log.entries(1, 11) == c.nodes["L"].log.entries(1, 11)


# --- Figure 8: an entry of an old term is never committed by counting replicas ---

def test_figure8_old_term_entry_not_committed_by_counting() -> None:
    ids = ["S1", "S2", "S3", "S4", "S5"]
    logs = {"S1": make_log([1, 2], 3), "S2": make_log([1, 2], 3), "S3": make_log([1, 2], 3),
            "S4": make_log([1], 3), "S5": make_log([1, 3], 3)}
    c = Cluster(ids, seed=8, logs=logs, paused=ids[1:])
    # S5 (which led term 3) is cut off from S1, and S1's entries of its own term (its no-op) never
    # reach anyone: only (2, 2) can spread.
    c.net.block("S1", "S5")
    c.net.block("S5", "S1")
    c.net.drop_if = lambda m: isinstance(m, PushRequest) and m.src == "S1" and any(e.term == 4 for e in m.entries)
    elect_first(c, "S1")
    assert c.nodes["S1"].core is not None and c.nodes["S1"].core.term == 4
    c.run_for(5 * T)
    assert is_leader(c, "S1")
    assert sum(1 for nid in ids if c.nodes[nid].log.term(2) == 2) >= 3  # (2, 2) is on a majority...
    assert all(n.core is not None and n.core.commit_index < 2 for n in c.nodes.values())  # ...yet not committed
    assert 2 not in c.checker.committed
    # S1 crashes; only S5 may campaign. Its (2, 3) is newer, so it wins and overwrites (2, 2) everywhere.
    assert c.nodes["S5"].log.term(2) == 3
    c.crash("S1")
    c.net.heal()
    c.net.drop_if = lambda m: isinstance(m, VoteRequest) and m.src != "S5"
    assert c.run_until(lambda: is_leader(c, "S5"), 10 * T)
    c.net.drop_if = None
    c.restart("S1")
    settle(c)
    assert all(c.nodes[nid].log.term(2) == 3 for nid in ids)
    assert c.checker.committed[2].term == 3


# --- a partitioned leader's uncommitted entries are overwritten ---

def test_partitioned_leader_entries_overwritten() -> None:
    c = Cluster(3, seed=11)
    old = elected(c)
    c.propose(old.id, [b"before-1", b"before-2"])
    settle(c)
    others = [nid for nid in c.nodes if nid != old.id]
    c.net.partition([old.id], others)
    stranded = c.propose(old.id, [b"lost-1", b"lost-2", b"lost-3"])
    assert len(stranded) == 3
    assert c.run_until(lambda: any(is_leader(c, nid) for nid in others), 10 * T)
    new = c.leader()
    assert new is not None
    kept = c.propose(new.id, [b"kept-1", b"kept-2"])
    assert c.run_until(lambda: all(p.status == "committed" for p in kept), 5 * T)
    c.net.heal()
    settle(c)
    assert all(p.status in ("dropped", "overwritten") for p in stranded), [p.status for p in stranded]
    payloads = {e.payload for e in c.nodes[old.id].log.entries(1, c.nodes[old.id].log.last_index() + 1)}
    assert not payloads & {b"lost-1", b"lost-2", b"lost-3"}
    assert {b"before-1", b"kept-1", b"kept-2"} <= payloads


# --- pre-vote: a node rejoining after a partition does not disturb a healthy leader ---

def test_rejoining_node_does_not_disturb_leader() -> None:
    c = Cluster(3, seed=12)
    lead = elected(c)
    term = lead.core.term
    loner = next(nid for nid in c.nodes if nid != lead.id)
    c.net.partition([loner], [nid for nid in c.nodes if nid != loner])
    terms_seen: set[int] = set()

    def watch(cl: Cluster) -> None:
        core = cl.nodes[loner].core
        if core is not None:
            terms_seen.add(core.term)

    c.after_step_hooks.append(watch)
    c.run_for(10 * T)
    assert c.nodes[loner].core is not None and c.nodes[loner].core.role != Role.LEADER
    c.net.heal()
    c.run_for(10 * T)
    assert terms_seen == {term}, f"the isolated node's term went {sorted(terms_seen)}"
    assert is_leader(c, lead.id) and lead.core.term == term
    assert max(c.checker.leaders) == term


# --- fast backup: one COMPARE round trip per conflicting term, not per entry ---

def test_fast_backup_one_round_trip_per_term() -> None:
    leader_log = [1, 1, 1] + [4] * 25
    follower_log = [1, 1, 1] + [2] * 12 + [3] * 12  # 24 conflicting entries in 2 terms
    logs = {"L": make_log(leader_log, 4), "F": make_log(follower_log, 3), "X": make_log(leader_log, 4)}
    c = Cluster(["L", "F", "X"], seed=13, logs=logs, paused=["F", "X"], record=True)
    elect_first(c, "L")
    settle(c)
    compares = count_delivered(c, PushRequest, "L", "F", type=PushType.COMPARE)
    assert 1 <= compares <= 2 + 2, f"{compares} COMPAREs for 2 conflicting terms"
    assert log_terms(c, "F") == log_terms(c, "L")


# --- stale-term and duplicated pushes ---

def test_stale_term_truncate_and_compare_refused() -> None:
    logs = {nid: make_log([], 5) for nid in ("n1", "n2", "n3")}
    c = Cluster(["n1", "n2", "n3"], seed=14, logs=logs, record=True)
    lead = elected(c)
    c.propose(lead.id, [b"a", b"b", b"c"])
    settle(c)
    term = lead.core.term
    f, other = [nid for nid in c.nodes if nid != lead.id]
    before = c.nodes[f].log.entries(1, c.nodes[f].log.last_index() + 1)
    stale = term - 1
    assert stale >= 1
    for req in (PushRequest(src=other, dst=f, term=stale, type=PushType.TRUNCATE, pre_index=1, pre_term=1,
                            truncate_index=2, truncate_term=0),
                PushRequest(src=other, dst=f, term=stale, type=PushType.COMPARE, pre_index=2, pre_term=stale)):
        mark = len(c.net.sent)
        c.inject(req)
        replies = [d.msg for d in c.net.sent[mark:] if isinstance(d.msg, PushResponse) and d.msg.dst == other]
        assert replies and all(r.code == PushCode.STALE_TERM and r.term == term for r in replies), replies
        assert c.nodes[f].log.entries(1, c.nodes[f].log.last_index() + 1) == before
    settle(c)
    assert is_leader(c, lead.id) and lead.core.term == term


def test_duplicated_truncate_never_deletes_leader_entries() -> None:
    c = figure7_cluster("f", record=True)
    settle(c)
    truncates = [d.msg for d in c.net.sent if isinstance(d.msg, PushRequest) and d.msg.type == PushType.TRUNCATE
                 and d.msg.dst == "F"]
    assert truncates, "the leader never sent F a TRUNCATE"
    c.propose("L", [b"after-1", b"after-2"])
    settle(c)
    want = c.nodes["L"].log.entries(1, c.nodes["L"].log.last_index() + 1)
    for t in truncates:
        c.inject(copy.copy(t))  # the late duplicate of every TRUNCATE the leader ever sent
        assert c.nodes["F"].log.entries(1, c.nodes["F"].log.last_index() + 1) == want
    settle(c)


# --- ReadIndex ---

def test_read_index_waits_for_quorum_round_and_apply() -> None:
    c = Cluster(3, seed=15, record=True)
    lead = elected(c)
    c.propose(lead.id, [b"w1", b"w2"])
    settle(c)
    t0, mark = c.now, len(c.net.sent)
    assert c.read(lead.id, "q1")
    assert c.run_until(lambda: any(r.ctx == "q1" for r in c.clients.served_reads), 3 * T)
    served = next(r for r in c.clients.served_reads if r.ctx == "q1")
    assert served.index >= 2 + 1 and served.applied >= served.index  # no-op + w1 + w2
    rounds = [d.msg.seq for d in c.net.sent[mark:] if isinstance(d.msg, HeartbeatRequest) and d.msg.src == lead.id]
    assert rounds, "no heartbeat round after the read was registered"
    acks = {d.msg.src for d in c.net.delivered if isinstance(d.msg, HeartbeatResponse) and d.msg.dst == lead.id
            and t0 <= d.at <= served.at and d.msg.seq >= min(rounds) and d.msg.success}
    assert len(acks) >= 1, "read served before a quorum confirmed leadership"


def test_read_round_asks_only_a_quorum_and_outlives_a_silent_follower() -> None:
    c = Cluster(3, seed=15, record=True)
    lead = elected(c)
    c.propose(lead.id, [b"w1"])
    settle(c)

    def serve(ctx: str) -> tuple[int, set[str]]:
        """Read ctx on the leader: (ms until served, followers sent a heartbeat meanwhile)."""
        t0, mark = c.now, len(c.net.sent)
        assert c.read(lead.id, ctx)
        assert c.run_until(lambda: any(r.ctx == ctx for r in c.clients.served_reads), 5 * T)
        asked = {d.msg.dst for d in c.net.sent[mark:] if isinstance(d.msg, HeartbeatRequest) and d.msg.src == lead.id}
        return c.now - t0, asked

    took, asked = serve("q1")
    assert len(asked) == 1 and took < SIM_CONFIG.heartbeat_interval_ms  # a majority is the leader and one follower
    (chosen,) = asked
    # The chosen follower goes silent: the next periodic heartbeat, sent to both, confirms the
    # round through the other, which is then asked first.
    c.net.block(chosen, lead.id)
    took, asked = serve("q2")
    assert asked == set(c.nodes) - {lead.id} and took <= 2 * SIM_CONFIG.heartbeat_interval_ms
    took, asked = serve("q3")
    assert asked == set(c.nodes) - {lead.id, chosen} and took < SIM_CONFIG.heartbeat_interval_ms
    c.check_all()


def test_deposed_leader_never_serves_read() -> None:
    c = Cluster(3, seed=16)
    old = elected(c)
    c.propose(old.id, [b"x1"])
    settle(c)
    others = [nid for nid in c.nodes if nid != old.id]
    c.net.partition([old.id], others)
    asked = c.read(old.id, "stale?")
    assert c.run_until(lambda: any(is_leader(c, nid) for nid in others), 10 * T)
    new = c.leader()
    assert new is not None
    c.propose(new.id, [b"x2"])
    c.run_for(5 * T)
    c.net.heal()
    settle(c)
    assert not any(r.ctx == "stale?" for r in c.clients.served_reads)
    if asked:
        assert any(fr.ctx == "stale?" for _, fr in c.clients.failed_reads), "the read was neither served nor failed"


# --- check-quorum ---

def test_check_quorum_cut_off_leader_steps_down() -> None:
    c = Cluster(5, seed=17)
    lead = elected(c)
    c.run_for(3 * T)
    t0 = c.now
    c.net.partition([lead.id], [nid for nid in c.nodes if nid != lead.id])
    assert c.run_until(lambda: lead.core is not None and lead.core.role != Role.LEADER, 3 * T)
    took = c.now - t0
    assert took <= T + SIM_CONFIG.heartbeat_interval_ms + 2 * TICK_MS, f"stepped down after {took} ms (T = {T})"


# --- an apply that outlasts an election timeout costs no leadership ---

@pytest.mark.parametrize("batch", [1, 6], ids=["one-slow-entry", "batch-for-the-apply-thread"])
def test_apply_longer_than_an_election_timeout_keeps_the_leader(batch: int) -> None:
    """Every member spends SLOW_APPLY_MS (5 T) applying one command (a range deletion of 100,000
    keys), on its apply thread: one such entry alone (in_proportion keeps it off the loop) or in a
    batch. The leader's heartbeats and the followers' answers leave meanwhile
    (RaftCore.take_early_messages): nobody stands, the leader does not step down, and the
    entry commits and applies everywhere in its term."""
    assert SLOW_APPLY_MS >= 5 * T
    c = Cluster(3, seed=19)
    lead = elected(c)
    term = lead.core.term  # type: ignore[union-attr]
    c.propose(lead.id, [SLOW + b"-delete-range", *(b"b%d" % i for i in range(batch - 1))])
    settle(c, 3 * SLOW_APPLY_MS)
    assert c.leader() is lead
    assert {n.core.term for n in c.nodes.values() if n.core is not None} == {term}
    assert all(n.raft is not None and n.raft.stats.leader_changes == 1 for n in c.nodes.values())


@pytest.mark.parametrize("who", ["a-follower", "every-member"])
def test_a_held_loop_reads_what_arrived_before_its_timers_judge(who: str) -> None:
    """A member's loop held for 3 T (a slow fsync on a loaded disk; every member at once: the
    host stalled) runs its timers before it reads its socket, where the leader's heartbeats (the
    followers' answers) wait. Its timers count the stall as one heartbeat interval
    (raft/core/stall.py): nobody stands, the leader does not step down, and no member
    counts a leader change."""
    c = Cluster(3, seed=20)
    lead = elected(c)
    c.run_for(2 * T)
    term = lead.core.term  # type: ignore[union-attr]
    c.stall([next(n for n in c.nodes if n != lead.id)] if who == "a-follower" else list(c.nodes), 3 * T)
    c.run_for(6 * T)
    assert c.leader() is lead
    assert {n.core.term for n in c.nodes.values() if n.core is not None} == {term}
    assert all(n.raft is not None and n.raft.stats.leader_changes == 1 for n in c.nodes.values())


# --- a restarted follower catches up while the leader is idle ---

def test_restarted_follower_learns_commit_from_idle_leader() -> None:
    c = Cluster(3, seed=18)
    lead = elected(c)
    c.propose(lead.id, [b"i1", b"i2", b"i3"])
    settle(c)
    follower = next(nid for nid in c.nodes if nid != lead.id)
    c.crash(follower)
    c.restart(follower)
    # No new proposals: heartbeats (and COMMIT pushes) alone must bring its commit index back.
    settle(c, 10 * T)
    assert c.nodes[follower].applied == lead.core.commit_index  # type: ignore[union-attr]


# --- a leader's crash reported by the transport: stand at T, not at a random [T, 2T) ---

def _election_after_leader_crash(seed: int, report: bool) -> int:
    """Virtual ms from a leader's crash until a new leader, with or without the transport's
    report (connection refused) reaching the followers at the moment of the crash."""
    c = Cluster(3, seed=seed)
    assert c.run_until(lambda: c.leader() is not None, 5 * T)
    c.run_for(2 * T)
    lead = c.leader()
    assert lead is not None
    c.crash(lead.id)
    crashed_at = c.now
    if report:
        for nid, node in c.nodes.items():
            if nid != lead.id and node.core is not None:
                node.core.peer_unreachable(lead.id)
    assert c.run_until(lambda: c.leader() is not None, 5 * T)
    c.check_all()
    return c.now - crashed_at


def test_leader_crash_reported_by_the_transport_starts_the_election_at_t() -> None:
    """Pre-votes succeed only once no follower heard from the leader for T (the last heartbeat
    came at most a heartbeat interval before the crash). With the report a follower stands then,
    plus up to T/4 of jitter, instead of after its random timer in [T, 2T). Over 40 seeds the
    typical election comes sooner; the bound adds two message rounds (pre-vote, vote)."""
    seeds = range(21, 61)
    with_report = [_election_after_leader_crash(seed, report=True) for seed in seeds]
    without = [_election_after_leader_crash(seed, report=False) for seed in seeds]
    print(f"\nmedian election after a crash: {statistics.median(with_report)} ms with the report, "
          f"{statistics.median(without)} ms without (T = {T} ms)")
    assert statistics.median(with_report) < statistics.median(without)
    assert statistics.median(with_report) <= T + T // 4 + 2 * 2 * 10 + 2 * TICK_MS


def test_wrong_report_of_a_live_leader_changes_nothing() -> None:
    """The report only moves a timer; the live leader's next heartbeat resets it."""
    c = Cluster(3, seed=31)
    lead = elected(c)
    term = lead.core.term
    for _ in range(5):
        for nid, node in c.nodes.items():
            if nid != lead.id and node.core is not None:
                node.core.peer_unreachable(lead.id)
        c.run_for(T)
    assert c.leader() is lead and lead.core.term == term
