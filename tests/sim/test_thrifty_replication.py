"""Thrifty replication (raft/core/eager_set.py) on the simulator: new entries go at once only to
the followers a majority needs; the others get full batches at once and the rest within
lazy_push_ms; a silent eager follower gives its place within eager_timeout_ms, a much slower one
as soon as its answer times show it, a little slower one at a trial. Every safety checker runs
after every step, as in test_scenarios.py."""
from __future__ import annotations

import dataclasses

import pytest

from raft.core import CoreConfig, PushRequest, PushType
from tests.sim.cluster import SIM_CONFIG, TICK_MS, Cluster, SimNode

T = SIM_CONFIG.election_timeout_ms
# Tick-to-tick slack of the timings below: the leader checks its followers at its ticks, and the
# simulated network delays a message up to 5 ms each way.
SLACK_MS = 2 * TICK_MS + 10


def cluster(n: int, **config: object) -> Cluster:
    return Cluster(n, seed=21, config=dataclasses.replace(SIM_CONFIG, **config), record=True)


def settled_leader(c: Cluster) -> SimNode:
    assert c.run_until(lambda: c.leader() is not None, 5 * T)
    lead = c.leader()
    assert lead is not None and lead.core is not None
    c.propose(lead.id, [b"first"])
    assert c.run_until(lambda: all(n.log.last_index() == lead.log.last_index() and not c.pending()
                                   for n in c.nodes.values()), 20 * T), "cluster did not converge"
    return lead


def appends_of(c: Cluster, lead: SimNode, index: int, since: int) -> dict[str, int]:
    """follower -> when the leader first sent it an APPEND carrying entry `index`."""
    first: dict[str, int] = {}
    for d in c.net.sent[since:]:
        m = d.msg
        if (isinstance(m, PushRequest) and m.src == lead.id and m.type == PushType.APPEND
                and any(e.index == index for e in m.entries)):
            first.setdefault(m.dst, d.at)
    return first


def write(c: Cluster, lead: SimNode, payload: bytes) -> tuple[int, int, int]:
    """Propose on the leader and run until it commits: (index, proposed at, committed at)."""
    assert lead.core is not None
    mark, t0 = len(c.net.sent), c.now
    (p,) = c.propose(lead.id, [payload])
    assert c.run_until(lambda: lead.core is not None and lead.core.commit_index >= p.index, 5 * T)
    return p.index, t0, mark


def test_a_lone_write_goes_at_once_to_one_follower_of_two_and_to_the_other_within_lazy_push_ms() -> None:
    # (eager_timeout_ms well above the simulated round trip, which may take 10 ms, and the
    # leader's clock, which moves at its ticks: no swap for slowness here)
    c = cluster(3, lazy_push_ms=150, eager_timeout_ms=50)
    lead = settled_leader(c)
    index, t0, mark = write(c, lead, b"w")
    sent = appends_of(c, lead, index, mark)
    at_once = [f for f, at in sent.items() if at == t0]
    assert len(at_once) == 1  # one follower, at once: it committed the write
    (eager,) = at_once
    (lazy,) = set(c.nodes) - {lead.id, eager}
    assert c.run_until(lambda: c.nodes[lazy].log.last_index() >= index, 150 + SLACK_MS)
    # Its batch went at a later tick: at the first after the write when its last batch went
    # lazy_push_ms ago, else at most lazy_push_ms later.
    assert t0 < appends_of(c, lead, index, mark)[lazy] <= t0 + 150 + TICK_MS
    # The choice is sticky: the following writes go at once to the same follower.
    for k in range(5):
        c.run_for(37)
        index, t0, mark = write(c, lead, b"w%d" % k)
        assert [f for f, at in appends_of(c, lead, index, mark).items() if at == t0] == [eager]
    c.check_all()


