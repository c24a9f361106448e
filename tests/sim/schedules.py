"""Random fault schedules: everything (cluster size, fault rates, snapshot interval, batching) is
drawn from one seed, so `run_schedule(seed)` replays a schedule exactly.

A schedule has a fault phase (clients propose and read while nodes crash and restart, crash inside
a log write or lose power, run out of disk space, and the network drops, duplicates, delays and
partitions) and then a recovery phase (faults stop, every node comes
back): within a bounded virtual time a leader must be elected, every proposal that was not failed
must commit, and every node must apply everything committed.

Clients also change the membership now and then (`MEMBERSHIP_OPS`, at a rate drawn per schedule,
from a generator of its own so the other draws stay as they were): add a learner (a new server,
started with NodeConfig.join, or one added before whose change was lost), promote a learner,
remove a voter or a learner, hand leadership to another voter, set a member's peer address (an
update, to where it listens). What the leader refuses
(MembershipChangeError, NotLeaderError, ValueError) is a normal outcome. A removed node stops
once it learns its removal committed (the cluster takes it down for good); at the end only the
members of the leader's configuration must have caught up."""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from raft.core import CoreConfig, NotLeaderError, Role
from raft.core.membership import ChangeKind, MembershipChangeError
from raft.core.quorum import majority
from raft.node.errors import NodeError
from tests.sim.checkers import SimViolation
from tests.sim.cluster import SIM_CONFIG, Cluster
from tests.sim.disk import POISON
from tests.sim.network import NetConfig
from tests.sim.node import SnapshotPolicy

ACTION_MS = 10  # clients and faults act on this grid
# Clients stop proposing while this many proposals are unanswered (a leader's bounded pending queue),
# so the backlog left when faults stop, and with it the recovery time, is bounded.
# The share of proposals that carry a poison entry (tests/sim/disk.py, POISON).
POISON_RATE = 0.05
MAX_PENDING = 32
# Membership operations a schedule draws from, and the most servers a schedule adds (ids up to n9).
MEMBERSHIP_OPS = ("add_learner", "add_learner", "promote", "promote", "remove", "transfer", "update")
MAX_NODES = 9


@dataclass
class ScheduleParams:
    seed: int
    n: int
    fault_ms: int
    recovery_bound_ms: int
    net: NetConfig
    policy: SnapshotPolicy
    config: CoreConfig
    propose_rate: float  # chance per 10 ms that a client proposes
    read_rate: float
    fault_rate: float  # chance per 10 ms that a new fault starts
    max_down_ms: int
    batch_ends_every: int = 0  # SimDisk.batch_ends_every on every node
    membership_rate: float = 0.0  # chance per 10 ms of a membership operation

    @staticmethod
    def from_seed(seed: int, n: int | None = None) -> "ScheduleParams":
        r = random.Random(f"params/{seed}")
        n = n or (3 if seed % 2 == 0 else 5)
        net = NetConfig(drop_rate=r.choice([0.0, 0.02, 0.1]), dup_rate=r.choice([0.0, 0.05, 0.2]),
                        min_delay_ms=1, max_delay_ms=r.choice([5, 15, 40]),
                        long_delay_rate=r.choice([0.0, 0.02]), long_delay_ms=r.choice([100, 300]))
        config = dataclasses.replace(SIM_CONFIG, max_batch_entries=r.choice([1, 4, 16]),
                                     max_inflight_batches=r.choice([1, 2, 4]))
        t = config.election_timeout_ms
        params = ScheduleParams(
            seed=seed, n=n, fault_ms=r.randint(8, 16) * t, recovery_bound_ms=20 * t, net=net,
            policy=SnapshotPolicy(every=r.choice([None, 5, 10, 25, 50]), keep=r.randint(0, 4)),
            config=config, propose_rate=r.choice([0.1, 0.3, 0.6]), read_rate=r.choice([0.0, 0.05, 0.2]),
            fault_rate=r.choice([0.01, 0.03, 0.06]), max_down_ms=r.choice([2, 5, 10]) * t,
        )
        # Drawn last, so the draws above (and the schedules of seeds pinned before thrifty
        # replication) stay as they were; the trials' settings after thrifty replication's
        # (keyword arguments are evaluated in order).
        params.config = dataclasses.replace(config, lazy_push_ms=r.choice([0, 20, 100, 300]),
                                            eager_timeout_ms=r.choice([10, 30, 100]),
                                            eager_trial_every_ms=r.choice([0, 200, 1000]),
                                            eager_trial_ms=r.choice([30, 100, 300]))
        params.batch_ends_every = r.choice([0, 0, 3, 17])
        # From a generator of its own, so that the draws above stay those of earlier schedules.
        params.membership_rate = random.Random(f"membership-params/{seed}").choice([0.0, 0.01, 0.02, 0.04])
        return params


