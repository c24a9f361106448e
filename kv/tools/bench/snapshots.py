"""W8: an operator's snapshot save and restore, timed, through the same calls `raftkv snapshot
save` / `restore` make (Client.save_snapshot streams the leader's snapshot into a file and verifies
it; Client.restore_snapshot seeds a new member's data directory from it). raftkv only."""
from __future__ import annotations

import time

from kv.tools.bench import stopping
from kv.tools.bench.raftkv_cluster import RaftkvCluster
from kv.tools.bench.workloads import MB, Context, Metric
from kv.client.client import Client
from kv.errors import RaftKVError

SAVE_TIMEOUT_S = 600.0


def _check_stop(received: int, total: int) -> None:
    stopping.check()  # called between chunks: a safe point


def w8_snapshot(cluster: RaftkvCluster, ctx: Context) -> list[Metric]:
    cluster.wait_healthy(ctx.sizes.healthy_timeout_s)
    path = ctx.work_dir / "w8.snapshot"
    with Client(cluster.endpoints, timeout=ctx.sizes.request_timeout_s, tls=cluster.client_tls) as client:
        began = time.perf_counter()
        try:
            client.save_snapshot(path, timeout=SAVE_TIMEOUT_S, progress=_check_stop)
        except RaftKVError as error:
            return [Metric("W8", "save s", None, False, f"save failed: {error}")]
        saved = time.perf_counter() - began
    metrics = [Metric("W8", "save s", saved, False), Metric("W8", "MB", path.stat().st_size / MB, False)]
    began = time.perf_counter()
    Client.restore_snapshot(path, ctx.work_dir / "w8-restored")
    metrics.append(Metric("W8", "restore s", time.perf_counter() - began, False))
    return metrics
