"""W10 and W11, the data pipeline's figures (issue "Spark"): bulk load of a DataFrame through the
raftkv data source, and a live export to Parquet read back by Spark. They need the `spark` extra
and a Java runtime, so they run only when asked for (`--workloads W10,W11`, raftkv only)."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kv.tools.bench.cpu import CLIENT, CpuRoles, descendants_cpu_s
from kv.tools.bench.systems import Cluster
from kv.tools.bench.workloads import Context, Metric

_session: Any = None


def _spark() -> Any:
    """One local[2] session for the bench process (a JVM start costs seconds)."""
    global _session
    if _session is None:
        from kv.tools.spark.bench import local_session
        _session = local_session()
    return _session


def _client_tls(cluster: Cluster) -> Any:
    """The TLS of a raftkv cluster started by `raftkv bench --tls` (W10 and W11 run on raftkv only)."""
    return getattr(cluster, "client_tls", None)


def _unavailable(workload: str, name: str, error: Exception) -> list[Metric]:
    return [Metric(workload, name, None, workload == "W10",
                   f"needs `pip install raftkv[spark]` and Java 17+: {error}")]


def w10_dataframe_bulk_load(cluster: Cluster, ctx: Context) -> list[Metric]:
    """The DataFrame's rows through df.write.format("raftkv"), then the same number through raftkv
    import's loader with no Spark; each with the CPU it took per row, by process: what the first
    costs beyond the second is Spark's."""
    try:
        from kv.tools.spark.bench import import_bulk_load, w10_bulk_load
        spark = _spark()
    except ImportError as missing:
        return _unavailable("W10", "rows/s", missing)
    endpoints, rows, tls = ",".join(cluster.endpoints), ctx.sizes.bulk_keys, _client_tls(cluster)
    roles = CpuRoles.of(cluster, cluster.wait_healthy(ctx.sizes.healthy_timeout_s))
    figure, cpu = _with_cpu(roles, rows, lambda: w10_bulk_load(spark, endpoints, rows=rows, tls=tls))
    imported, import_cpu = _with_cpu(roles, rows, lambda: import_bulk_load(endpoints, rows, tls))
    return [Metric("W10", "rows/s", figure.rows_per_s, True),
            Metric("W10", "seconds", figure.seconds, False),
            *(Metric("W10", f"{who} CPU us/row", value, False) for who, value in cpu.items()),
            Metric("W10", "import rows/s", imported.rows_per_s, True, "the same rows, raftkv import's loader"),
            *(Metric("W10", f"import {who} CPU us/row", value, False) for who, value in import_cpu.items())]


def _with_cpu(roles: CpuRoles, rows: int, run: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """run()'s result and the CPU microseconds per row it took: the leader's, a follower's (their
    mean), and the client's: this process with its descendants that are not members (Spark's JVM
    and Python workers)."""
    members = roles.probe()

    def client_cpu_s() -> float:
        return time.process_time() + descendants_cpu_s(os.getpid(), exclude=roles.pids.values())

    before, client_before = members(), client_cpu_s()
    result = run()
    after, client_after = members(), client_cpu_s()
    before[CLIENT], after[CLIENT] = client_before, client_after
    return result, {who: ms * 1000 for who, ms in roles.ms_per_op(before, after, rows).items()}


def w11_parquet_export(cluster: Cluster, ctx: Context) -> list[Metric]:
    try:
        from kv.tools.spark.bench import w11_export
        figure = w11_export(_spark(), ",".join(cluster.endpoints), ctx.work_dir / "w11-export",
                            tls=_client_tls(cluster))
    except ImportError as missing:
        return _unavailable("W11", "seconds", missing)
    return [Metric("W11", "seconds", figure.seconds, False, f"{figure.rows:,} rows")]