@dataclass
class ScheduleResult:
    seed: int
    n: int
    virtual_ms: int
    steps: int
    delivered: int
    trace_hash: str
    committed: int
    proposals: dict[str, int] = field(default_factory=dict)
    reads_served: int = 0
    terms: int = 0
    faults: int = 0
    fault_kinds: dict[str, int] = field(default_factory=dict)
    # Node-steps spent refusing writes for a full disk (each node counted once per step).
    disk_full_steps: int = 0
    # Membership operations asked, and taken (the leader appended the change, or the transfer began).
    membership_ops: dict[str, int] = field(default_factory=dict)
    membership_taken: int = 0
    removed: int = 0


class ScheduleFailure(AssertionError):
    def __init__(self, seed: int, n: int, now: int, cause: BaseException) -> None:
        checker = getattr(cause, "checker", type(cause).__name__)
        super().__init__(f"schedule seed={seed} (n={n}) failed at virtual {now} ms [{checker}]: {cause}\n"
                         f"replay: RAFTKV_SEED={seed} python -m pytest tests/sim/test_random_schedules.py -q")


# The faults a schedule draws from (a kind named twice is drawn twice as often).
FAULTS = ("crash", "crash", "crash_mid", "partition", "partition", "one_way", "isolate_leader", "crash_all",
          "freeze_clock", "torn_write", "power_loss", "disk_full", "lose_disk", "rot_snapshot")


