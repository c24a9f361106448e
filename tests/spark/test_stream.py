"""The change feed as a Spark stream (kv/tools/spark/stream.py): every change exactly once, in
revision order, into a checkpointed sink across a leader kill and a restart of the query; a start
from a snapshot with no gap before its changes (and the README's mirror and running count); a start
below compaction failing with the oldest available revision."""
from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.window import Window

from kv import Client
from kv.txn import delete, put
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until
from tests.spark.cluster import InProcessCluster

OPS = 10_000
WRITERS = 4
KEYS_PER_WRITER = 40
Row = tuple[bytes, bytes, int, str]  # key, value, revision, type


def stream(spark: SparkSession, endpoints: str, **options: Any) -> DataFrame:
    reader = spark.readStream.format("raftkv").option("endpoints", endpoints)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def to_parquet(df: DataFrame, where: Path, **trigger: Any) -> StreamingQuery:
    writer = df.writeStream.format("parquet").option("path", str(where / "out")) \
        .option("checkpointLocation", str(where / "checkpoint"))
    return (writer.trigger(**trigger) if trigger else writer).start()


def sink_rows(spark: SparkSession, where: Path) -> list[Row]:
    table = spark.read.parquet(str(where / "out")).toArrow()
    return list(zip(*(table.column(name).to_pylist() for name in ("key", "value", "revision", "type"))))


def history(client: Client, first: int, last: int, prefix: str) -> list[Row]:
    return [(c.key, c.value, c.revision, c.type) for c in client.changes(first, last, prefix=prefix, limit=2000)]


