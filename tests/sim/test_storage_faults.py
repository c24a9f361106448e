"""Storage faults on the simulator, where the real driver meets them: a crash between a snapshot
install and the log reset behind it, a full disk on a follower and on the leader, a torn write.
And the proof that the simulator checks the driver, not a copy of it: a driver that acknowledges
entries before its write is durable is caught."""
from __future__ import annotations

import pytest

from raft.core import Ready
from raft.node import ready_handler
from tests.sim.cluster import SIM_CONFIG, Cluster
from tests.sim.node import SnapshotPolicy
from tests.sim.schedules import ScheduleFailure, run_schedule

T = SIM_CONFIG.election_timeout_ms


def elected(c: Cluster) -> str:
    assert c.run_until(lambda: c.leader() is not None, 5 * T)
    lead = c.leader()
    assert lead is not None
    return lead.id


def converged(c: Cluster) -> bool:
    lead = c.leader()
    if lead is None or lead.core is None or c.pending():
        return False
    commit = lead.core.commit_index
    return all(n.core is not None and n.applied == commit for n in c.nodes.values())


def write(c: Cluster, count: int, prefix: str = "w") -> None:
    for k in range(count):
        lead = c.leader()
        assert lead is not None
        assert c.propose(lead.id, [f"{prefix}{k}".encode()])
        c.run_for(5)


def test_a_crash_between_snapshot_install_and_log_reset_is_repaired_at_start() -> None:
    c = Cluster(3, seed=11, policy=SnapshotPolicy(every=5, keep=0))
    leader = elected(c)
    follower = next(n for n in c.nodes if n != leader)
    c.crash(follower)
    write(c, 40)  # the leader snapshots and compacts past everything the follower has
    disk = c.nodes[follower].disk
    disk.crash_after_install = True
    c.restart(follower)
    assert c.run_until(lambda: not c.nodes[follower].up, 10 * T), "the follower never installed a snapshot"
    # The state is the snapshot's; the log still holds what it had before.
    assert disk.fsm.applied_index > disk.log.last_index()
    c.restart(follower)  # recovery resets the log to begin after the state
    assert disk.log.before_begin()[0] == disk.fsm.applied_index
    write(c, 5, "after")
    assert c.run_until(lambda: converged(c), 20 * T)
    c.check_all()
    assert c.nodes[follower].state == c.nodes[leader].state


def test_a_follower_out_of_space_refuses_then_catches_up_when_space_returns() -> None:
    c = Cluster(3, seed=12)
    leader = elected(c)
    follower = next(n for n in c.nodes if n != leader)
    c.nodes[follower].disk.full = True
    write(c, 20)  # the other follower and the leader make a majority
    assert c.run_until(lambda: not c.pending(), 5 * T)
    assert all(p.status == "committed" for p in c.clients.proposals), "writes stopped for one full follower"
    raft = c.nodes[follower].raft
    assert raft is not None and raft.disk_space.full is not None and raft.running
    assert c.nodes[follower].applied < c.nodes[leader].applied
    c.nodes[follower].disk.full = False
    assert c.run_until(lambda: converged(c), 20 * T)
    assert c.nodes[follower].raft.disk_space.full is None  # type: ignore[union-attr]
    c.check_all()


def test_a_leader_out_of_space_gives_way_and_nothing_acknowledged_is_lost() -> None:
    c = Cluster(3, seed=13)
    leader = elected(c)
    write(c, 10, "before")
    committed = [p for p in c.clients.proposals if p.status == "committed"]
    c.nodes[leader].disk.full = True
    write_to = c.nodes[leader].raft
    assert write_to is not None
    # Its next write fails: it refuses writes, steps down (its core restarts from the disk), and
    # another member leads.
    c.propose(leader, [b"refused"])
    assert c.run_until(lambda: c.leader() is not None and c.leader().id != leader, 10 * T)  # type: ignore[union-attr]
    assert write_to.disk_space.full is not None and write_to.running
    write(c, 10, "elsewhere")
    c.nodes[leader].disk.full = False
    assert c.run_until(lambda: converged(c), 20 * T)
    c.check_all()
    for p in committed:
        assert any(e.payload == p.payload for e in c.checker.committed.values())


def test_a_leader_whose_state_machine_fills_gives_way_and_applies_when_space_returns() -> None:
    """Its log has room, its state machine none: the leader's writes commit but cannot apply. It
    gives way (another member leads and takes writes); its committed writes wait for their apply,
    until a snapshot from the new leader is installed over them: then they are answered (outcome
    unknown here, as on any loss of leadership), not left waiting for an apply that never comes.
    Once space returns it applies everything."""
    c = Cluster(3, seed=15, policy=SnapshotPolicy(every=5, keep=0))
    leader = elected(c)
    write(c, 5, "before")
    assert c.run_until(lambda: not c.pending(), 5 * T)
    c.nodes[leader].disk.state_full = True
    held = c.propose(leader, [b"held1", b"held2"])
    assert len(held) == 2
    assert c.run_until(lambda: c.leader() is not None and c.leader().id != leader, 10 * T)  # type: ignore[union-attr]
    raft = c.nodes[leader].raft
    assert raft is not None and raft.disk_space.full is not None and raft.running
    write(c, 30, "elsewhere")  # the new leader snapshots and compacts past what the old one holds
    assert c.run_until(lambda: not c.pending(), 10 * T), f"never answered: {c.pending()}"
    assert all(p.status == "committed" for p in c.clients.proposals if p.payload.startswith(b"elsewhere"))
    assert all(p.status == "dropped" for p in held)
    assert any(e.payload == b"held2" for e in c.checker.committed.values())
    c.nodes[leader].disk.state_full = False
    assert c.run_until(lambda: converged(c), 20 * T)
    assert c.nodes[leader].raft.disk_space.full is None  # type: ignore[union-attr]
    c.check_all()


