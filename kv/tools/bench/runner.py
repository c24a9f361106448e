"""Rounds of the bench: each round starts a fresh cluster of each system in turn (the order
alternates between rounds, so neither always runs on a warmer or colder machine), runs the
selected workloads, and stops the cluster. Every process is stopped on every exit path. raftkv is
driven through the API RunOptions.api names (`--api`): native, or etcd's through EtcdTarget."""
from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kv.tools.bench import stopping
from kv.tools.bench import workloads as w
from kv.tools.bench.etcd import EtcdCluster
from kv.tools.bench.lease_workload import w15_leases
from kv.tools.bench.list_workload import w17_lists
from kv.tools.bench.membership_workload import w16_membership
from kv.tools.bench.processes import Registry
from kv.tools.bench.raftkv_cluster import RaftkvCluster
from kv.tools.bench.report import ETCD, RAFTKV, RoundResult
from kv.tools.bench.settings import NATIVE_ONLY, Sizes
from kv.tools.bench.snapshots import w8_snapshot
from kv.tools.bench.spark_workloads import w10_dataframe_bulk_load, w11_parquet_export
from kv.tools.bench.systems import ETCD_API, NATIVE_API, Cluster
from kv.tools.bench.watch_workload import w14_watchers

# W7 kills and restarts members, so it runs before W6 loads the store whose memory W9 measures;
# W12, W13 and W17 run on the small store of W1..W5, before both. W15 leaves its leases to expire after
# it. W16 adds a fourth member and removes it, and moves the leadership: it runs last, after W15,
# on W6's store when W6 ran (it tops the store up to membership_keys keys otherwise).
ORDER = ("W1", "W2", "W3", "W4", "W5", "W12", "W13", "W17", "W7", "W6", "W8", "W9", "W10", "W11", "W14", "W15", "W16")
READS = {"W3", "W4", "W5", "W12"}

PLANS: dict[str, dict[str, w.Workload]] = {
    RAFTKV: {"W1": w.w1_sequential_puts, "W2": w.w2_concurrent_puts, "W3": w.w3_sequential_gets,
             "W4": w.w4_concurrent_gets, "W5": w.w5_relaxed_gets, "W6": w.w6_bulk_load, "W7": w.w7_failover,
             "W8": w8_snapshot, "W9": w.w9_memory,
             "W10": w10_dataframe_bulk_load, "W11": w11_parquet_export,  # type: ignore[dict-item]
             "W12": w.w12_past_revision_gets, "W13": w.w13_cas_txns, "W14": w14_watchers, "W15": w15_leases,
             "W16": w16_membership, "W17": w17_lists},
    # etcd: W8 and W16 (membership change: raftkv's figures only) are not compared; W5 runs its
    # serializable reads, W6 its Txn, for W9's like-for-like.
    ETCD: {"W1": w.w1_sequential_puts, "W2": w.w2_concurrent_puts, "W3": w.w3_sequential_gets,
           "W4": w.w4_concurrent_gets, "W5": w.w5_relaxed_gets, "W6": w.w6_bulk_load, "W7": w.w7_failover,
           "W9": w.w9_memory, "W12": w.w12_past_revision_gets, "W13": w.w13_cas_txns, "W14": w14_watchers,
           "W15": w15_leases, "W17": w17_lists},
}


def plan(system: str, api: str) -> dict[str, w.Workload]:
    """What `system` runs: under `--api etcd`, raftkv without the native-only workloads (the
    command line refuses them before anything starts)."""
    if system == RAFTKV and api == ETCD_API:
        return {name: run for name, run in PLANS[RAFTKV].items() if name not in NATIVE_ONLY}
    return PLANS[system]


@dataclass(frozen=True, slots=True)
class RunOptions:
    systems: tuple[str, ...]
    workloads: tuple[str, ...]
    rounds: int
    sizes: Sizes
    work_dir: Path
    keep: bool = False
    tls: bool = False  # raftkv with TLS on every port and its clients (`raftkv bench --tls`)
    api: str = NATIVE_API  # what drives raftkv: its native client, or etcd's API through EtcdTarget


def make_cluster(system: str, data_dir: Path, registry: Registry, tls: bool = False,
                 api: str = NATIVE_API) -> Cluster:
    if system == RAFTKV:
        return RaftkvCluster(data_dir, registry, tls=tls, api=api)  # type: ignore[return-value]
    return EtcdCluster(data_dir, registry)  # type: ignore[return-value]


def round_order(systems: Sequence[str], round_index: int) -> list[str]:
    """Alternate: round 0 runs systems in the given order, round 1 reversed, and so on."""
    return list(systems) if round_index % 2 == 0 else list(reversed(systems))


def run_system(system: str, round_index: int, options: RunOptions, registry: Registry,
               log: Callable[[str], None]) -> RoundResult:
    result = RoundResult(round_index + 1, system)
    data_dir = options.work_dir / f"round{round_index + 1}-{system}"
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster = make_cluster(system, data_dir, registry, options.tls, options.api)
    ctx = w.Context(data_dir, options.sizes)
    workloads = plan(system, options.api)
    try:
        cluster.start()
        cluster.wait_healthy(options.sizes.healthy_timeout_s)
        selected = [name for name in ORDER if name in options.workloads and name in workloads]
        if READS & set(selected):
            w.load_read_set(cluster, ctx)
        for name in selected:
            stopping.check()
            began = time.monotonic()
            try:
                metrics = workloads[name](cluster, ctx)
            except w.CheckFailed as failed:  # measured, but its check failed: the figures, then the failure
                result.metrics += failed.metrics
                log(f"round {round_index + 1} {system:6} {name}: {_shown(failed.metrics)}  "
                    f"[{time.monotonic() - began:.1f}s]")
                raise
            result.metrics += metrics
            log(f"round {round_index + 1} {system:6} {name}: {_shown(metrics)}  [{time.monotonic() - began:.1f}s]")
    except Exception as error:  # noqa: BLE001 - recorded; the next system / round still runs
        result.error = f"{type(error).__name__}: {error}"
        log(f"round {round_index + 1} {system}: FAILED: {result.error}")
    finally:
        ctx.close()
        cluster.stop()
        if not options.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    return result


def _shown(metrics: list[w.Metric]) -> str:
    return ", ".join(f"{m.name} {m.value:.4g}" if m.value is not None else f"{m.name} - ({m.note})" for m in metrics)


def run(options: RunOptions, registry: Registry, out: TextIO = sys.stderr) -> list[RoundResult]:
    """All rounds; stops every process it started before returning or raising (Ctrl-C included)."""
    def log(line: str) -> None:
        print(line, file=out, flush=True)

    results: list[RoundResult] = []
    try:
        for round_index in range(options.rounds):
            for system in round_order(options.systems, round_index):
                stopping.check()
                results.append(run_system(system, round_index, options, registry, log))
    finally:
        registry.stop_all()
    return results
