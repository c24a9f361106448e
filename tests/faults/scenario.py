"""What every fault scenario shares: a seed, a proxied cluster, a recorded history, and the
ending - every fault healed, every node up, a final linearizable read of every key joined to the
history (so an acknowledged write that was lost shows up), and the linearizability check."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from raftkv_proto import kv_pb2
from tests.faults.cluster import FaultCluster
from tests.faults.history import History, Kind, Op, Outcome
from tests.faults.linearizability import CheckResult, check
from tests.faults.workload import DEFAULT_TIMEOUT_S, PinnedTarget, Worker, Workload, key_names, perform
from tests.integration.cluster import wait_until

LONG = os.environ.get("RAFTKV_FAULTS_LONG", "") not in ("", "0")
KEYS = 24
CHECK_BUDGET_S = float(os.environ.get("RAFTKV_FAULTS_CHECK_BUDGET_S", "60"))
RECOVERY_S = 60.0
FINAL_READ_TIMEOUT_S = 5.0
HISTORY_FILE = "history.jsonl"


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

    def tag(self) -> str:
        """Names the run in every assertion message, so a failure says how to replay it."""
        return f"[{self.name} seed={self.seed}: rerun with RAFTKV_SEED={self.seed}]"

    # ---- load ---------------------------------------------------------------------------------

    def load(self, clients: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S) -> Workload:
        """Start `clients` workers, each with its own client of every member."""
        ids = list(self.cluster.nodes)
        workers = []
        for i in range(clients):
            order = ids[i % len(ids):] + ids[:i % len(ids)]  # spread the first attempts
            workers.append(Worker(f"w{i}", self.cluster.client(order, timeout=timeout_s), self.keys, self.history,
                                  random.Random(self.rng.random())))
        return self._started(Workload(workers))

    def probe(self, node_id: str, timeout_s: float = DEFAULT_TIMEOUT_S, consistency: int = kv_pb2.LINEARIZABLE,
              clients: int = 1) -> Workload:
        """Workers pinned to `node_id` (no retries, no leader hints), reading at `consistency`;
        their ops join the history as probe-<id>-<n>."""
        workers = [Worker(f"probe-{node_id}-{i}", PinnedTarget(self.cluster.kv_stub(node_id), timeout_s, consistency),
                          self.keys, self.history, random.Random(self.rng.random())) for i in range(clients)]
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
        self.cluster.wait_for_leader(timeout=RECOVERY_S)
        reader = self.cluster.client(timeout=FINAL_READ_TIMEOUT_S)
        for key in self.keys:
            def final_read() -> Op | None:
                op = perform(reader, "final", Kind.GET, key)
                return op if op.outcome is Outcome.OK else None
            self.history.append(wait_until(f"a final read of {key!r} {self.tag()}", final_read, RECOVERY_S))
        self.history.dump(self.cluster.base_dir / HISTORY_FILE)
        self.result = check(self.history.ops(), CHECK_BUDGET_S)
        print(f"{self.tag()} {self.history.summary()}; {self.result.report()}")
        assert self.result.ok, f"{self.tag()} {self.result.report()}"
        return self.result

    def assert_progress(self, minimum: int = 1) -> None:
        ok = self.history.count(Outcome.OK)
        assert ok >= minimum, f"{self.tag()} only {ok} ops completed: {self.history.summary()}"