def test_a_torn_write_loses_only_what_was_never_acknowledged() -> None:
    c = Cluster(3, seed=14)
    leader = elected(c)
    write(c, 5, "before")
    c.nodes[leader].disk.crash_in_save = 1
    c.propose(leader, [b"torn-a", b"torn-b", b"torn-c"])
    assert c.run_until(lambda: not c.nodes[leader].up, 5 * T)
    assert [p.status for p in c.clients.proposals if p.payload.startswith(b"torn")] == ["lost"] * 3
    c.restart(leader)
    assert c.run_until(lambda: converged(c), 20 * T)
    c.check_all()


SAFETY = ("[durability]", "[election safety]", "[leader completeness]", "[state machine safety]", "[log matching]")


def test_a_driver_that_answers_before_its_write_is_durable_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver bug: the replies that depend on a Ready's write (acknowledgements, votes) leave
    before the write. A crash in between then forgets a vote or an acknowledged entry, and a
    safety checker must say so."""
    persist = ready_handler.ReadyHandler._persist

    def answer_first(self: ready_handler.ReadyHandler, rd: Ready) -> bool:
        self._node.transport.send(rd.messages)
        rd.messages = []
        return persist(self, rd)

    monkeypatch.setattr(ready_handler.ReadyHandler, "_persist", answer_first)
    seen: list[str] = []
    for seed in range(60):
        try:
            run_schedule(seed)
        except ScheduleFailure as e:
            seen.append(str(e).splitlines()[0])
            if any(k in seen[-1] for k in SAFETY):
                return
    pytest.fail(f"60 schedules of a driver that answers before it writes broke no safety check; seen: {seen[:3]}")


def test_storage_faults_are_drawn_and_disks_fill_up() -> None:
    """The schedules do draw every storage fault, and a full disk does make nodes refuse writes."""
    kinds: dict[str, int] = {}
    refused = 0
    for seed in range(40):
        result = run_schedule(seed)
        for kind, count in result.fault_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
        refused += result.disk_full_steps > 0
    assert {"torn_write", "crash_mid", "power_loss", "disk_full"} <= set(kinds)
    assert refused > 0


def test_a_follower_that_lost_its_disk_is_caught_up_at_once_by_an_idle_leader() -> None:
    """The leader believed the follower held everything; it comes back empty. An idle leader has
    no appends for it to refuse: its heartbeats' answers (the follower's end) must send it back
    to COMPARE at once, and the follower, rejoining, votes for no one until it has caught up."""
    c = Cluster(3, seed=15, policy=SnapshotPolicy(every=10, keep=2))
    leader = elected(c)
    write(c, 25)
    assert c.run_until(lambda: converged(c), 10 * T)
    follower = next(n for n in c.nodes if n != leader)
    lead = c.nodes[leader]
    assert lead.core is not None and lead.core.status().peers[follower] > 20
    c.lose_disk(follower)
    rejoined = c.nodes[follower]
    went_through: list[bool] = []
    c.after_step_hooks.append(lambda _: went_through.append(rejoined.disk.rejoin_floor is not None))
    c.restart(follower)
    # No writes from here on: only heartbeats tell the leader.
    assert c.run_until(lambda: rejoined.applied == lead.applied and not rejoined.disk.replaced
                       and lead.core is not None and lead.core.status().peers[follower] == lead.log.last_index(),
                       3 * SIM_CONFIG.election_timeout_ms)
    assert any(went_through) and rejoined.disk.rejoin_floor is None  # it rejoined (its peers hold data)
    assert rejoined.state == lead.state
    c.check_all()


def test_a_rejoining_node_grants_no_vote_until_it_has_caught_up() -> None:
    c = Cluster(3, seed=16)
    leader = elected(c)
    write(c, 5)
    assert c.run_until(lambda: converged(c), 10 * T)
    follower = next(n for n in c.nodes if n != leader)
    c.lose_disk(follower)
    c.crash(leader)  # no leader to catch up from: the rejoining node must not elect anyone
    c.restart(follower)
    third = next(n for n in c.nodes if n not in (leader, follower))
    c.run_for(10 * T)
    assert c.leader() is None  # the third node alone cannot win, and the rejoining one votes for no one
    assert c.nodes[third].core is not None and c.nodes[third].core.term > 0
    c.restart(leader)
    rejoined = c.nodes[follower].disk
    assert c.run_until(lambda: converged(c) and not rejoined.replaced and rejoined.rejoin_floor is None, 20 * T)
    c.check_all()
