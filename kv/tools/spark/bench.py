"""Figures W10 and W11 of `raftkv bench` (benchmarks, not tests):

- W10: bulk load of N rows (default 1,000,000; 100-byte values) from a DataFrame into the cluster
  through the `raftkv` data source. Goal: >= 50,000 rows/s on the reference machine.
- W11: live point-in-time export of those rows to Parquet (pyarrow) and read back by Spark
  (count). Goal: under 10 s end to end.

    python -m kv.tools.spark.bench --rows 1000000      # starts a local three-node cluster (processes)
    w10_bulk_load(spark, endpoints, rows); w11_export(spark, endpoints, out_dir)   # from kv.tools.bench

And the change feed (`--stream`; kv/tools/spark/stream.py), not a W figure:

- stream catch-up: N single-put revisions written first, then read by a stream query (Trigger.
  AvailableNow) into a Parquet sink: changes per second from the cluster into the sink.
- stream delay: puts at a steady rate while a query (back-to-back micro-batches) writes them to
  Parquet through foreachBatch; the delay from each put (its value is the time it was sent) to the
  end of the batch that wrote its row: p50 and p99.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
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


STREAM_PREFIX = "feed/"


def _put_many(endpoints: str, count: int, threads: int = 8, tls: TLS | None = None) -> None:
    """`count` single-put revisions under STREAM_PREFIX, from `threads` threads."""
    value = b"x" * VALUE_BYTES

    def run(number: int) -> None:
        with Client(endpoints, timeout=30, tls=tls) as client:
            for i in range(number, count, threads):
                client.put(f"{STREAM_PREFIX}{i % 10_000:05d}", value)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def stream_catch_up(spark: Any, endpoints: str, out_dir: Path, changes: int = 100_000,
                    max_revisions: int = 0, tls: TLS | None = None) -> Figure:
    """Changes per second from the cluster into a Parquet sink, for a stream that starts behind."""
    with Client(endpoints, timeout=30, tls=tls) as client:
        first = client.revision() + 1
    _put_many(endpoints, changes, tls=tls)
    reader = (spark.readStream.format("raftkv").option("endpoints", endpoints).options(**tls_options(tls))
              .option("prefix", STREAM_PREFIX).option("startingRevision", first))
    if max_revisions:
        reader = reader.option("maxRevisionsPerTrigger", max_revisions)
    started = time.perf_counter()
    query = (reader.load().writeStream.format("parquet").option("path", str(out_dir / "out"))
             .option("checkpointLocation", str(out_dir / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    counted = spark.read.parquet(str(out_dir / "out")).count()
    if counted != changes:
        raise AssertionError(f"the sink has {counted} rows, {changes} changes were written")
    batches = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
    print(json.dumps(Figure("stream catch-up, its micro-batches alone (no query start)", counted, batches,
                            "").to_dict()), flush=True)
    return Figure("stream catch-up into Parquet, query start included", counted, elapsed, "")


@dataclass(frozen=True, slots=True)
class Delay:
    name: str
    rows: int
    rate: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stream_delay(spark: Any, endpoints: str, out_dir: Path, seconds: float = 30.0, rate: float = 200.0,
                 tls: TLS | None = None) -> Delay:
    """The delay from a put to its row in the sink, at `rate` puts per second."""
    delays: list[float] = []
    seen = threading.Event()

    def sink(batch: Any, batch_id: int) -> None:
        batch.persist()  # read from the cluster once: by the write, then by the collect
        batch.write.mode("overwrite").parquet(f"{out_dir}/sink/{batch_id}")
        done = time.time()
        sent = [float(row[0]) for row in batch.select("value").collect()]
        batch.unpersist()
        delays.extend(done - at for at in sent)
        seen.set()

    query = (spark.readStream.format("raftkv").option("endpoints", endpoints).options(**tls_options(tls))
             .option("prefix", "delay/").option("startingRevision", "latest").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(out_dir / "delay-checkpoint")).start())
    try:
        with Client(endpoints, timeout=30, tls=tls) as client:
            warm_up = time.monotonic() + 120  # the query's first batches, before the clock
            while not seen.is_set() and time.monotonic() < warm_up:
                client.put("delay/warm-up", str(time.time()))
                seen.wait(2)
            delays.clear()
            started = time.monotonic()
            n = 0
            while time.monotonic() - started < seconds:
                client.put(f"delay/{n % 1000:04d}", str(time.time()))
                n += 1
                pause = n / rate - (time.monotonic() - started)
                if pause > 0:
                    time.sleep(pause)
        deadline = time.monotonic() + 120
        while len(delays) < n and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
    if len(delays) < n:
        raise AssertionError(f"{n} puts, {len(delays)} rows in the sink")
    ranked = sorted(delays)
    return Delay("stream delay, put to its row in Parquet (foreachBatch)", n, round(n / seconds, 1),
                 round(statistics.median(ranked) * 1000, 1), round(ranked[int(len(ranked) * 0.99) - 1] * 1000, 1),
                 round(ranked[-1] * 1000, 1))


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
    parser.add_argument("--stream", action="store_true", help="measure the change feed instead of W10, W11")
    parser.add_argument("--changes", type=int, default=100_000, help="--stream: single-put revisions to catch up on")
    parser.add_argument("--rate", type=float, default=200.0, help="--stream: puts per second for the delay")
    parser.add_argument("--seconds", type=float, default=30.0, help="--stream: how long the delay is measured")
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
        runs = (lambda: w10_bulk_load(spark, endpoints, args.rows, args.partitions),
                lambda: w11_export(spark, endpoints, work / "export", args.partitions))
        if args.stream:
            runs = (lambda: stream_catch_up(spark, endpoints, work / "catch-up", args.changes),
                    lambda: stream_delay(spark, endpoints, work, args.seconds, args.rate))
        for run in runs:
            print(json.dumps(run().to_dict()), flush=True)
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
