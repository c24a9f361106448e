"""The `raftkv` PySpark data source: point-in-time reads by key range, batched writes, task
retries, atomic publish and schema checks."""
from __future__ import annotations

import threading
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import udf
from py4j.protocol import Py4JJavaError

from kv import Client
from kv.tools.spark.bulk_load import BulkLoader
from kv.tools.spark.export_client import STAGING_PREFIX
from tests.spark.cluster import InProcessCluster

READ_KEYS = 20_000
WRITE_ROWS = 100_000


def _scan(cluster: InProcessCluster, prefix: bytes) -> dict[bytes, bytes]:
    with Client(cluster.endpoints, timeout=30) as client:
        return dict(client.scan(prefix=prefix, limit=10_000_000))


def _arrow_pairs(df: DataFrame) -> dict[bytes, bytes]:
    table = df.toArrow()
    return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))


def _rows(prefix: str, n: int, spark: SparkSession, partitions: int = 4) -> DataFrame:
    return spark.range(0, n, 1, partitions).selectExpr(
        f"format_string('{prefix}%06d', id) AS key", "cast(concat('v', id) AS binary) AS value")


def test_read_is_one_point_in_time_across_partitions_while_writes_continue(
        cluster: InProcessCluster, spark: SparkSession) -> None:
    with BulkLoader(cluster.endpoints) as loader:
        loader.load((b"read/%06d" % i, b"v%d" % i) for i in range(READ_KEYS))
    writes: list[tuple[int, bytes]] = []  # new keys, spread over every partition, in write order
    stop = threading.Event()

    def writer() -> None:
        with Client(cluster.endpoints, timeout=10) as client:
            n = 0
            while not stop.is_set():
                key = b"read/%06d-w%d" % (n * 7919 % READ_KEYS, n)
                writes.append((client.put(key, b"w"), key))
                n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(writes) < 20:
            threading.Event().wait(0.01)
        df = (spark.read.format("raftkv").option("endpoints", cluster.endpoints).option("prefix", "read/")
              .option("partitions", 3).load())
        assert df.rdd.getNumPartitions() == 3
        got = _arrow_pairs(df)
    finally:
        stop.set()
        thread.join()
    seen = [key in got for _, key in sorted(writes)]
    visible = sum(seen)
    # A point in time: exactly the first `visible` writes (in log order), whatever their partition.
    assert seen == [True] * visible + [False] * (len(seen) - visible)
    assert 20 <= visible < len(seen)  # writes both before and after the point in time
    assert len(got) == READ_KEYS + visible and got[b"read/000007"] == b"v7"


def test_read_columns_and_string_views(cluster: InProcessCluster, spark: SparkSession) -> None:
    with Client(cluster.endpoints) as client:
        client.batch({b"views/text": b"hello", b"views/\xff\xfe": b"\x80binary"})
    df = spark.read.format("raftkv").option("endpoints", cluster.endpoints).option("prefix", "views/").load()
    assert df.columns == ["key", "value", "key_str", "value_str"]
    rows = df.toArrow().to_pylist()
    assert rows == [
        {"key": b"views/text", "value": b"hello", "key_str": "views/text", "value_str": "hello"},
        {"key": b"views/\xff\xfe", "value": b"\x80binary", "key_str": None, "value_str": None},
    ]


def test_write_100k_rows_every_row_readable(cluster: InProcessCluster, spark: SparkSession) -> None:
    _rows("bulk/", WRITE_ROWS, spark).write.format("raftkv").option("endpoints", cluster.endpoints) \
        .mode("append").save()
    stored = _scan(cluster, b"bulk/")
    assert len(stored) == WRITE_ROWS
    assert all(stored[b"bulk/%06d" % i] == b"v%d" % i for i in range(WRITE_ROWS))


def _rows_failing(prefix: str, n: int, spark: SparkSession, partition: int, always: bool) -> DataFrame:
    """Like _rows, but the task of `partition` fails halfway through its rows (on its first attempt
    only, unless `always`): by then the writer has sent part of them. A plain Python UDF (no pandas)."""
    per_partition = n // 4
    fail_from = partition * per_partition + per_partition // 2

    def pass_or_fail(i: int) -> int:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == partition and i >= fail_from and (always or ctx.attemptNumber() == 0):
            raise RuntimeError("injected task failure after part of its rows")
        return i

    ids = spark.range(0, n, 1, 4).select(udf(pass_or_fail, "long", useArrow=False)("id").alias("id"))
    return ids.selectExpr(f"format_string('{prefix}%06d', id) AS key", "cast(concat('v', id) AS binary) AS value")


def _writer(df: DataFrame, cluster: InProcessCluster, atomic: bool):  # type: ignore[no-untyped-def]
    # Small batches so a failing task has really sent some before it fails.
    return (df.write.format("raftkv").option("endpoints", cluster.endpoints).option("batch_rows", 100)
            .option("atomic", str(atomic).lower()).mode("append"))


def test_retried_task_leaves_exactly_the_expected_rows(cluster: InProcessCluster, spark: SparkSession) -> None:
    _writer(_rows_failing("retry/", 4000, spark, 1, always=False), cluster, atomic=False).save()
    assert _scan(cluster, b"retry/") == {b"retry/%06d" % i: b"v%d" % i for i in range(4000)}


def test_atomic_failed_job_leaves_nothing(cluster: InProcessCluster, spark: SparkSession) -> None:
    with pytest.raises((Py4JJavaError, PySparkException), match="injected task failure"):
        _writer(_rows_failing("atomic-fail/", 4000, spark, 1, always=True), cluster, atomic=True).save()
    assert _scan(cluster, b"atomic-fail/") == {}
    assert _scan(cluster, STAGING_PREFIX) == {}


def test_atomic_job_that_succeeds_shows_every_row(cluster: InProcessCluster, spark: SparkSession) -> None:
    _writer(_rows_failing("atomic-ok/", 4000, spark, 0, always=False), cluster, atomic=True).save()
    assert _scan(cluster, b"atomic-ok/") == {b"atomic-ok/%06d" % i: b"v%d" % i for i in range(4000)}
    assert _scan(cluster, STAGING_PREFIX) == {}


def test_wrong_schema_fails_before_anything_is_written(cluster: InProcessCluster, spark: SparkSession) -> None:
    df = _rows("schema/", 100, spark).selectExpr("key", "value", "1 AS extra")
    with pytest.raises((PySparkException, Py4JJavaError, ValueError), match="exactly the columns key and value"):
        df.write.format("raftkv").option("endpoints", cluster.endpoints).mode("append").save()
    assert _scan(cluster, b"schema/") == {}
