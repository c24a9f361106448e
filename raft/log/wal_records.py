"""How the write-ahead log lays out its records in a segment file (wal_store.py).

A record is a 12-byte header, then its body:

    length u32 | crc u32 | prev_crc u32 | kind u8 | fields...

`length` counts kind and fields. `crc` is crc32(kind and fields) started from `prev_crc`, the
crc of the record before it in the same segment (a segment's first record starts from a seed
drawn from the segment's sequence number). So each record verifies on its own when it is read
back at random, and a replay also checks the chain: a stale record left behind a torn write,
which was chained to a different predecessor, can never pass as the next one.

Kinds:
- SEGMENT  (first in every segment): magic, format version, sequence number, and the log's state
  when the segment was started: the first index written here, before_begin (index, term) and
  the hard state. A replay can therefore start at any segment left after compaction.
- STATE    a new hard state (term, vote).
- TRUNCATE entries from this index on are gone.
- ENTRY    index, term, type, payload.
- BOUNDARY entries up to this index are compacted; (index, term) is the new before_begin.

A length of zero is the end: segments are preallocated, so the unwritten rest reads as zeros.
"""
from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

from raft.core.types import Entry, EntryType, HardState

MAGIC = b"RKWL"
FORMAT_VERSION = 1

_HEADER = struct.Struct("<III")  # length, crc, prev_crc
HEADER_SIZE = _HEADER.size
_KIND = struct.Struct("<B")
_U64 = struct.Struct("<Q")
_ENTRY = struct.Struct("<BQQB")  # kind, index, term, entry type
_BOUNDARY = struct.Struct("<BQQ")  # kind, index, term
_SEGMENT = struct.Struct("<B4sIQQQQQ")  # kind, magic, version, seq, first_index, before index/term, term
# A length beyond this is garbage, not a record: it bounds what a damaged header can make us read.
MAX_RECORD_BYTES = 1 << 30

_ENTRY_TYPES = {t.value: t for t in EntryType}


class RecordKind(enum.IntEnum):
    SEGMENT = 1
    STATE = 2
    TRUNCATE = 3
    ENTRY = 4
    BOUNDARY = 5


class RecordError(ValueError):
    """A record does not decode: bad checksum, wrong length or an unknown kind or value."""


@dataclass(frozen=True, slots=True)
class SegmentStart:
    """The SEGMENT record: where a segment begins in the log and the log's state at that point."""

    seq: int
    first_index: int
    before_index: int
    before_term: int
    hard_state: HardState


def segment_seed(seq: int) -> int:
    """The prev_crc of a segment's first record."""
    return zlib.crc32(_U64.pack(seq))


def seal(body: bytes, prev_crc: int) -> tuple[bytes, int]:
    """The record holding body (kind and fields), chained to prev_crc, and its crc."""
    crc = zlib.crc32(body, prev_crc)
    return _HEADER.pack(len(body), crc, prev_crc) + body, crc


# --- bodies ---

def _vote(voted_for: str | None) -> bytes:
    return b"\x00" if voted_for is None else b"\x01" + voted_for.encode()


def _decode_vote(raw: bytes) -> str | None:
    if raw == b"\x00":
        return None
    if raw[:1] != b"\x01":
        raise RecordError("malformed vote")
    try:
        return raw[1:].decode()
    except UnicodeDecodeError:
        raise RecordError("voted_for is not UTF-8") from None


def segment_body(start: SegmentStart) -> bytes:
    hs = start.hard_state
    return _SEGMENT.pack(RecordKind.SEGMENT, MAGIC, FORMAT_VERSION, start.seq, start.first_index,
                         start.before_index, start.before_term, hs.term) + _vote(hs.voted_for)


def state_body(hard_state: HardState) -> bytes:
    return _KIND.pack(RecordKind.STATE) + _U64.pack(hard_state.term) + _vote(hard_state.voted_for)


def truncate_body(from_index: int) -> bytes:
    return _KIND.pack(RecordKind.TRUNCATE) + _U64.pack(from_index)


def entry_body(entry: Entry) -> bytes:
    return _ENTRY.pack(RecordKind.ENTRY, entry.index, entry.term, entry.type) + entry.payload


def boundary_body(index: int, term: int) -> bytes:
    return _BOUNDARY.pack(RecordKind.BOUNDARY, index, term)


ENTRY_FIELDS_SIZE = _ENTRY.size  # what an ENTRY body holds besides the payload


def decode_segment(body: bytes) -> SegmentStart:
    if len(body) < _SEGMENT.size + 1:
        raise RecordError("SEGMENT record too short")
    _, magic, version, seq, first, before_index, before_term, term = _SEGMENT.unpack_from(body)
    if magic != MAGIC:
        raise RecordError(f"not a raftkv log segment (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise RecordError(f"unknown format version {version} (this build reads {FORMAT_VERSION})")
    return SegmentStart(seq, first, before_index, before_term, HardState(term, _decode_vote(body[_SEGMENT.size:])))


def decode_state(body: bytes) -> HardState:
    if len(body) < 1 + _U64.size + 1:
        raise RecordError("STATE record too short")
    return HardState(_U64.unpack_from(body, 1)[0], _decode_vote(body[1 + _U64.size:]))


def decode_u64_field(body: bytes) -> int:
    """The index a TRUNCATE record carries."""
    if len(body) != 1 + _U64.size:
        raise RecordError(f"record of {len(body)} bytes where {1 + _U64.size} were expected")
    return _U64.unpack_from(body, 1)[0]


def decode_boundary(body: bytes) -> tuple[int, int]:
    if len(body) != _BOUNDARY.size:
        raise RecordError(f"BOUNDARY record of {len(body)} bytes")
    _, index, term = _BOUNDARY.unpack(body)
    return index, term


def decode_entry_fields(body: bytes | memoryview) -> tuple[int, int]:
    """(index, term) of an ENTRY body, without copying its payload."""
    if len(body) < _ENTRY.size:
        raise RecordError("ENTRY record too short")
    _, index, term, type_code = _ENTRY.unpack_from(body)
    if type_code not in _ENTRY_TYPES:
        raise RecordError(f"unknown entry type {type_code}")
    return index, term


def decode_entry(body: bytes | memoryview) -> Entry:
    index, term = decode_entry_fields(body)
    return Entry(index, term, _ENTRY_TYPES[body[_ENTRY.size - 1]], bytes(body[_ENTRY.size:]))


# --- reading records back ---

def read_header(buf: bytes | memoryview, offset: int) -> tuple[int, int, int]:
    """(length, crc, prev_crc) of the record at offset; buf must hold HEADER_SIZE bytes there."""
    return _HEADER.unpack_from(buf, offset)


def checked_body(buf: bytes | memoryview, offset: int) -> memoryview:
    """The body of the record at offset, checked against its own crc (not against the chain):
    what a random read of one entry can verify. RecordError if it fails."""
    length, crc, prev = _HEADER.unpack_from(buf, offset)
    body = memoryview(buf)[offset + HEADER_SIZE: offset + HEADER_SIZE + length]
    if len(body) != length or length == 0:
        raise RecordError(f"record of {length} bytes is cut short")
    if zlib.crc32(body, prev) != crc:
        raise RecordError("checksum mismatch")
    return body


def record_kind(body: bytes | memoryview) -> RecordKind:
    try:
        return RecordKind(body[0])
    except ValueError:
        raise RecordError(f"unknown record kind {body[0]}") from None
