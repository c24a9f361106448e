"""What every fault scenario shares: a seed, a proxied cluster, a recorded history, and the
ending - every fault healed, every node up, a final linearizable read of every key joined to the
history (so an acknowledged write that was lost shows up), and the linearizability check."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from kv import Client
from raftkv_proto import kv_pb2
from tests.faults.cluster import FaultCluster
from tests.faults.history import History, Kind, Op, Outcome
from tests.faults.linearizability import CheckResult, check
from tests.faults.workload import (DEFAULT_TIMEOUT_S, EtcdStats, EtcdTarget, PinnedTarget, Target, Worker, Workload, key_names,
                                   perform_all)
from tests.integration.cluster import wait_until

LONG = os.environ.get("RAFTKV_FAULTS_LONG", "") not in ("", "0")
KEYS = 24
CHECK_BUDGET_S = float(os.environ.get("RAFTKV_FAULTS_CHECK_BUDGET_S", "60"))
RECOVERY_S = 60.0
FINAL_READ_TIMEOUT_S = 5.0
HISTORY_FILE = "history.jsonl"
# The clients a scenario's load (and probes, and final reads) use: raftkv's own API through
# kv.Client, or etcd's v3 API (workload.EtcdTarget).
NATIVE = "native"
ETCD = "etcd"
APIS = (NATIVE, ETCD)


def seeds() -> list[int]:
    """RAFTKV_SEED replays one seed; else RAFTKV_FAULTS_SEEDS fresh random seeds (default 1)."""
    if os.environ.get("RAFTKV_SEED"):
        return [int(os.environ["RAFTKV_SEED"])]
    return [random.randrange(1 << 31) for _ in range(int(os.environ.get("RAFTKV_FAULTS_SEEDS", "1")))]


def span(short_s: float, long_s: float) -> float:
    """A phase's duration: the short form in CI, the long one with RAFTKV_FAULTS_LONG=1."""
    return long_s if LONG else short_s


