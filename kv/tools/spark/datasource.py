"""The PySpark data source ``raftkv`` (Python Data Source API, PySpark >= 4.0).

    kv.tools.spark.register(spark)
    df = (spark.read.format("raftkv").option("endpoints", "127.0.0.1:7001,127.0.0.1:7002")
          .option("prefix", "user/").option("partitions", 8).load())
    df.write.format("raftkv").option("endpoints", ...).option("atomic", "true").mode("append").save()
    spark.readStream.format("raftkv").option("endpoints", ...).option("startingRevision", "snapshot").load()

The stream (the store's changes, by revision) is kv/tools/spark/stream.py.

Read: one BeginExport on the leader pins a point in time N (logged, with term and cluster id); the
partitions are the key ranges between the split points the server suggests, and every partition
reads exactly the state at N. Options: endpoints (required), prefix | start / end (UTF-8),
partitions (default 4), ttl_ms (how long the server keeps the view after its last use),
batch_size, timeout, user and password (once the cluster has auth enabled: an export reads every
key, so a user with the root role), and TLS (below).

Write: only the columns key and value (binary or string). Each task sends batches of idempotent
puts through the leader (kv.tools.spark.bulk_load): a retried or speculative task writes the same bytes
again and nothing doubles, but a FAILED JOB MAY LEAVE PART OF ITS ROWS WRITTEN - Spark cannot roll
back task writes. With atomic=true rows are staged under a private prefix and commit() publishes
them with one committed Raft command (readers see all or nothing); abort() removes them.
Options: endpoints, atomic, batch_rows (<= 1000), in_flight, rows_per_second, bytes_per_second,
timeout, user and password (once auth is enabled: a user allowed to write the keys; an atomic
write publishes into the whole key space, which takes the root role), and TLS (below). Only
mode("append") is supported.

TLS, for nodes started with --cert-file (docs/security.md): options cacert, cert and key, paths to
PEM files as the CLI's --cacert, --cert and --key. Every connection uses them, the executors'
too, so the files must be at those paths on every executor's machine.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from kv.client.tls import TLS
from kv.tools.spark import schema
from kv.tools.spark.bulk_load import BulkLoader, Throttle, discard_staged, new_stage, publish_staged
from kv.tools.spark.export_client import ExportClient, ExportInfo
from kv.tools.spark.stream import STREAM_OPTIONS, is_stream

try:  # PySpark >= 4.1 hands writers Arrow batches; 4.0 hands them Rows
    from pyspark.sql.datasource import DataSourceArrowWriter as _WriterBase
except ImportError:  # pragma: no cover - depends on the installed PySpark
    _WriterBase = DataSourceWriter  # type: ignore[misc,assignment]

log = logging.getLogger(__name__)

NAME = "raftkv"
EXPECTED_COLUMNS = "key and value (binary or string)"
# How long after an abort a cancelled task's Python worker may still send (killTimeout + margin).
ZOMBIE_GRACE_S = 3.0


class RaftKVDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Spark asks before it says whether it reads a batch or a stream: the stream's options decide.
        return schema.STREAM_DDL if is_stream(dict(self.options)) else schema.SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        if is_stream(dict(self.options)):
            raise ValueError(f"the options {', '.join(STREAM_OPTIONS)} are for spark.readStream (the change feed); "
                             "spark.read reads one point in time")
        return RaftKVReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The change feed (kv/tools/spark/stream.py)."""
        from kv.tools.spark.stream import RaftKVStreamReader

        options = dict(self.options)
        return RaftKVStreamReader(options, _endpoints(options), _credentials(options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        check_write_schema(schema)  # here, on the driver: before any task writes anything
        if overwrite:
            raise ValueError("raftkv supports mode('append') only: it never deletes keys the DataFrame does not hold")
        return RaftKVWriter(dict(self.options))


def check_write_schema(struct: StructType) -> None:
    names = [f.name for f in struct.fields]
    bad_types = [f"{f.name}: {f.dataType.simpleString()}" for f in struct.fields
                 if not isinstance(f.dataType, (BinaryType, StringType))]
    if sorted(names) != ["key", "value"] or bad_types:
        got = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in struct.fields)
        raise ValueError(
            f"raftkv writes DataFrames with exactly the columns {EXPECTED_COLUMNS}; got [{got}]. "
            "Select or rename them first, e.g. df.selectExpr('id AS key', 'payload AS value')")


def _option(options: dict[str, str], name: str, default: str = "") -> str:
    # Spark passes option names case-insensitively (lower-cased).
    return options.get(name, options.get(name.lower(), default))


def _credentials(options: dict[str, str]) -> dict[str, Any]:
    """Options `user` and `password` (who reads or writes once the cluster has auth enabled; reads
    are exports, for the root role only), and `tls` from the options cacert, cert and key (paths;
    None, plaintext, when none is given)."""
    ca, cert, key = (_option(options, name) or None for name in ("cacert", "cert", "key"))
    tls = None if ca is None and cert is None and key is None else TLS(ca, cert, key)  # type: ignore[arg-type]
    return {"user": _option(options, "user") or None, "password": _option(options, "password") or None,
            "tls": tls}


def _endpoints(options: dict[str, str]) -> str:
    endpoints = _option(options, "endpoints")
    if not endpoints:
        raise ValueError("the raftkv data source needs .option('endpoints', 'host:port,host:port,...')")
    return endpoints


# ---- read ------------------------------------------------------------------------------------

@dataclass
class RangePartition(InputPartition):
    """One key range [start, end) of a pinned export."""

    number: int
    export: ExportInfo
    start: bytes
    end: bytes

    def __post_init__(self) -> None:
        super().__init__(self.number)


class RaftKVReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.endpoints = _endpoints(options)
        self.prefix = _option(options, "prefix").encode()
        self.start = _option(options, "start").encode()
        self.end = _option(options, "end").encode()
        self.partition_count = int(_option(options, "partitions", "4"))
        self.ttl_ms = int(_option(options, "ttl_ms", "60000"))
        self.batch_size = int(_option(options, "batch_size", "5000"))
        self.timeout = float(_option(options, "timeout", "30"))
        self.credentials = _credentials(options)

    def partitions(self) -> list[RangePartition]:
        with ExportClient(self.endpoints, timeout=self.timeout, **self.credentials) as client:
            export = client.begin(self.prefix, self.start, self.end, self.partition_count, self.ttl_ms)
        log.warning("raftkv read: point in time index %d term %d, revision %d, of cluster %s (export %s on %s, %d keys, "
                    "%d partitions)", export.index, export.term, export.revision, export.cluster_id, export.export_id,
                    export.address, export.key_count, len(export.ranges))
        return [RangePartition(i, export, s, e) for i, (s, e) in enumerate(export.ranges)]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        with ExportClient(self.endpoints, timeout=self.timeout, **self.credentials) as client:
            for items in client.read(partition.export, partition.start, partition.end, self.batch_size):
                if items:
                    yield schema.record_batch(items)


# ---- write -----------------------------------------------------------------------------------

@dataclass
class RaftKVCommitMessage(WriterCommitMessage):
    rows: int


class RaftKVWriter(_WriterBase):  # type: ignore[valid-type,misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.endpoints = _endpoints(options)
        self.atomic = _option(options, "atomic", "false").lower() in ("true", "1", "yes")
        # Made once on the driver and shipped to every task: all tasks stage under one prefix.
        self.stage = new_stage() if self.atomic else b""
        self.batch_rows = int(_option(options, "batch_rows", "1000"))
        self.in_flight = int(_option(options, "in_flight", "8"))
        self.rows_per_s = float(_option(options, "rows_per_second", "0"))
        self.bytes_per_s = float(_option(options, "bytes_per_second", "0"))
        self.timeout = float(_option(options, "timeout", "30"))
        self.credentials = _credentials(options)

    def write(self, iterator: Iterator[Any]) -> RaftKVCommitMessage:
        with BulkLoader(self.endpoints, batch_rows=self.batch_rows, in_flight=self.in_flight, stage=self.stage,
                        throttle=Throttle(self.rows_per_s, self.bytes_per_s), timeout=self.timeout,
                        **self.credentials) as loader:
            return RaftKVCommitMessage(loader.load(_pairs(iterator)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, RaftKVCommitMessage))
        if self.atomic:
            publish_staged(self.endpoints, self.stage, self.timeout * 4, **self.credentials)
        log.warning("raftkv write: %d rows committed%s", rows, " atomically" if self.atomic else "")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.atomic:
            discard_staged(self.endpoints, self.stage, self.timeout * 4, **self.credentials)
            # Tasks cancelled by the abort may still have batches in flight: PySpark kills their
            # Python workers within spark.python.task.killTimeout (2 s). Sweep again after that.
            time.sleep(ZOMBIE_GRACE_S)
            discard_staged(self.endpoints, self.stage, self.timeout * 4, **self.credentials)
            log.warning("raftkv write aborted: staged rows removed, nothing was published")
        else:
            log.warning("raftkv write aborted: rows written by finished tasks stay (non-atomic write)")


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        raise ValueError("raftkv rows need a non-null key and value")
    return bytes(value)


def _pairs(iterator: Iterator[Any]) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) bytes from Arrow record batches (PySpark >= 4.1) or Rows (4.0)."""
    for item in iterator:
        if isinstance(item, pa.RecordBatch):
            keys, values = schema.as_binary(item.column("key")), schema.as_binary(item.column("value"))
            if keys.null_count or values.null_count:
                raise ValueError("raftkv rows need a non-null key and value")
            yield from zip(keys.to_pylist(), values.to_pylist())
        else:
            yield _as_bytes(item["key"]), _as_bytes(item["value"])