def test_a_lazy_follower_gets_full_batches_without_waiting() -> None:
    c = cluster(3, lazy_push_ms=10_000, max_batch_entries=4)
    lead = settled_leader(c)
    index, t0, mark = write(c, lead, b"w")  # names the eager follower
    (eager,) = appends_of(c, lead, index, mark)
    (lazy,) = set(c.nodes) - {lead.id, eager}
    mark = len(c.net.sent)
    first = c.propose(lead.id, [b"b%d" % k for k in range(9)])[0]
    c.run_for(TICK_MS + 1)
    to_lazy = [d.msg for d in c.net.sent[mark:] if isinstance(d.msg, PushRequest) and d.msg.dst == lazy
               and d.msg.type == PushType.APPEND]
    # The lazy follower missed the lone write (not a full batch) but takes full batches at the
    # next tick: the lone write with the first three, then the next four; the ninth entry waits.
    assert [len(m.entries) for m in to_lazy] == [4, 4]
    assert to_lazy[0].entries[0].index == index and to_lazy[-1].entries[-1].index == first.index + 6
    c.check_all()


def test_a_silent_eager_follower_gives_its_place_within_eager_timeout_ms() -> None:
    c = cluster(3, lazy_push_ms=10_000, eager_timeout_ms=30)
    lead = settled_leader(c)
    index, t0, mark = write(c, lead, b"w")
    (eager,) = appends_of(c, lead, index, mark)
    (other,) = set(c.nodes) - {lead.id, eager}
    c.net.block(eager, lead.id)  # its answers are lost: to the leader it is silent
    index, t0, mark = write(c, lead, b"w2")
    took = c.now - t0
    # (the leader dates a send by its last tick, so it may see the silence up to a tick early)
    assert 30 - TICK_MS <= took <= 30 + SLACK_MS, f"committed after {took} ms, lazy_push_ms is 10 s"
    assert set(appends_of(c, lead, index, mark)) == {eager, other}
    # The follower that answered is eager now: the next write goes to it at once.
    index, t0, mark = write(c, lead, b"w3")
    assert appends_of(c, lead, index, mark).get(other) == t0
    assert c.now - t0 < 30
    c.check_all()


def eager_of(c: Cluster, lead: SimNode, payload: bytes) -> tuple[str, int]:
    """Write once: (the follower the write went to at once, how long it took to commit)."""
    index, t0, mark = write(c, lead, payload)
    (eager,) = [f for f, at in appends_of(c, lead, index, mark).items() if at == t0]
    return eager, c.now - t0


def test_an_eager_follower_that_answers_slowly_gives_its_place_to_a_much_faster_one() -> None:
    # Its answers take 60 ms more than the other's, well within eager_timeout_ms: only its
    # slowness can move it (no trials here). The simulated network takes 1-10 ms each way.
    c = cluster(3, lazy_push_ms=50, eager_timeout_ms=100, eager_trial_every_ms=0)
    lead = settled_leader(c)
    eager, _ = eager_of(c, lead, b"w")
    (other,) = set(c.nodes) - {lead.id, eager}
    c.net.slow[eager] = 60
    chosen = [eager_of(c, lead, b"w%d" % k) for k in range(30)]
    moved = next((k for k, (f, _) in enumerate(chosen) if f == other), None)
    # Not at the first slow answer (the answer time is a moving average), but within a few dozen.
    assert moved is not None and moved >= 3, [f for f, _ in chosen]
    # From then on every write goes at once to the fast follower and commits at its pace.
    assert all(f == other and took <= 20 + SLACK_MS for f, took in chosen[moved + 1:]), chosen[moved:]
    c.check_all()


def test_followers_alike_in_slowness_keep_the_choice() -> None:
    c = cluster(3, lazy_push_ms=50, eager_timeout_ms=100, eager_trial_every_ms=0)
    lead = settled_leader(c)
    eager, _ = eager_of(c, lead, b"w")
    for f in set(c.nodes) - {lead.id}:
        c.net.slow[f] = 40
    assert [eager_of(c, lead, b"w%d" % k)[0] for k in range(30)] == [eager] * 30
    c.check_all()