def test_every_change_once_across_a_leader_kill_and_a_restart_from_the_checkpoint(
        spark: SparkSession, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "nodes", 3, (*FAST_TIMING, "--no-fsync")).start()
    try:
        leader = cluster.wait_for_leader()
        endpoints = ",".join(cluster.endpoints)
        client = cluster.client(timeout=30)
        first = client.revision() + 1
        written: list[list[Row]] = [[] for _ in range(WRITERS)]
        failures: list[BaseException] = []

        def writer(number: int) -> None:
            """Puts and deletes of its own keys, each a transaction (it answers its revision)."""
            live: set[bytes] = set()
            with cluster.client(timeout=30) as mine:
                for i in range(OPS // WRITERS):
                    key = b"stream/%d/%03d" % (number, i % KEYS_PER_WRITER)
                    try:
                        if key in live and i % 3 == 2:
                            row = (key, b"", mine.txn(success=[delete(key)]).revision, "delete")
                            live.discard(key)
                        else:
                            value = b"%d-%d" % (number, i)
                            row = (key, value, mine.txn(success=[put(key, value)]).revision, "put")
                            live.add(key)
                    except BaseException as error:  # noqa: BLE001 - reported by the test
                        failures.append(error)
                        return
                    written[number].append(row)

        def progress() -> int:
            return sum(len(rows) for rows in written)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        options = dict(startingRevision=first, prefix="stream/", maxRevisionsPerTrigger=1500)
        query = to_parquet(stream(spark, endpoints, **options), tmp_path)
        wait_until("a third of the writes", lambda: progress() >= OPS // 3 or failures, timeout=120)
        wait_until("the stream's first batch", lambda: query.lastProgress is not None, timeout=120)
        cluster.kill(leader)  # while the stream reads and the writers write
        cluster.wait_for_leader(among=[n for n in cluster.nodes if n != leader], timeout=60)
        wait_until("two thirds of the writes", lambda: progress() >= 2 * OPS // 3 or failures, timeout=180)
        query.stop()  # midway: a batch may be cut short; the restarted query runs it again
        batches_before = len(list((tmp_path / "checkpoint" / "commits").glob("[0-9]*")))
        cluster.start_node(leader)  # back, behind: a page it serves waits until it has the revisions
        query = to_parquet(stream(spark, endpoints, **options), tmp_path)
        for thread in threads:
            thread.join(300)
        assert not failures, failures
        last = client.revision()
        query.processAllAvailable()
        query.stop()
        assert query.exception() is None
        assert batches_before >= 1 and len(list((tmp_path / "checkpoint" / "commits").glob("[0-9]*"))) > batches_before

        rows = sorted(sink_rows(spark, tmp_path), key=lambda row: row[2])
        # The store's own history of the range, paged by another client, is exactly the sink's.
        assert rows == history(client, first, last, "stream/")
        # No duplicate, no gap: only the writers changed the store, one change per revision.
        assert [row[2] for row in rows] == list(range(first, last + 1))
        # Every write is there, in its writer's order per key, at the revision it was answered.
        # A transaction whose answer was lost (its leader killed) is sent again and may apply
        # twice (etcd's at-least-once): a put's earlier application is one extra row with the
        # same value just before it; a delete sent again finds the key gone, changes nothing and
        # answers the store's revision then, at or after its real one.
        per_key: dict[bytes, list[Row]] = defaultdict(list)
        for row in rows:
            per_key[row[0]].append(row)
        ops: dict[bytes, list[Row]] = defaultdict(list)
        for rows_of in written:
            for op in rows_of:
                ops[op[0]].append(op)
        assert set(ops) == set(per_key)
        extra = 0
        for key, mine in ops.items():
            theirs = iter(per_key[key])
            for op in mine:
                row = next(theirs)
                while op[3] == "put" and row[2] < op[2] and row[1] == op[1]:
                    extra, row = extra + 1, next(theirs)
                assert (row[1], row[3]) == (op[1], op[3]) and (row[2] == op[2] or op[3] == "delete" and row[2] < op[2])
            assert next(theirs, None) is None
        assert extra <= 5
    finally:
        cluster.close()


def test_a_snapshot_then_its_changes_keep_a_parquet_mirror_and_a_running_count(
        cluster: InProcessCluster, spark: SparkSession, tmp_path: Path) -> None:
    with Client(cluster.endpoints, timeout=30) as client:
        client.batch({b"snap/a/%03d" % i: b"v0" for i in range(300)} | {b"snap/b/%03d" % i: b"v0" for i in range(100)})
        client.put(b"other", b"not in the prefix")
        changes = stream(spark, cluster.endpoints, prefix="snap/", startingRevision="snapshot", prevValue="true")
        mirror, rows_dir = tmp_path / "mirror", tmp_path / "rows"

        def merge(batch: DataFrame, batch_id: int) -> None:  # the README's mirror
            batch.write.mode("overwrite").parquet(f"{rows_dir}/{batch_id}")  # and the rows, to check them
            last = batch.withColumn("n", F.row_number().over(Window.partitionBy("key").orderBy(F.desc("revision")))) \
                .where("n = 1")
            before = batch.sparkSession.read.parquet(f"{mirror}/{batch_id - 1}") if batch_id \
                else batch.sparkSession.createDataFrame([], "key binary, value binary")
            before.join(last, "key", "left_anti").unionByName(last.where("type = 'put'").select("key", "value")) \
                .write.mode("overwrite").parquet(f"{mirror}/{batch_id}")

        def run(**trigger: Any) -> StreamingQuery:
            writer = changes.writeStream.foreachBatch(merge).option("checkpointLocation", str(tmp_path / "cp"))
            return (writer.trigger(**trigger) if trigger else writer).start()

        query = run(availableNow=True)
        for i in range(0, 300, 7):  # while the snapshot is taken and read
            client.put(b"snap/a/%03d" % i, b"v1")
        query.awaitTermination(120)
        assert query.exception() is None
        for i in range(0, 100, 3):
            client.delete(b"snap/b/%03d" % i)
        client.put(b"snap/c/new", b"v1")
        query = run()  # from the checkpoint
        query.processAllAvailable()
        query.stop()
        newest = max(int(p.name) for p in mirror.iterdir())
        table = spark.read.parquet(f"{mirror}/{newest}").toArrow()
        assert dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist())) == \
            dict(client.scan(prefix=b"snap/", limit=1000))

        # The rows: the keys at a revision R as puts at R, then exactly the store's changes after R.
        table = spark.read.parquet(*(str(p) for p in rows_dir.iterdir())).toArrow()
        rows = list(zip(*(table.column(name).to_pylist() for name in ("key", "value", "revision", "type"))))
        revision = min(row[2] for row in rows)
        snap = {row[0]: row[1] for row in rows if row[2] == revision}
        assert snap == dict(client.scan(prefix=b"snap/", limit=1000, revision=revision)) and len(snap) == 400
        after = sorted((row for row in rows if row[2] > revision), key=lambda row: row[2])
        assert after == history(client, revision + 1, client.revision(), "snap/") and len(after) >= 35

        # The README's running count of live keys by prefix.
        live = F.when(F.col("type") == "delete", -1).when(F.coalesce("version", F.lit(1)) == 1, 1).otherwise(0)
        counts = changes.groupBy(F.substring_index(F.col("key").cast("string"), "/", 2).alias("prefix")).agg(F.sum(live))
        query = counts.writeStream.outputMode("complete").format("memory").queryName("live_keys") \
            .trigger(availableNow=True).start()
        query.awaitTermination(120)
        counted = {r[0]: r[1] for r in spark.sql("SELECT * FROM live_keys").collect()}
        assert counted == {"snap/a": 300, "snap/b": 66, "snap/c": 1}


def test_a_start_below_compaction_fails_naming_the_oldest_revision(
        cluster: InProcessCluster, spark: SparkSession, tmp_path: Path) -> None:
    with Client(cluster.endpoints, timeout=30) as client:
        for i in range(20):
            client.put(b"compact/%d" % (i % 4), b"v%d" % i)
        early = client.revision() - 10
        query = to_parquet(stream(spark, cluster.endpoints, prefix="compact/", startingRevision=early),
                           tmp_path / "q", availableNow=True)
        query.awaitTermination(120)
        assert len(sink_rows(spark, tmp_path / "q")) == 11
        for i in range(20):
            client.put(b"compact/%d" % (i % 4), b"w%d" % i)
        oldest = client.revision() - 5
        client.compact(oldest)

        # A new query from a compacted revision fails at its start, naming the oldest one kept.
        query = to_parquet(stream(spark, cluster.endpoints, prefix="compact/", startingRevision=early),
                           tmp_path / "new", availableNow=True)
        with pytest.raises(PySparkException, match=f"the oldest available revision is {oldest}"):
            query.awaitTermination(120)
        # A query restarted from a checkpoint that compaction overtook fails likewise.
        query = to_parquet(stream(spark, cluster.endpoints, prefix="compact/", startingRevision=early),
                           tmp_path / "q", availableNow=True)
        with pytest.raises(PySparkException, match=f"the oldest available revision is {oldest}"):
            query.awaitTermination(120)
        # earliest starts at the oldest kept revision.
        query = to_parquet(stream(spark, cluster.endpoints, prefix="compact/", startingRevision="earliest"),
                           tmp_path / "earliest", availableNow=True)
        query.awaitTermination(120)
        assert sorted(row[2] for row in sink_rows(spark, tmp_path / "earliest")) == \
            list(range(oldest, client.revision() + 1))


def test_stream_options_are_checked(cluster: InProcessCluster, spark: SparkSession) -> None:
    with pytest.raises(PySparkException, match="startingRevision must be"):
        stream(spark, cluster.endpoints, startingRevision="yesterday").writeStream.format("memory") \
            .queryName("bad").start().awaitTermination(60)
    with pytest.raises(PySparkException, match="for spark.readStream"):
        spark.read.format("raftkv").option("endpoints", cluster.endpoints).option("startingRevision", "latest") \
            .load().collect()
