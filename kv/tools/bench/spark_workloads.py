"""W10 and W11, the data pipeline's figures (issue "Spark"): bulk load of a DataFrame through the
raftkv data source, and a live export to Parquet read back by Spark. They need the `spark` extra
and a Java runtime, so they run only when asked for (`--workloads W10,W11`, raftkv only)."""
from __future__ import annotations

from typing import Any

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
    try:
        from kv.tools.spark.bench import w10_bulk_load
        figure = w10_bulk_load(_spark(), ",".join(cluster.endpoints), rows=ctx.sizes.bulk_keys,
                               tls=_client_tls(cluster))
    except ImportError as missing:
        return _unavailable("W10", "rows/s", missing)
    return [Metric("W10", "rows/s", figure.rows_per_s, True),
            Metric("W10", "seconds", figure.seconds, False)]


def w11_parquet_export(cluster: Cluster, ctx: Context) -> list[Metric]:
    try:
        from kv.tools.spark.bench import w11_export
        figure = w11_export(_spark(), ",".join(cluster.endpoints), ctx.work_dir / "w11-export",
                            tls=_client_tls(cluster))
    except ImportError as missing:
        return _unavailable("W11", "seconds", missing)
    return [Metric("W11", "seconds", figure.seconds, False, f"{figure.rows:,} rows")]
