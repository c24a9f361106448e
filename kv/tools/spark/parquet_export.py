"""Consistent export of the store to Parquet with pyarrow, one file per key range:

    export_live(endpoints, "out/", partitions=8)    # a point in time N confirmed on the leader
    export_snapshot("backup.snap", "out/")           # the snapshot's index; no cluster needed
    spark.read.parquet("out/")                       # just works: files named part-*.parquet

Every file's schema metadata and the manifest ``_raftkv_export.json`` (Spark skips names starting
with "_") record the Raft index, term and cluster id of the point in time, and each file's range.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kv.tools.spark import schema
from kv.client.tls import TLS
from kv.tools.spark.export_client import ExportClient
from kv.tools.spark.snapshot_source import SnapshotSource

MANIFEST_NAME = "_raftkv_export.json"
ReadRange = Callable[[bytes, bytes], Iterator[list[tuple[bytes, bytes]]]]


@dataclass(frozen=True, slots=True)
class ExportedFile:
    path: str  # relative to the export directory
    start: str  # hex of the range's first key (inclusive); "" = from the first key
    end: str  # hex of the range end (exclusive); "" = to the last key
    rows: int


@dataclass(frozen=True, slots=True)
class ExportManifest:
    index: int
    term: int
    cluster_id: str
    source: str  # "live" or "snapshot"
    rows: int
    files: list[ExportedFile]
    revision: int = 0  # the store's revision at `index` (etcd's): the export is the store at it
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ExportManifest:
        raw = json.loads((Path(directory) / MANIFEST_NAME).read_text())
        raw["files"] = [ExportedFile(**f) for f in raw["files"]]
        return cls(**raw)


def export_live(endpoints: Sequence[str] | str, out_dir: str | os.PathLike[str], *, partitions: int = 4,
                prefix: bytes = b"", start: bytes = b"", end: bytes = b"", timeout: float = 30.0,
                workers: int = 4, tls: TLS | None = None, user: str | None = None,
                password: str | None = None) -> ExportManifest:
    """Export a point in time of a running cluster: one BeginExport on the leader, every range read
    from that pinned view, the view released at the end. `tls`: as kv.Client's. With auth enabled,
    as `user` (root role)."""
    with ExportClient(endpoints, timeout=timeout, tls=tls, user=user, password=password) as client:
        export = client.begin(prefix=prefix, start=start, end=end, partitions=partitions)
        try:
            return _write_all(out_dir, export.ranges, lambda s, e: client.read(export, s, e),
                              export.index, export.term, export.cluster_id, "live", workers, export.revision)
        finally:
            client.end(export)


def export_snapshot(snapshot_file: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                    partitions: int = 4, workers: int = 4) -> ExportManifest:
    """Export a snapshot file (verified first) at its index; needs no cluster."""
    with SnapshotSource(snapshot_file) as snap:
        return _write_all(out_dir, snap.ranges(partitions), snap.read, snap.index, snap.term, snap.cluster_id,
                          "snapshot", workers, snap.revision)


def _write_all(out_dir: str | os.PathLike[str], ranges: list[tuple[bytes, bytes]], read: ReadRange, index: int,
               term: int, cluster_id: str, source: str, workers: int, revision: int) -> ExportManifest:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("part-*.parquet")) or (out / MANIFEST_NAME).exists():
        raise FileExistsError(f"{out} already holds an export; choose an empty directory")
    point = {schema.META_INDEX: str(index).encode(), schema.META_TERM: str(term).encode(),
             schema.META_CLUSTER: cluster_id.encode(), schema.META_REVISION: str(revision).encode()}

    def write_one(position: int) -> ExportedFile:
        start, end = ranges[position]
        name = f"part-{position:05d}.parquet"
        metadata = {**point, schema.META_RANGE_START: start.hex().encode(), schema.META_RANGE_END: end.hex().encode()}
        rows = _write_file(out / name, read(start, end), schema.ARROW_SCHEMA.with_metadata(metadata))
        return ExportedFile(name, start.hex(), end.hex(), rows)

    with ThreadPoolExecutor(max(1, min(workers, len(ranges)))) as pool:
        files = list(pool.map(write_one, range(len(ranges))))
    manifest = ExportManifest(index, term, cluster_id, source, sum(f.rows for f in files), files, revision=revision)
    tmp = out / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=2))
    tmp.replace(out / MANIFEST_NAME)  # the manifest appears last: its presence means complete
    return manifest


def _write_file(path: Path, batches: Iterator[list[tuple[bytes, bytes]]], arrow_schema: pa.Schema) -> int:
    rows = 0
    with pq.ParquetWriter(path, arrow_schema) as writer:
        for items in batches:
            if items:
                writer.write_batch(schema.record_batch(items).replace_schema_metadata(arrow_schema.metadata))
                rows += len(items)
    return rows