def share_to(c: Cluster, lead: SimNode, follower: str, writes: int) -> float:
    """The share of `writes` more writes that went at once to `follower`."""
    return sum(eager_of(c, lead, b"t%d" % k)[0] == follower for k in range(writes)) / writes


@pytest.mark.parametrize("trials", [True, False])
def test_trials_find_a_follower_a_little_faster(trials: bool) -> None:
    # 10 ms slower: too little for the lazy follower's own answers to show it (above), which
    # the trials (300 ms every 2 s) do.
    c = cluster(3, lazy_push_ms=50, eager_timeout_ms=100, eager_trial_ms=300,
                eager_trial_every_ms=2000 if trials else 0)
    lead = settled_leader(c)
    eager, _ = eager_of(c, lead, b"w")
    (other,) = set(c.nodes) - {lead.id, eager}
    c.net.slow[eager] = 10
    share = share_to(c, lead, other, 150)
    # Once a trial found it, the faster follower is eager but for the slower one's trials.
    assert (share >= 0.6) if trials else (share == 0.0), share
    c.check_all()


def test_a_trial_of_a_follower_no_faster_gives_the_place_back() -> None:
    c = cluster(3, lazy_push_ms=50, eager_timeout_ms=100, eager_trial_ms=300, eager_trial_every_ms=2000)
    lead = settled_leader(c)
    eager, _ = eager_of(c, lead, b"w")
    for f in set(c.nodes) - {lead.id}:
        c.net.slow[f] = 10
    assert share_to(c, lead, eager, 150) >= 0.7  # but for the other's trials
    c.check_all()


def test_no_trials_while_nothing_is_written() -> None:
    c = cluster(3, lazy_push_ms=50, eager_timeout_ms=100, eager_trial_ms=100, eager_trial_every_ms=200)
    lead = settled_leader(c)
    eager, _ = eager_of(c, lead, b"w")
    assert lead.core is not None
    c.run_for(300)  # a trial may start within 100 ms of the write's answer, and lasts 100 ms
    choices = set()
    for _ in range(60):  # 3 s: trials would come every 200 ms
        c.run_for(50)
        choices.add(tuple(p for p, d in lead.core._lead.dispatchers.items() if d.eager))
    assert choices == {(eager,)}
    c.check_all()


def test_lazy_push_ms_zero_sends_every_entry_to_every_follower_at_once() -> None:
    c = cluster(3, lazy_push_ms=0)
    lead = settled_leader(c)
    index, t0, mark = write(c, lead, b"w")
    assert appends_of(c, lead, index, mark) == {p: t0 for p in set(c.nodes) - {lead.id}}
    c.check_all()


def test_five_members_push_at_once_to_two_followers() -> None:
    c = cluster(5, lazy_push_ms=10_000)
    lead = settled_leader(c)
    c.run_for(200)  # the lazy followers took their last batch with the first write
    index, t0, mark = write(c, lead, b"w")
    sent = appends_of(c, lead, index, mark)
    assert len(sent) == 2 and set(sent.values()) == {t0}
    c.check_all()


def test_default_config_is_thrifty() -> None:
    assert CoreConfig().lazy_push_ms > 0 and CoreConfig().eager_timeout_ms > 0


def test_the_replicating_floor_is_the_lazy_followers_match_and_leaves_out_a_silent_one() -> None:
    c = cluster(3, lazy_push_ms=10_000)
    lead = settled_leader(c)
    assert lead.core is not None
    index, _, mark = write(c, lead, b"w")
    (eager,) = appends_of(c, lead, index, mark)
    (lazy,) = set(c.nodes) - {lead.id, eager}
    # The lazy follower lacks the write: compaction must keep it.
    assert lead.core.replicating_floor() == lead.core.status().peers[lazy] == index - 1
    c.net.block(lazy, lead.id)  # silent for an election timeout: no longer counted as live
    c.run_for(T + SLACK_MS)
    assert lead.core.replicating_floor() == lead.core.status().peers[eager] >= index
    c.check_all()
