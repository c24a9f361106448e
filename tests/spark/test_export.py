"""Consistent export: live (point in time while writes continue) and from a snapshot file."""
from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from kv import Client
from kv.server.export_service import ExportHandler
from kv.tools.spark import schema
from kv.tools.spark.bulk_load import BulkLoader
from kv.tools.spark.export_client import ExportClient
from kv.tools.spark.parquet_export import ExportManifest, export_live, export_snapshot
from snapshot.store import SnapshotStore
from tests.spark.cluster import InProcessCluster

KEYS = 100_000


def _checksum(rows: list[tuple[bytes, bytes]]) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(rows):
        digest.update(len(key).to_bytes(2, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()


def _parquet_rows(directory: Path) -> list[tuple[bytes, bytes]]:
    table = pq.read_table(directory, columns=["key", "value"])
    return list(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))


@pytest.fixture(scope="module")
def loaded(cluster: InProcessCluster) -> dict[bytes, bytes]:
    rows = {b"user/%06d" % i: b"v0-%d" % i for i in range(KEYS)}
    with BulkLoader(cluster.endpoints) as loader:
        assert loader.load(rows.items()) == KEYS
    return rows


def test_live_export_is_exactly_the_state_at_its_index_while_writes_continue(
        cluster: InProcessCluster, loaded: dict[bytes, bytes], tmp_path: Path, spark: SparkSession) -> None:
    writes: list[tuple[int, bytes, bytes]] = []  # (index, key, value) of every acknowledged write
    stop = threading.Event()

    def writer() -> None:
        with Client(cluster.endpoints, timeout=10) as client:
            n = 0
            while not stop.is_set():
                key, value = b"user/%06d" % (n * 7919 % (KEYS + 500)), b"v1-%d" % n
                writes.append((client.put(key, value), key, value))
                n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(writes) < 50:  # the export starts while writes are in full flow
            threading.Event().wait(0.01)
        manifest = export_live(cluster.endpoints, tmp_path / "live", partitions=4)
        after = len(writes)
    finally:
        stop.set()
        thread.join()
    expected = dict(loaded)
    for index, key, value in sorted(writes):
        if index <= manifest.index:
            expected[key] = value
    assert any(index > manifest.index for index, _, _ in writes[:after] + writes[after:]), "no write after N"
    assert any(index <= manifest.index for index, _, _ in writes), "no write before N"

    rows = _parquet_rows(tmp_path / "live")
    assert len(rows) == len(expected) == manifest.rows
    assert dict(rows) == expected
    assert len(manifest.files) == 4 and ExportManifest.load(tmp_path / "live") == manifest
    meta = pq.read_schema(tmp_path / "live" / "part-00000.parquet").metadata
    assert meta[schema.META_INDEX] == str(manifest.index).encode()
    assert meta[schema.META_REVISION] == str(manifest.revision).encode()
    # The export is the store at its revision, as a read at that revision sees it.
    with Client(cluster.endpoints, timeout=30) as client:
        at_revision = {kv.key: kv.value for kv in client.scan_at(manifest.revision, prefix=b"", limit=0)}
    assert at_revision == expected
    assert meta[schema.META_CLUSTER] == manifest.cluster_id.encode() != b""

    df = spark.read.parquet(str(tmp_path / "live"))
    assert df.columns == ["key", "value", "key_str", "value_str"]
    table = df.toArrow()  # Arrow, not collect(): 100k Rows through py4j take seconds here
    collected = list(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
    assert table.num_rows == len(expected) and _checksum(collected) == _checksum(list(expected.items()))
    strings = dict(zip(table.column("key_str").to_pylist(), table.column("value_str").to_pylist()))
    assert strings["user/000001"] == expected[b"user/000001"].decode()


def test_snapshot_file_export_equals_live_export_at_its_index(
        cluster: InProcessCluster, loaded: dict[bytes, bytes], tmp_path: Path) -> None:
    live = export_live(cluster.endpoints, tmp_path / "live", partitions=3)
    leader = cluster.leader().running
    # No writes run now: the leader's applied state is the live export's point in time.
    store = SnapshotStore(tmp_path / "snaps")
    snap = store.create(leader.fsm, list(leader.config.peers), leader.node.cluster_id)
    assert snap.index == live.index
    from_file = export_snapshot(store.path_for(snap), tmp_path / "snap", partitions=2)
    assert (from_file.index, from_file.term, from_file.cluster_id, from_file.revision) == \
        (live.index, live.term, live.cluster_id, live.revision)
    assert from_file.source == "snapshot" and from_file.rows == live.rows
    assert _parquet_rows(tmp_path / "snap") == _parquet_rows(tmp_path / "live")


def test_pinned_view_is_released_by_end_and_by_its_time_limit(cluster: InProcessCluster) -> None:
    handler = cluster.leader().exports
    with ExportClient(cluster.endpoints) as client:
        export = client.begin(prefix=b"user/00001", partitions=2)
        assert export.key_count == 10 and len(export.ranges) == 2
        assert client.end(export) is True and client.end(export) is False
        short = client.begin(prefix=b"user/", ttl_ms=200)
        assert cluster.run(_wait_released(handler, short.export_id))
        with pytest.raises(Exception, match="released"):
            list(client.read(short, b"", b""))


async def _wait_released(handler: ExportHandler, export_id: str) -> bool:
    """Wait (on the cluster's loop) until the handler holds no open export: the timer fired."""
    for _ in range(100):
        if handler.open_exports == 0:
            return True
        await asyncio.sleep(0.05)
    return False
