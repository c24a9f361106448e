"""The change feed as a Spark stream: ``spark.readStream.format("raftkv")`` (PySpark 4's Python
Data Source API, DataSourceStreamReader), on the store's revisions (KV.Changes, kv/client/changes.py).

    kv.tools.spark.register(spark)
    changes = (spark.readStream.format("raftkv").option("endpoints", "127.0.0.1:7001,127.0.0.1:7002")
               .option("prefix", "user/").option("startingRevision", "snapshot").load())

Rows: key, value (binary; empty for a delete), revision (long), type ("put" or "delete"),
create_revision, version (long; 0 for a delete, null in a snapshot's rows) and prev_value (binary,
with prevValue=true: the value the change replaced, null when the key did not exist).

Offsets are {"revision": N}: every change through revision N has been read. A micro-batch reads the
changes of revisions (start, end], split by revision into up to `partitions` tasks, each from any
member (the history through a revision the store has reached never changes): a batch replayed
after a failure or a restart from its checkpoint reads exactly the same rows, so a query with a
checkpoint and an exactly-once sink (files, foreachBatch keyed by batch id) has every change once,
across a leader change (each page is asked of another member when one fails) and restarts.
latestOffset is the store's revision, read linearizably, at most maxRevisionsPerTrigger past the
batch's start.

Options: endpoints (required), prefix | start / end (UTF-8; none: every key), startingRevision
(required, for a new query; a restarted one resumes from its checkpoint): `latest` (changes after
now), `earliest` (from the oldest revision still kept), a revision N (from N on), or `snapshot` (the
state of the keys at a revision R from a point-in-time export, as `put` rows with revision R, then
every change after R, with no gap between); maxRevisionsPerTrigger, prevValue (true/false),
partitions (tasks per batch, default 2), timeout (seconds each call may take, retries included;
default 30), user / password and cacert / cert / key as the batch source's. A start below the
compacted revision fails the query, naming the oldest available revision.

Keys under the staging area of atomic Spark writes (export_client.STAGING_PREFIX) are left out,
as exports leave them out.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from kv.client.client import Client
from kv.errors import RevisionError
from kv.tools.spark import schema
from kv.tools.spark.export_client import STAGING_PREFIX, ExportClient, ExportInfo
from raftkv_proto import kv_pb2
from raftkv_proto.key_ranges import prefix_end

try:  # PySpark >= 4.2: read limits (maxRevisionsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - depends on the installed PySpark
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

STARTS = ("latest", "earliest", "snapshot")
DEFAULT_PARTITIONS = 2
# A batch is split among tasks only when each gets at least this many revisions.
MIN_REVISIONS_PER_PARTITION = 1000
SNAPSHOT_TTL_MS = 600_000  # how long the snapshot's export lives after its last use
_TYPES = {kv_pb2.Change.PUT: schema.PUT, kv_pb2.Change.DELETE: schema.DELETE}


class StreamOptionError(ValueError):
    """An option of the stream that cannot work (named in the message)."""


def option(options: dict[str, str], name: str, default: str = "") -> str:
    # Spark passes option names case-insensitively (lower-cased).
    return options.get(name, options.get(name.lower(), default))


STREAM_OPTIONS = ("startingRevision", "maxRevisionsPerTrigger", "prevValue")


def is_stream(options: dict[str, str]) -> bool:
    """Whether `options` ask for the change feed: the stream's own options decide the schema, which
    Spark asks the data source for before it knows whether it reads a stream or a batch."""
    return any(option(options, name) for name in STREAM_OPTIONS)


@dataclass
class ChangesPartition(InputPartition):
    """The changes of revisions first..last."""

    number: int
    first: int
    last: int

    def __post_init__(self) -> None:
        super().__init__(self.number)


@dataclass
class SnapshotPartition(InputPartition):
    """The keys of [start, end) of a pinned export at `revision`; with no export (it is gone: the
    batch runs again after a restart), a read of those keys at `revision` instead."""

    number: int
    revision: int
    export: ExportInfo | None
    start: bytes
    end: bytes

    def __post_init__(self) -> None:
        super().__init__(self.number)


class RaftKVStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Made on the driver (offsets, partitions) and again for the executors (read); it reaches the
    cluster only when asked something, never when made."""

    def __init__(self, options: dict[str, str], endpoints: str, credentials: dict[str, Any]) -> None:
        self.endpoints = endpoints
        self.credentials = credentials
        prefix, start, end = (option(options, name).encode() for name in ("prefix", "start", "end"))
        if prefix and (start or end):
            raise StreamOptionError("give either the option prefix or start / end, not both")
        self.lo, self.hi = (prefix, prefix_end(prefix)) if prefix else (start, end)  # hi b"": to the last key
        self.starting = option(options, "startingRevision").strip().lower()
        if not self.starting:
            raise StreamOptionError("a raftkv stream needs .option('startingRevision', ...): latest, earliest, "
                                    "snapshot or a revision")
        if self.starting not in STARTS and not (self.starting.isdigit() and int(self.starting) >= 1):
            raise StreamOptionError(f"startingRevision must be latest, earliest, snapshot or a revision >= 1, not "
                                    f"{self.starting!r}")
        self.max_revisions = int(option(options, "maxRevisionsPerTrigger", "0") or 0)
        if self.max_revisions < 0:
            raise StreamOptionError("maxRevisionsPerTrigger must be at least 1 (0 or unset: no limit)")
        self.prev_value = option(options, "prevValue", "false").lower() in ("true", "1", "yes")
        self.partition_count = max(1, int(option(options, "partitions", str(DEFAULT_PARTITIONS))))
        self.timeout = float(option(options, "timeout", "30"))
        self.page_limit = int(option(options, "pageLimit", "0"))  # changes per page; 0: the server's
        # The staging area is left out when the range reaches it.
        self.skip_staging = self.lo < STAGING_PREFIX + b"\xff" and (not self.hi or self.hi > STAGING_PREFIX)
        self._client: Client | None = None
        self._snapshot: ExportInfo | None = None  # the export this reader began, until committed past
        self._target: int | None = None  # Trigger.AvailableNow: the revision to stop at
        self._initial: dict[str, Any] | None = None
        self._checked = False  # whether partitions() checked its start against compaction yet
        self._known: int | None = None  # the last offset seen (PySpark < 4.2 gives latestOffset no start)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    # ---- on the driver -------------------------------------------------------------------

    def _cluster(self) -> Client:
        if self._client is None:
            self._client = Client(self.endpoints, timeout=self.timeout, streams=False, **self.credentials)
        return self._client

    def initialOffset(self) -> dict[str, Any]:
        # Spark may ask more than once (PySpark 4.3 does, for a new query): one answer, one snapshot.
        if self._initial is None:
            self._initial = self._initial_offset()
        return dict(self._initial)

    def _initial_offset(self) -> dict[str, Any]:
        client = self._cluster()
        if self.starting == "latest":
            offset: dict[str, Any] = {"revision": client.revision()}
        elif self.starting == "earliest":
            offset = {"revision": client.oldest_revision() - 1}
        elif self.starting == "snapshot":
            with ExportClient(self.endpoints, timeout=self.timeout, **self.credentials) as exports:
                lo, hi = (self.lo, self.hi) if self.lo or self.hi else (b"", b"")
                self._snapshot = exports.begin(start=lo, end=hi, partitions=self.partition_count,
                                               ttl_ms=SNAPSHOT_TTL_MS)
            log.warning("raftkv stream: snapshot of %d keys at revision %d (export %s on %s), then its changes",
                        self._snapshot.key_count, self._snapshot.revision, self._snapshot.export_id,
                        self._snapshot.address)
            offset = {"revision": self._snapshot.revision, "snapshot": True}
        else:
            first = int(self.starting)
            oldest = client.oldest_revision()
            if first < oldest:
                raise RevisionError(_compacted_message(first, oldest))
            offset = {"revision": first - 1}
        self._known = offset["revision"]
        return offset

    def getDefaultReadLimit(self) -> Any:
        if self.max_revisions and ReadMaxRows is not None:
            return ReadMaxRows(self.max_revisions)  # counted in revisions
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._cluster().revision()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        now = self._target if self._target is not None else self._cluster().revision()
        begin = start["revision"] if start is not None else self._known
        cap = self.max_revisions
        if ReadMaxRows is not None and limit is not None:
            cap = limit.max_rows if isinstance(limit, ReadMaxRows) else 0  # ReadAllAvailable: no cap
        end = now if begin is None or not cap else min(now, begin + cap)
        if start is not None and end <= begin and not start.get("snapshot"):
            return start  # nothing new (a snapshot's start still runs: it has the snapshot to read)
        return {"revision": max(end, begin or 0)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = start["revision"] + 1, end["revision"]
        self._known = last
        parts: list[InputPartition] = []
        if start.get("snapshot"):
            parts += self._snapshot_partitions(start["revision"])
        if first <= last:
            if not self._checked:  # once per run: a compacted start fails here, on the driver, clearly
                oldest = self._cluster().oldest_revision()
                if first < oldest:
                    raise RevisionError(_compacted_message(first, oldest))
            count = max(1, min(self.partition_count, (last - first + 1) // MIN_REVISIONS_PER_PARTITION))
            step = math.ceil((last - first + 1) / count)
            for at in range(first, last + 1, step):
                parts.append(ChangesPartition(len(parts), at, min(last, at + step - 1)))
        self._checked = True
        return parts

    def _snapshot_partitions(self, revision: int) -> list[InputPartition]:
        export = self._snapshot if self._snapshot is not None and self._snapshot.revision == revision else None
        if export is None:
            # A restart before the snapshot's batch committed: its export is gone (or belonged to
            # the stopped run); read the same state at its revision instead.
            log.warning("raftkv stream: the snapshot at revision %d is read again at that revision", revision)
            return [SnapshotPartition(0, revision, None, self.lo, self.hi)]
        return [SnapshotPartition(i, revision, export, lo, hi) for i, (lo, hi) in enumerate(export.ranges)]

    def commit(self, end: dict[str, Any]) -> None:
        if self._snapshot is not None and end["revision"] >= self._snapshot.revision and not end.get("snapshot"):
            self._release_snapshot()

    def stop(self) -> None:
        self._release_snapshot()
        if self._client is not None:
            self._client.close()
            self._client = None

    def _release_snapshot(self) -> None:
        export, self._snapshot = self._snapshot, None
        if export is None:
            return
        try:
            with ExportClient(self.endpoints, timeout=self.timeout, **self.credentials) as exports:
                exports.end(export)
        except Exception as error:  # noqa: BLE001 - it expires by itself after its TTL
            log.warning("raftkv stream: releasing the snapshot's export failed (it expires by itself): %s", error)

    # ---- on the executors ----------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if isinstance(partition, SnapshotPartition):
            yield from self._read_snapshot(partition)
            return
        assert isinstance(partition, ChangesPartition)
        client = _worker_client(self.endpoints, self.timeout, self.credentials)
        try:
            for page in client.change_pages(partition.first, partition.last, start=self.lo, end=self.hi,
                                            limit=self.page_limit, prev_kv=self.prev_value):
                changes = page.changes
                if self.skip_staging:
                    changes = [c for c in changes if not c.key.startswith(STAGING_PREFIX)]
                if changes:
                    yield changes_batch(changes, self.prev_value)
        except RevisionError as error:
            raise RevisionError(f"raftkv stream: the changes from revision {partition.first} are no longer "
                                f"kept: {error}. Start a new query (a new checkpoint) with startingRevision "
                                "snapshot, earliest, or a revision at or above the oldest available one") from None

    def _read_snapshot(self, partition: SnapshotPartition) -> Iterator[pa.RecordBatch]:
        if partition.export is not None:
            with ExportClient(self.endpoints, timeout=self.timeout, **self.credentials) as exports:
                for items in exports.read(partition.export, partition.start, partition.end):
                    if items:
                        yield snapshot_batch(items, partition.revision)
            return
        with Client(self.endpoints, timeout=self.timeout, streams=False, **self.credentials) as client:
            kept = client.scan_at(partition.revision, start=partition.start or b"\0", end=partition.end or None,
                                  limit=0)
        items = [(kv.key, kv.value) for kv in kept if not (self.skip_staging and kv.key.startswith(STAGING_PREFIX))]
        if items:
            yield snapshot_batch(items, partition.revision)


# One Client per cluster and identity in each Python worker, kept for the worker's life: Spark
# reuses its workers from batch to batch, and a micro-batch of a few changes should not pay for
# connecting (and logging in) again.
_CLIENTS: dict[tuple[Any, ...], Client] = {}
_CLIENTS_LOCK = threading.Lock()


def _worker_client(endpoints: str, timeout: float, credentials: dict[str, Any]) -> Client:
    tls = credentials.get("tls")
    files = None if tls is None else (tls.ca_file, tls.cert_file, tls.key_file)
    key = (endpoints, timeout, credentials.get("user"), credentials.get("password"), files)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = Client(endpoints, timeout=timeout, streams=False, **credentials)
        return client


def _compacted_message(first: int, oldest: int) -> str:
    return (f"raftkv stream: startingRevision {first} is below the compacted revision: the oldest available revision "
            f"is {oldest} (etcdserver: mvcc: required revision has been compacted). Start from {oldest} or later, "
            "earliest, or snapshot (a consistent export, then its changes)")


def changes_batch(changes: Sequence[kv_pb2.Change], with_prev: bool) -> pa.RecordBatch:
    """Rows of the stream's schema from a page's changes."""
    prev = [c.prev_value if c.HasField("prev_value") else None for c in changes] if with_prev \
        else [None] * len(changes)
    return pa.RecordBatch.from_arrays([
        pa.array([c.key for c in changes], pa.binary()),
        pa.array([c.value for c in changes], pa.binary()),
        pa.array([c.revision for c in changes], pa.int64()),
        pa.array([_TYPES[c.type] for c in changes], pa.string()),
        pa.array([c.create_revision for c in changes], pa.int64()),
        pa.array([c.version for c in changes], pa.int64()),
        pa.array(prev, pa.binary()),
    ], schema=schema.STREAM_ARROW_SCHEMA)


def snapshot_batch(items: Sequence[tuple[bytes, bytes]], revision: int) -> pa.RecordBatch:
    """Rows of the stream's schema for a snapshot's keys at `revision`: puts at that revision."""
    n = len(items)
    return pa.RecordBatch.from_arrays([
        pa.array([k for k, _ in items], pa.binary()),
        pa.array([v for _, v in items], pa.binary()),
        pa.array([revision] * n, pa.int64()),
        pa.array([schema.PUT] * n, pa.string()),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.binary()),
    ], schema=schema.STREAM_ARROW_SCHEMA)
