"""One robustness run: three members behind the fault proxies, random traffic and watches on every
member, faults drawn from the seed (or membership changes), then the ending and the checks.

The ending: the traffic stops (every lease it held is abandoned), every fault is healed and every
member runs; the run waits until no key on a lease is left, writes one final transaction (a key
under each watched prefix) at revision F, waits until every watch has seen F, and reads the
history from revision 1 on each member with a watch of its own (the members of the cluster then:
those added during the run included, those removed not). Then the checks (checks_*.py)."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.faults.cluster import FaultCluster
from tests.integration.cluster import NodeProcess, wait_until
from tests.robustness.agreed_history import Findings, History, check_agreement, check_consistency, history_of
from tests.robustness.checks_kv import FINAL_KEYS, check_kv
from tests.robustness.checks_lease import check_leases
from tests.robustness.checks_watch import check_watches
from tests.robustness.endpoints import Endpoints
from tests.robustness.injection import FAULTS, KILL, RECOVERY_S, REPLACE_FOLLOWER, REPLACE_LEADER, WIPE, Injector
from tests.robustness.member_changes import MemberChanges
from tests.robustness.records import Outcome, Records, WatchLog
from tests.robustness.traffic import LEASE_PREFIX, make_traffic
from tests.robustness.watchers import Watch, Watchers, full_history_spec, random_spec

WATCHES_PER_MEMBER = 2
# Writes acknowledged before the watches open, so that "from a past revision" means something.
WRITES_BEFORE_WATCHES = 20
# Traffic between two faults (and before the first, after the last), in seconds.
QUIET_S = (0.3, 1.0)
WATCHES_CATCH_UP_S = 60.0
RECORDS_FILE = "records.jsonl"
MIN_WRITES = 100
MIXED = "mixed"
# A follower replaced and the leader replaced, in the drawn order.
MEMBERS = "members"


def seeds(ci_seeds: list[int]) -> list[int]:
    """RAFTKV_SEED replays one seed; RAFTKV_ROBUSTNESS_SEEDS=K runs K fresh ones; else CI's list."""
    if os.environ.get("RAFTKV_SEED"):
        return [int(os.environ["RAFTKV_SEED"])]
    if os.environ.get("RAFTKV_ROBUSTNESS_SEEDS"):
        return [random.randrange(1 << 31) for _ in range(int(os.environ["RAFTKV_ROBUSTNESS_SEEDS"]))]
    return ci_seeds


def fault_plan(scenario: str, rng: random.Random) -> list[str]:
    """A scenario's faults: its one kind twice, (mixed) three of any kind, or (members) both
    replacements."""
    if scenario == MIXED:
        return [rng.choice(FAULTS) for _ in range(3)]
    if scenario == MEMBERS:
        return rng.sample([REPLACE_FOLLOWER, REPLACE_LEADER], 2)
    assert scenario in FAULTS, scenario
    return [scenario, scenario]