@dataclass
class Scenario:
    name: str
    seed: int
    cluster: FaultCluster
    rng: random.Random
    history: History = field(default_factory=History)
    keys: list[bytes] = field(default_factory=lambda: key_names(KEYS))
    workloads: list[Workload] = field(default_factory=list)
    result: CheckResult | None = None
    api: str = NATIVE
    etcd_stats: EtcdStats = field(default_factory=EtcdStats)  # of every etcd client of the run

    def tag(self) -> str:
        """Names the run in every assertion message, so a failure says how to replay it."""
        return f"[{self.name} seed={self.seed}: rerun with RAFTKV_SEED={self.seed}]"

    def etcd_client(self, order: list[str], timeout_s: float = DEFAULT_TIMEOUT_S, retry: bool = True,
                    serializable: bool = False, stats: EtcdStats | None = None) -> EtcdTarget:
        """An etcd client that starts at order[0] and moves along `order` when a member fails it;
        what it sees counts in `stats` (default: the run's, `etcd_stats`)."""
        return EtcdTarget([(node, self.cluster.etcd_kv_stub(node)) for node in order], timeout_s, retry=retry,
                          serializable=serializable, stats=self.etcd_stats if stats is None else stats)

    # ---- load ---------------------------------------------------------------------------------

    def load(self, clients: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S) -> Workload:
        """Start `clients` workers, each with its own client of every member. Through etcd's API
        (api "etcd") worker i talks to member i mod N first, so that most of them talk to a
        follower, which forwards their writes and reads to the leader."""
        ids = list(self.cluster.nodes)
        workers = []
        for i in range(clients):
            order = ids[i % len(ids):] + ids[:i % len(ids)]  # spread the first attempts
            target: Client | EtcdTarget
            if self.api == ETCD:
                name, target = f"etcd-w{i}", self.etcd_client(order, timeout_s)
            else:
                name, target = f"w{i}", self.cluster.client(order, timeout=timeout_s)
            workers.append(Worker(name, target, self.keys, self.history, random.Random(self.rng.random())))
        return self._started(Workload(workers))

    def probe(self, node_id: str, timeout_s: float = DEFAULT_TIMEOUT_S, consistency: int = kv_pb2.LINEARIZABLE,
              clients: int = 1) -> Workload:
        """Workers pinned to `node_id` (no retries, no leader hints), reading at `consistency`;
        their ops join the history as probe-<id>-<n>. Through etcd's API: an etcd client of
        `node_id` alone that never moves to another member, reading linearizably (etcd's
        serializable reads are not linearizable, and etcd has no lease reads)."""
        def target() -> Target | EtcdTarget:
            if self.api == ETCD:
                assert consistency == kv_pb2.LINEARIZABLE, "etcd's API reads linearizably or serializably"
                return self.etcd_client([node_id], timeout_s, retry=False)
            return PinnedTarget(self.cluster.kv_stub(node_id), timeout_s, consistency)
        workers = [Worker(f"probe-{node_id}-{i}", target(), self.keys, self.history, random.Random(self.rng.random()))
                   for i in range(clients)]
        return self._started(Workload(workers))

    def _started(self, workload: Workload) -> Workload:
        self.workloads.append(workload.start())
        return workload

    def stop_load(self) -> None:
        for workload in self.workloads:
            workload.stop()

    def run_for(self, seconds: float) -> None:
        """Let the load run. Processes give no event to wait for; the time is the point."""
        time.sleep(seconds)

    # ---- queries on the history ---------------------------------------------------------------

    def completed_between(self, start_ns: int, end_ns: int, client_prefix: str = "") -> list[Op]:
        """Ok ops called at or after `start_ns` that returned by `end_ns`."""
        return [op for op in self.history.ops() if op.outcome is Outcome.OK and op.client.startswith(client_prefix)
                and op.call_ns >= start_ns and op.return_ns is not None and op.return_ns <= end_ns]

    def ok_after(self, start_ns: int) -> list[Op]:
        return [op for op in self.history.ops() if op.outcome is Outcome.OK and op.call_ns >= start_ns
                and not op.client.startswith("final")]

    def wait_progress(self, since_ns: int, timeout_s: float = RECOVERY_S) -> None:
        """Wait until some client op called after `since_ns` has completed."""
        wait_until(f"an op called after the last fault to complete {self.tag()}",
                   lambda: self.ok_after(since_ns), timeout_s)

    # ---- the ending ---------------------------------------------------------------------------

    def finish(self) -> CheckResult:
        """Stop the load, heal everything, read every key once more, and check the history."""
        self.stop_load()
        self.cluster.heal_all()
        leader = self.cluster.wait_for_leader(timeout=RECOVERY_S)
        reader: Client | EtcdTarget
        if self.api == ETCD:
            # Through a follower: every final read is forwarded to the leader.
            followers = [n for n in self.cluster.nodes if n != leader]
            reader = self.etcd_client([*followers, leader], FINAL_READ_TIMEOUT_S, stats=EtcdStats())
        else:
            reader = self.cluster.client(timeout=FINAL_READ_TIMEOUT_S)
        for key in self.keys:
            def final_read() -> Op | None:
                op = perform_all(reader, "final", Kind.GET, key)[-1]
                return op if op.outcome is Outcome.OK else None
            self.history.append(wait_until(f"a final read of {key!r} {self.tag()}", final_read, RECOVERY_S))
        self.history.dump(self.cluster.base_dir / HISTORY_FILE)
        self.result = check(self.history.ops(), CHECK_BUDGET_S)
        print(f"{self.tag()} {self.history.summary()}; {self.result.report()}")
        assert self.result.ok, f"{self.tag()} {self.result.report()}"
        if self.api == ETCD:
            print(f"{self.tag()} etcd: {self.etcd_stats.describe()}")
            # Worker i starts at member i mod N and stays while it is answered. Only one member
            # leads at a time, and a raftkv follower answers an etcd write or linearizable Range
            # only by forwarding it: answers from several members mean followers forwarded.
            assert len(self.etcd_stats.answered) >= 2, \
                f"{self.tag()} etcd load answered by one member only: {self.etcd_stats.describe()}"
        return self.result

    def assert_progress(self, minimum: int = 1) -> None:
        ok = self.history.count(Outcome.OK)
        assert ok >= minimum, f"{self.tag()} only {ok} ops completed: {self.history.summary()}"

