"""The one table shape of raftkv data in Arrow, Parquet and Spark: key and value as bytes, plus a
string view of each, null where the bytes are not UTF-8."""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

KEY, VALUE, KEY_STR, VALUE_STR = "key", "value", "key_str", "value_str"

ARROW_SCHEMA = pa.schema([
    pa.field(KEY, pa.binary(), nullable=False),
    pa.field(VALUE, pa.binary(), nullable=False),
    pa.field(KEY_STR, pa.string()),
    pa.field(VALUE_STR, pa.string()),
])

# The same as a Spark DDL string (kept here so the data source and docs agree).
SPARK_DDL = f"{KEY} binary NOT NULL, {VALUE} binary NOT NULL, {KEY_STR} string, {VALUE_STR} string"

# Metadata keys in each Parquet file's schema and in the export manifest.
META_INDEX, META_TERM, META_CLUSTER = b"raftkv.index", b"raftkv.term", b"raftkv.cluster_id"
META_REVISION = b"raftkv.revision"
META_RANGE_START, META_RANGE_END = b"raftkv.range_start", b"raftkv.range_end"


def _utf8_or_none(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def string_view(column: pa.Array) -> pa.Array:
    """The binary column as strings, null where not UTF-8. Arrow validates a whole column in C++;
    only a column with some non-UTF-8 value is decoded value by value."""
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([_utf8_or_none(raw) for raw in column.to_pylist()], pa.string())


def as_binary(column: pa.Array) -> pa.Array:
    """A key or value column as binary; a string column keeps its UTF-8 bytes (the cast copies no
    data)."""
    return column.cast(pa.binary()) if pa.types.is_string(column.type) else column


def record_batch(items: Sequence[tuple[bytes, bytes]]) -> pa.RecordBatch:
    keys = pa.array([k for k, _ in items], pa.binary())
    values = pa.array([v for _, v in items], pa.binary())
    return pa.RecordBatch.from_arrays([keys, values, string_view(keys), string_view(values)], schema=ARROW_SCHEMA)


# ---- the change feed (spark.readStream.format("raftkv"): kv/tools/spark/stream.py) -------------

REVISION, TYPE, CREATE_REVISION, VERSION, PREV_VALUE = "revision", "type", "create_revision", "version", "prev_value"
PUT, DELETE = "put", "delete"

STREAM_ARROW_SCHEMA = pa.schema([
    pa.field(KEY, pa.binary(), nullable=False),
    pa.field(VALUE, pa.binary(), nullable=False),  # empty for a delete
    pa.field(REVISION, pa.int64(), nullable=False),
    pa.field(TYPE, pa.string(), nullable=False),  # "put" or "delete"
    pa.field(CREATE_REVISION, pa.int64()),  # null in a snapshot's rows
    pa.field(VERSION, pa.int64()),
    pa.field(PREV_VALUE, pa.binary()),  # with prevValue: the value replaced; null when there was none
])

STREAM_DDL = (f"{KEY} binary NOT NULL, {VALUE} binary NOT NULL, {REVISION} long NOT NULL, {TYPE} string NOT NULL, "
              f"{CREATE_REVISION} long, {VERSION} long, {PREV_VALUE} binary")
