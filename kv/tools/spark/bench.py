"""Figures W10 and W11 of `raftkv bench` (benchmarks, not tests):

- W10: bulk load of N rows (default 1,000,000; 100-byte values) from a DataFrame into the cluster
  through the `raftkv` data source. Goal: >= 50,000 rows/s on the reference machine.
- W11: live point-in-time export of those rows to Parquet (pyarrow) and read back by Spark
  (count). Goal: under 10 s end to end.

    python -m kv.tools.spark.bench --rows 1000000      # starts a local three-node cluster (processes)
    w10_bulk_load(spark, endpoints, rows); w11_export(spark, endpoints, out_dir)   # from kv.tools.bench
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kv.client.client import Client
from kv.client.tls import TLS
from kv.tools.cluster_up import LocalCluster, local_specs
from kv.tools.spark.parquet_export import export_live

PREFIX = "w10/"
IMPORT_PREFIX = "w10-import/"
VALUE_BYTES = 100


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    rows: int
    seconds: float
    goal: str

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows_per_s": round(self.rows_per_s)}


def tls_options(tls: TLS | None) -> dict[str, str]:
    """The data source's options cacert, cert and key for `tls` (none for plaintext)."""
    if tls is None:
        return {}
    files = {"cacert": tls.ca_file, "cert": tls.cert_file, "key": tls.key_file}
    return {name: str(path) for name, path in files.items() if path is not None}


def w10_bulk_load(spark: Any, endpoints: str, rows: int = 1_000_000, partitions: int = 4,
                  tls: TLS | None = None) -> Figure:
    df = spark.range(0, rows, 1, partitions).selectExpr(
        f"format_string('{PREFIX}%08d', id) AS key", f"cast(repeat('x', {VALUE_BYTES}) AS binary) AS value")
    started = time.perf_counter()
    df.write.format("raftkv").option("endpoints", endpoints).options(**tls_options(tls)).mode("append").save()
    return Figure("W10 bulk load from a DataFrame", rows, time.perf_counter() - started, ">= 50,000 rows/s")


def import_bulk_load(endpoints: str, rows: int = 1_000_000, tls: TLS | None = None) -> Figure:
    """W10's rows (under another prefix) through raftkv import's loader, from this process, with
    no Spark: what W10 costs beyond this is Spark's."""
    from kv.tools.spark.bulk_load import BulkLoader

    value = b"x" * VALUE_BYTES
    pairs = [(f"{IMPORT_PREFIX}{i:08d}".encode(), value) for i in range(rows)]  # made before the clock runs
    started = time.perf_counter()
    with BulkLoader(endpoints, tls=tls) as loader:
        loader.load(pairs)
    return Figure("W10's rows through raftkv import's loader", rows, time.perf_counter() - started, "")


def w11_export(spark: Any, endpoints: str, out_dir: Path, partitions: int = 4, tls: TLS | None = None) -> Figure:
    started = time.perf_counter()
    manifest = export_live(endpoints, out_dir, partitions=partitions, prefix=PREFIX.encode(), tls=tls)
    counted = spark.read.parquet(str(out_dir)).count()
    elapsed = time.perf_counter() - started
    if counted != manifest.rows:
        raise AssertionError(f"Spark read {counted} rows, the export wrote {manifest.rows}")
    return Figure("W11 export to Parquet + Spark read", counted, elapsed, "< 10 s")


def local_session() -> Any:
    """A local[2] SparkSession (no UI) with the raftkv data source registered."""
    from pyspark.sql import SparkSession

    import kv.tools.spark

    # The workers run this interpreter, so they import raftkv even from a virtualenv that is not
    # activated (Spark would otherwise start the python3 on PATH).
    spark = (SparkSession.builder.master("local[2]").appName("raftkv-bench")
             .config("spark.ui.enabled", "false").config("spark.pyspark.python", sys.executable).getOrCreate())
    kv.tools.spark.register(spark)
    return spark


def _wait_for_leader(endpoints: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    with Client(endpoints, timeout=2) as client:
        while time.monotonic() < deadline:
            if any(s.get("role") == "leader" for s in client.status()):
                return
            time.sleep(0.1)
    raise RuntimeError(f"no leader among {endpoints} after {timeout_s}s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kv.tools.spark.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--base-port", type=int, default=7601)
    parser.add_argument("--endpoints", default=None, help="use a running cluster instead of starting one")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="raftkv-spark-bench-"))
    cluster = None
    try:
        endpoints = args.endpoints
        if endpoints is None:
            cluster = LocalCluster(local_specs(3, args.base_port, work / "data"), work / "logs")
            cluster.start()
            endpoints = ",".join(spec.listen for spec in cluster.specs)
        _wait_for_leader(endpoints)
        spark = local_session()
        spark.sparkContext.setLogLevel("ERROR")
        spark.range(10).count()  # start the JVM's executors before the clock runs
        for run in (lambda: w10_bulk_load(spark, endpoints, args.rows, args.partitions),
                    lambda: w11_export(spark, endpoints, work / "export", args.partitions)):
            print(json.dumps(run().to_dict()), flush=True)
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