class _Driver:
    """Runs one schedule's clients and faults on the 10 ms grid."""

    def __init__(self, p: ScheduleParams) -> None:
        self.p = p
        self.r = random.Random(f"schedule/{p.seed}")
        self.c = Cluster(p.n, seed=p.seed, config=p.config, net=dataclasses.replace(p.net), policy=p.policy)
        for node in self.c.nodes.values():
            node.disk.batch_ends_every = p.batch_ends_every
        self.ids = list(self.c.nodes)
        self.timers: list[tuple[int, str, str]] = []  # (at, action, node) to undo a fault later
        self.faults = 0
        self.fault_kinds: dict[str, int] = {}
        self.disk_full_steps = 0
        self.c.after_step_hooks.append(self._count_disk_full)
        self.next_payload = 0
        self.next_read = 0
        self.mr = random.Random(f"membership/{p.seed}")  # membership operations draw from this only
        self.poison = random.Random(f"poison/{p.seed}")  # which proposals carry a poison entry
        self.membership_ops: dict[str, int] = {}
        self.membership_taken = 0
        self.bound_ms = p.recovery_bound_ms  # set when the faults stop (run)

    def run(self) -> ScheduleResult:
        c, p = self.c, self.p
        t = 0
        while t < p.fault_ms:
            if t > c.now:
                c.run_for(t - c.now)
            self._act(t)
            t += ACTION_MS
        self._stop_faults()
        self.bound_ms = p.recovery_bound_ms + self._shipping_ms()
        deadline = c.now + self.bound_ms
        # Raft's liveness: a leader, and every proposal that was not failed committed...
        if not c.run_until(self._live, self.bound_ms):
            raise SimViolation("liveness", self._why_not("a leader and every proposal resolved"))
        # ...and then every node catches up: applies all that is committed, holds the same log.
        if not c.run_until(self._converged, max(0, deadline - c.now)):
            raise SimViolation("catch-up", self._why_not("every node applying everything committed"))
        c.check_all()
        self._check_states_equal()
        self._check_removed_stopped()
        counts: dict[str, int] = {}
        for pr in c.clients.proposals:
            counts[pr.status] = counts.get(pr.status, 0) + 1
        counts["not_leader"] = c.clients.not_leader
        return ScheduleResult(p.seed, p.n, c.now, c.steps, c.net.delivered_count, c.net.trace_hash(),
                              len(c.checker.committed), counts, c.checker.reads_served, len(c.checker.leaders),
                              self.faults, self.fault_kinds, self.disk_full_steps, self.membership_ops,
                              self.membership_taken, len(c.removed))

    # --- fault phase ---

    def _act(self, t: int) -> None:
        c, r, p = self.c, self.r, self.p
        for at, action, nid in [x for x in self.timers if x[0] <= t]:
            self.timers.remove((at, action, nid))
            self._undo(action, nid)
        if r.random() < p.propose_rate and len(c.pending()) < MAX_PENDING:
            leaders = c.leaders()
            target = r.choice(leaders).id if leaders else r.choice(self.ids)
            payloads = []
            for _ in range(r.randint(1, 3)):
                self.next_payload += 1
                payloads.append(f"s{p.seed}-c{self.next_payload}".encode())
            if self.poison.random() < POISON_RATE:  # one the state machine cannot apply, among them
                payloads.insert(self.poison.randrange(len(payloads) + 1), POISON + f"-s{p.seed}".encode())
            c.propose(target, payloads)
        if r.random() < p.read_rate:
            leaders = c.leaders()
            if leaders:
                self.next_read += 1
                c.read(r.choice(leaders).id, f"r{self.next_read}")
        if r.random() < p.fault_rate:
            self._fault(t)
        if p.membership_rate and self.mr.random() < p.membership_rate:
            self._membership_op()

    # --- membership ---

    def _membership_op(self) -> None:
        """One membership operation on whichever node believes it leads (else any node); a
        refusal is a normal outcome."""
        c, mr = self.c, self.mr
        kind = mr.choice(MEMBERSHIP_OPS)
        self.membership_ops[kind] = self.membership_ops.get(kind, 0) + 1
        leaders = c.leaders()
        via = mr.choice(leaders).id if leaders else mr.choice(self.ids)
        core = c.nodes[via].core
        if core is None:
            return
        config = core.membership
        try:
            if kind == "add_learner":
                # A server added before whose change was lost is added again; else a new one.
                lost = [nid for nid in self.ids if nid not in config and c.nodes[nid].config.join
                        and nid not in c.removed]
                if lost:
                    member = mr.choice(lost)
                elif len(c.nodes) < MAX_NODES:
                    member = f"n{len(c.nodes) + 1}"
                else:
                    return
                c.change_membership(via, ChangeKind.ADD_LEARNER, member)
                if member not in c.nodes:
                    # Started once its change is in the leader's log, as an operator does
                    # (raftkv member add, then raftkv serve --join).
                    c.add_node(member)
                    self.ids.append(member)
            elif kind == "promote":
                if not config.learners:
                    return
                c.change_membership(via, ChangeKind.PROMOTE, mr.choice(sorted(config.learners)))
            elif kind == "remove":
                members = list(config.members)
                if not members or not self._room_to_remove():
                    return
                c.change_membership(via, ChangeKind.REMOVE, mr.choice(members))
            elif kind == "update":
                # A member's address set again where it listens: an UPDATE entry under the faults
                # (moving it is test_membership.py's; here it must stay reachable).
                members = [m for m in config.members if m in c.nodes]
                if not members:
                    return
                member = mr.choice(members)
                c.change_membership(via, ChangeKind.UPDATE, member, c.nodes[member].config.peer_listen_address)
            elif kind == "transfer":
                targets = [v for v in sorted(config.voters) if v != via]
                if not targets:
                    return
                c.transfer(via, mr.choice(targets))
        except (MembershipChangeError, NotLeaderError, ValueError, NodeError):
            return
        self.membership_taken += 1

    def _check_removed_stopped(self) -> None:
        """A node that a committed configuration removed, and that heard of it, is down for good;
        the leader's configuration names none of them."""
        members = self.c.members()
        assert members is not None
        for nid in self.c.removed:
            if nid in members:
                raise SimViolation("membership", f"{nid} stopped as removed, but the configuration names it: "
                                   f"{sorted(members.voters)} {sorted(members.learners)}")
            if self.c.nodes[nid].up:
                raise SimViolation("membership", f"{nid} was removed but runs")

    def _room_to_remove(self) -> bool:
        """Whether a node may still go for good: a node that restarts empty (lose_disk) waits for
        answers from enough of the peers it was configured with (raft/node/joining.py counts
        those, not the configuration, which it cannot know), and a removed node never answers
        again. So enough nodes must stay, beside one that lost its disk, for the most demanding."""
        c = self.c
        need = max(len(n.config.members) - majority(len(n.config.members)) + 1 for n in c.nodes.values())
        staying = sum(1 for nid in c.nodes if nid not in c.removed) - 1
        return staying - 1 >= need

    def _live_ids(self) -> list[str]:
        return [nid for nid in self.ids if nid not in self.c.removed]

    def _fault(self, t: int) -> None:
        c, r, p = self.c, self.r, self.p
        self.faults += 1
        kind = r.choice(FAULTS)
        until = t + r.randint(1, max(1, p.max_down_ms // ACTION_MS)) * ACTION_MS
        victim = r.choice(self._live_ids())
        self.fault_kinds[kind] = self.fault_kinds.get(kind, 0) + 1
        if kind == "crash":
            c.crash(victim)
            self.timers.append((until, "restart", victim))
        elif kind == "crash_mid":
            # Crash inside its next log write: after the leader's messages left, before the write.
            c.nodes[victim].disk.crash_in_save = 0
            self.timers.append((until, "restart", victim))
        elif kind == "torn_write":
            # Crash inside its next log write, after part of it reached the disk (never acknowledged).
            c.nodes[victim].disk.crash_in_save = r.randint(1, 3)
            self.timers.append((until, "restart", victim))
        elif kind == "power_loss":
            # The machine loses power: the state machine keeps only what it last synced.
            c.crash(victim, power_loss=True)
            self.timers.append((until, "restart", victim))
        elif kind == "lose_disk":
            # The disk is gone: the node comes back empty, rejoining (it votes again once caught
            # up). Only if the other disks still hold what the cluster must not forget: losing a
            # majority of the copies of a log is no fault Raft recovers from (an operator restores
            # a backup); otherwise the node only crashes.
            if self._survivable_loss(victim):
                c.lose_disk(victim)
            else:
                c.crash(victim)
            self.timers.append((until, "restart", victim))
        elif kind == "rot_snapshot":
            # A byte of its newest snapshot file changes on the disk (it may have to send it).
            c.nodes[victim].disk.snapshots.rot_newest()
        elif kind == "disk_full":
            # ENOSPC: log writes and applies fail until space returns; reads go on. Half the time
            # the free-space check before a write misses it (the space went after the check).
            c.nodes[victim].disk.full = True
            c.nodes[victim].disk.full_unseen = self.r.random() < 0.5
            self.timers.append((until, "space", victim))
        elif kind == "crash_all":
            for nid in self._live_ids():
                c.crash(nid)
            for nid in self._live_ids():
                self.timers.append((t + r.randint(1, 20) * ACTION_MS, "restart", nid))
        elif kind == "partition":
            shuffled = self.ids[:]
            r.shuffle(shuffled)
            cut = r.randint(1, len(shuffled) - 1)
            c.net.partition(shuffled[:cut], shuffled[cut:])
            self.timers.append((until, "heal", ""))
        elif kind == "one_way":
            for _ in range(r.randint(1, len(self.ids))):
                a, b = r.sample(self.ids, 2)
                c.net.block(a, b)
            self.timers.append((until, "heal", ""))
        elif kind == "freeze_clock":
            # Its clock stops (it still answers messages): timers, check-quorum and leases stall.
            c.pause(victim)
            self.timers.append((until, "resume", victim))
        elif kind == "isolate_leader":
            lead = c.leader()
            target = lead.id if lead else victim
            c.net.partition([target], [x for x in self.ids if x != target])
            self.timers.append((until, "heal", ""))

    def _undo(self, action: str, nid: str) -> None:
        if action == "restart":
            self.c.nodes[nid].disk.crash_in_save = None
            self.c.restart(nid)
        elif action == "space":
            self.c.nodes[nid].disk.full = False
        elif action == "heal":
            self.c.net.heal()
        elif action == "resume":
            self.c.resume(nid)

    def _stop_faults(self) -> None:
        c = self.c
        c.net.heal()
        c.net.config = NetConfig(min_delay_ms=c.net.config.min_delay_ms, max_delay_ms=c.net.config.max_delay_ms)
        self.timers.clear()
        for nid in self._live_ids():
            c.nodes[nid].disk.crash_in_save = None
            c.nodes[nid].disk.full = False
            c.restart(nid)
            c.resume(nid)

    def _survivable_loss(self, victim: str) -> bool:
        """Whether the other disks still hold, each on a majority of the voters of every
        configuration that may be in force (SafetyChecker.voter_sets), everything committed and
        the newest term a leader was elected in (so the cluster cannot elect a second leader in it)."""
        nodes = list(self.c.nodes.values())
        # Restarted empty, it waits for answers from enough of the peers it was configured with
        # (raft/node/joining.py counts them, not the configuration it cannot know): removed
        # members never answer again, so with too few left it would wait forever.
        peers = self.c.nodes[victim].config.members
        if sum(1 for nid in self.c.nodes if nid != victim and nid not in self.c.removed) < \
                len(peers) - majority(len(peers)) + 1:
            return False
        led = max(self.c.checker.leaders, default=0)
        for voters in self.c.checker.voter_sets(nodes):
            others = [self.c.nodes[v] for v in sorted(voters) if v != victim and v in self.c.nodes]
            quorum = majority(len(voters))
            if sum(1 for n in others if n.log.hard_state().term >= led) < quorum:
                return False
            for index, entry in self.c.checker.committed.items():
                holders = sum(1 for n in others if (n.snapshot is not None and n.snapshot.meta.index >= index)
                              or n.log.term(index) == entry.term)
                if holders < quorum:
                    return False
        return True

    def _count_disk_full(self, c: Cluster) -> None:
        self.disk_full_steps += sum(1 for n in c.up_nodes if n.raft is not None and n.raft.disk_space.full is not None)

    # --- recovery phase ---

    def _shipping_ms(self) -> int:
        """The longest time, once the faults stop, to ship the longest log to a follower that has
        none of it at the configured rate: no loss then, so each round trip (at most twice the
        largest delay) carries max_inflight_batches batches of max_batch_entries. Elections and
        the rest fit in recovery_bound_ms; this keeps a schedule that made a long log from
        failing for the time its configuration needs to copy it (one entry a round trip at 40 ms
        delays takes longer to copy 120 entries than 20 election timeouts)."""
        longest = max(n.log.last_index() for n in self.c.nodes.values())
        per_trip = self.p.config.max_batch_entries * self.p.config.max_inflight_batches
        # A lazy follower's last batch that is not full waits up to lazy_push_ms (eager_set.py).
        return -(-longest // per_trip) * 2 * self.p.net.max_delay_ms + self.p.config.lazy_push_ms

    def _live(self) -> bool:
        return self.c.leader() is not None and not self.c.pending()

    def _converged(self) -> bool:
        """Every member of the leader's configuration (committed: its log ends at its commit
        index) applies everything committed; a node the configuration does not name (removed
        and never told, or added by a change that was lost) is no longer the cluster's."""
        c = self.c
        lead = c.leader()
        if lead is None or lead.core is None or c.pending():
            return False
        commit = lead.core.commit_index
        if commit < lead.log.last_index():
            return False
        members = lead.core.membership
        return all(n.core is not None and n.applied == commit and n.log.last_index() == commit
                   and n.core.role in (Role.LEADER, Role.FOLLOWER) for n in c.nodes.values() if n.id in members)

    def _why_not(self, goal: str) -> str:
        c = self.c
        lines = [f"not {goal} within {self.bound_ms} ms after faults stopped at {self.p.fault_ms} ms"]
        for n in c.nodes.values():
            core = n.core
            config = (f" voters={','.join(sorted(core.membership.voters))} "
                      f"learners={','.join(sorted(core.membership.learners))}" if core else "")
            lines.append(f"  {n.id}: role={core.role.value if core else 'down'} term={core.term if core else '-'} "
                         f"commit={core.commit_index if core else '-'} applied={n.applied} "
                         f"log=({n.log.before_begin()[0]}, {n.log.last_index()}]{config}"
                         f"{' removed' if n.id in c.removed else ''}")
        pend = c.pending()
        if pend:
            lines.append(f"  {len(pend)} proposals neither committed nor failed, e.g. {pend[0]}")
        return "\n".join(lines)

    def _check_states_equal(self) -> None:
        members = self.c.members()
        states = {n.id: n.state for n in self.c.nodes.values() if members is None or n.id in members}
        first = next(iter(states.values()))
        for nid, s in states.items():
            if s != first:
                raise SimViolation("state machine safety", f"final state of {nid} differs: {s} vs {first}")


def run_schedule(seed: int, n: int | None = None) -> ScheduleResult:
    """Run one random schedule; raise ScheduleFailure (naming the seed and the checker) on a violation."""
    p = ScheduleParams.from_seed(seed, n)
    d = _Driver(p)
    try:
        return d.run()
    except Exception as e:  # any exception of the driver or the core is a failure of this seed too
        raise ScheduleFailure(seed, p.n, d.c.now, e) from e
    finally:
        d.c.close()
