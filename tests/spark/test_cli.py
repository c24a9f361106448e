"""`raftkv export` / `raftkv import` (pyarrow only; no Spark needed)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kv import Client
from kv.tools.spark.cli import add_parsers
from kv.tools.spark.export_client import STAGING_PREFIX
from kv.tools.spark.parquet_export import ExportManifest
from raftkv_proto import kv_pb2
from raft.core import Entry, EntryType
from snapshot.store import SnapshotStore
from statemachine import KVStateMachine, encode_command
from tests.spark.cluster import InProcessCluster


def raftkv(*argv: str) -> int:
    """Run a sub-command as kv/tools/cli.py will, once it calls add_parsers."""
    parser = argparse.ArgumentParser(prog="raftkv")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.run(args, args.command_parser))


def _snapshot_file(tmp_path: Path, rows: dict[bytes, bytes]) -> Path:
    """A real snapshot file at index 3, made from a state machine: no cluster involved."""
    ops = [kv_pb2.Op(put=kv_pb2.KeyValue(key=k, value=v)) for k, v in rows.items()]
    with KVStateMachine(tmp_path / "state", map_size=64 << 20) as fsm:
        fsm.apply([Entry(1, 2, EntryType.NOOP), Entry(2, 2, EntryType.NORMAL, encode_command(ops[:5])),
                   Entry(3, 2, EntryType.NORMAL, encode_command(ops[5:]))])
        store = SnapshotStore(tmp_path / "snaps")
        return store.path_for(store.create(fsm, ["n1"], "cluster-x"))


def test_export_snapshot_file_needs_no_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = {b"k%03d" % i: b"v%d" % i for i in range(50)} | {b"bin": b"\xff\x00"}
    snap = _snapshot_file(tmp_path, rows)
    assert raftkv("export", "--snapshot", str(snap), "--out", str(tmp_path / "out"), "--partitions", "3") == 0
    printed = json.loads(capsys.readouterr().out)
    manifest = ExportManifest.load(tmp_path / "out")
    assert (manifest.index, manifest.term, manifest.cluster_id, manifest.rows) == (3, 2, "cluster-x", 51)
    assert manifest.revision == 3  # the empty store's 1, and one per write command
    assert printed["index"] == 3 and printed["files"] == 3
    table = pq.read_table(tmp_path / "out")
    assert dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist())) == rows
    assert table.schema.metadata[b"raftkv.index"] == b"3"


def test_export_refuses_a_directory_that_holds_an_export(tmp_path: Path) -> None:
    snap = _snapshot_file(tmp_path, {b"k%d" % i: b"v" for i in range(6)})
    raftkv("export", "--snapshot", str(snap), "--out", str(tmp_path / "out"))
    with pytest.raises(FileExistsError, match="already holds an export"):
        raftkv("export", "--snapshot", str(snap), "--out", str(tmp_path / "out"))


def test_import_then_live_export_round_trip(cluster: InProcessCluster, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"key": [f"imp/{i:05d}" for i in range(3000)],
                             "value": [f"value {i}".encode() for i in range(3000)]}), source / "a.parquet")
    assert raftkv("import", "--parquet", str(source), "--endpoints", cluster.endpoints, "--batch-rows", "500") == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["rows"] == 3000 and "3000/3000" in out.err and "\r" not in out.err
    assert raftkv("export", "--endpoints", cluster.endpoints, "--prefix", "imp/", "--out", str(tmp_path / "x")) == 0
    table = pq.read_table(tmp_path / "x")
    assert table.num_rows == 3000 and table.column("key_str").to_pylist()[0] == "imp/00000"


def test_atomic_import_publishes_everything_and_leaves_no_staging(cluster: InProcessCluster, tmp_path: Path) -> None:
    pq.write_table(pa.table({"key": [b"atom/%d" % i for i in range(1200)], "value": [b"v"] * 1200}),
                   tmp_path / "a.parquet")
    assert raftkv("import", "--parquet", str(tmp_path / "a.parquet"), "--endpoints", cluster.endpoints,
                  "--atomic", "--no-progress") == 0
    with Client(cluster.endpoints) as client:
        assert len(client.scan(prefix=b"atom/", limit=5000)) == 1200
        assert client.scan(prefix=STAGING_PREFIX, limit=10) == []


def test_import_without_key_value_columns_is_refused(cluster: InProcessCluster, tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1], "payload": [b"x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="needs key and value"):
        raftkv("import", "--parquet", str(tmp_path / "bad.parquet"), "--endpoints", cluster.endpoints)