@dataclass
class Run:
    scenario: str
    seed: int
    cluster: FaultCluster
    records: Records = field(default_factory=Records)
    findings: Findings = field(default_factory=Findings)
    final_revision: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.plan = fault_plan(self.scenario, self.rng)
        self.departed: dict[str, NodeProcess] = {}  # the members removed during the run

    def log_tails(self) -> str:
        """The tails of every member's log: those still members and those removed."""
        removed = "".join(f"\n==== {node.id}, removed ({node.log_path})\n{node.log_tail()}"
                          for node in self.departed.values())
        return self.cluster.log_tails() + removed

    def tag(self) -> str:
        return f"[{self.scenario} seed={self.seed} faults={self.plan}: rerun with RAFTKV_SEED={self.seed}]"

    def execute(self) -> Findings:
        cluster = self.cluster
        cluster.wait_for_leader()
        endpoints = Endpoints({n: cluster.etcd_channel(n) for n in cluster.nodes})
        traffic = make_traffic(endpoints, self.records, random.Random(self.rng.random())).start()
        watchers = Watchers(rng=random.Random(self.rng.random()))
        try:
            wait_until("the first writes", lambda: self._highest_revision() >= WRITES_BEFORE_WATCHES, RECOVERY_S)
            for member in endpoints.members():
                self._open_watches(watchers, endpoints, member)
            watchers.start_ticker()
            rng = random.Random(self.rng.random())
            members = MemberChanges(cluster, endpoints, rng, departed=self.departed,
                                    joined=lambda member: self._open_watches(watchers, endpoints, member))
            injector = Injector(cluster, rng, self._acknowledged_since, members)
            for fault in self.plan:
                time.sleep(self.rng.uniform(*QUIET_S))  # traffic between faults: the time is the point
                injector.inject(fault)
            time.sleep(self.rng.uniform(*QUIET_S))
            traffic.stop()
            self._end(watchers, endpoints)
        finally:
            traffic.stop_event.set()
            watchers.close()
        self.records.dump(cluster.base_dir / RECORDS_FILE)
        self._check(watchers)
        print(f"{self.tag()} {self.records.summary()}; final revision {self.final_revision}")
        return self.findings

    def _highest_revision(self) -> int:
        return max((c.revision for c in self.records.kv_calls() if c.outcome is Outcome.OK), default=0)

    def _acknowledged_since(self, since_ns: int) -> bool:
        return any(c.outcome is Outcome.OK and c.writes and c.call_ns >= since_ns for c in self.records.kv_calls())

    def _open_watches(self, watchers: Watchers, endpoints: Endpoints, member: str) -> None:
        """The watches of `member` (at the start, or once it has joined), resumed on the members after it."""
        for j in range(WATCHES_PER_MEMBER):
            spec = random_spec(f"watch-{member}-{j}", self.rng, self._highest_revision())
            watchers.start(Watch(spec, endpoints, member, WatchLog(spec)), self.records)

    def _end(self, watchers: Watchers, endpoints: Endpoints) -> None:
        cluster = self.cluster
        cluster.heal_all()
        leader = cluster.wait_for_leader(timeout=RECOVERY_S)
        kv = etcd_rpc_pb2_grpc.KVStub(endpoints.channel(leader))

        def lease_keys_left() -> bool:
            answer = kv.Range(pb.RangeRequest(key=LEASE_PREFIX, range_end=b"l0", count_only=True), timeout=2.0)
            return answer.count == 0
        wait_until(f"every lease's keys to expire {self.tag()}", lease_keys_left, RECOVERY_S)

        def final_write() -> int:
            puts = [pb.RequestOp(request_put=pb.PutRequest(key=key, value=b"end")) for key in sorted(FINAL_KEYS)]
            return kv.Txn(pb.TxnRequest(success=puts), timeout=2.0).header.revision
        self.final_revision = wait_until(f"the final write {self.tag()}", final_write, RECOVERY_S)
        watchers.finish_at(self.final_revision)
        for member in cluster.nodes:
            spec = full_history_spec(member)
            watch = Watch(spec, endpoints, member, WatchLog(spec), until=self.final_revision, stays=True)
            watchers.start(watch, self.records)
        wait_until(f"every watch to see the final revision {self.final_revision} {self.tag()}",
                   lambda: not watchers.pending(), WATCHES_CATCH_UP_S)

    def _check(self, watchers: Watchers) -> None:
        until, findings = self.final_revision, self.findings
        logs = {w.spec.name: w.log for w in watchers.watches}
        histories = {m: history_of(logs[full_history_spec(m).name]) for m in self.cluster.nodes}
        check_agreement(histories, until, findings)
        history: History = next(iter(histories.values()))
        check_consistency(history, until, findings)
        kv, leases = self.records.kv_calls(), self.records.lease_calls()
        check_kv(kv, history, findings)
        check_watches(list(logs.values()), history, until, findings)
        check_leases(kv, leases, list(logs.values()), history, until, findings)
        self._exercised(history, list(logs.values()))

    def _exercised(self, history: History, logs: list[WatchLog]) -> None:
        """A run that did not do what it is for would pass every check: count that it did."""
        check = "the run exercised writes, revocations and (after a kill or a removal) resumed watches"
        self.findings.ran(check)
        writes = sum(1 for c in self.records.kv_calls() if c.outcome is Outcome.OK and c.writes)
        if writes < MIN_WRITES:
            self.findings.add(check, f"only {writes} writes acknowledged")
        if not any(e.deleted and e.kv.key.startswith(LEASE_PREFIX) for e in history.events):
            self.findings.add(check, "no lease was revoked")
        resumed = sum(len(log.starts) - 1 for log in logs)
        if resumed == 0 and set(self.plan) & {KILL, WIPE, REPLACE_FOLLOWER, REPLACE_LEADER}:
            self.findings.add(check, "no watch was resumed although members were killed or removed")
