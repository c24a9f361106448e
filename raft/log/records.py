"""How the LMDB log store lays out its records on disk. Every record carries a CRC32, so a
flipped bit is caught when the record is read rather than served or replicated.

- entry: key = index (8-byte big-endian, so LMDB's key order is log order);
  value = term (u64) | type (u8) | crc32(key | term | type | payload) (u32) | payload.
- meta and run-table values: crc32(body) (u32) | body.
"""
from __future__ import annotations

import struct
import zlib

from raft.core.types import Entry, EntryType, HardState

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_TERM_TYPE = struct.Struct(">QB")
_BOUNDARY = struct.Struct(">QQ")
ENTRY_HEADER_SIZE = _TERM_TYPE.size + _U32.size

_ENTRY_TYPES = {t.value: t for t in EntryType}  # a dict lookup: EntryType(code) is slow on the read path

_NO_VOTE = b"\x00"
_VOTE = b"\x01"


class RecordError(ValueError):
    """A stored record does not decode: wrong length, checksum mismatch or an unknown value."""


def index_key(index: int) -> bytes:
    """The LMDB key of an entry index or a term (both are u64)."""
    return _U64.pack(index)


def key_index(key: bytes) -> int:
    if len(key) != _U64.size:
        raise RecordError(f"key of {len(key)} bytes where 8 were expected")
    return _U64.unpack(key)[0]


# --- entries ---

def encode_entry(entry: Entry) -> bytes:
    head = _TERM_TYPE.pack(entry.term, entry.type)
    crc = zlib.crc32(entry.payload, zlib.crc32(index_key(entry.index) + head))
    return head + _U32.pack(crc) + entry.payload


def decode_entry(key: bytes, value: bytes) -> Entry:
    """The entry stored under key; RecordError unless its checksum (which covers the index, so a
    record under the wrong key fails too) matches."""
    index = key_index(key)
    if len(value) < ENTRY_HEADER_SIZE:
        raise RecordError(f"record of {len(value)} bytes is shorter than the {ENTRY_HEADER_SIZE}-byte header")
    term, type_code = _TERM_TYPE.unpack_from(value)
    (crc,) = _U32.unpack_from(value, _TERM_TYPE.size)
    payload = bytes(value[ENTRY_HEADER_SIZE:])
    if zlib.crc32(payload, zlib.crc32(bytes(key) + bytes(value[: _TERM_TYPE.size]))) != crc:
        raise RecordError("checksum mismatch")
    entry_type = _ENTRY_TYPES.get(type_code)
    if entry_type is None:
        raise RecordError(f"unknown entry type {type_code}")
    return Entry(index, term, entry_type, payload)


# --- checksummed small values (meta, run table) ---

def _seal(body: bytes) -> bytes:
    return _U32.pack(zlib.crc32(body)) + body


def _unseal(value: bytes) -> bytes:
    if len(value) < _U32.size:
        raise RecordError(f"record of {len(value)} bytes has no checksum")
    body = bytes(value[_U32.size:])
    if zlib.crc32(body) != _U32.unpack_from(value)[0]:
        raise RecordError("checksum mismatch")
    return body


def encode_u64(value: int) -> bytes:
    return _seal(_U64.pack(value))


def decode_u64(value: bytes) -> int:
    body = _unseal(value)
    if len(body) != _U64.size:
        raise RecordError(f"expected 8 bytes, found {len(body)}")
    return _U64.unpack(body)[0]


def encode_hard_state(hard_state: HardState) -> bytes:
    vote = _NO_VOTE if hard_state.voted_for is None else _VOTE + hard_state.voted_for.encode()
    return _seal(_U64.pack(hard_state.term) + vote)


def decode_hard_state(value: bytes) -> HardState:
    body = _unseal(value)
    if len(body) < _U64.size + 1 or body[_U64.size : _U64.size + 1] not in (_NO_VOTE, _VOTE):
        raise RecordError("malformed hard state")
    term = _U64.unpack_from(body)[0]
    if body[_U64.size : _U64.size + 1] == _NO_VOTE:
        return HardState(term, None)
    try:
        return HardState(term, body[_U64.size + 1 :].decode())
    except UnicodeDecodeError:
        raise RecordError("voted_for is not UTF-8") from None


def encode_boundary(index: int, term: int) -> bytes:
    return _seal(_BOUNDARY.pack(index, term))


def decode_boundary(value: bytes) -> tuple[int, int]:
    body = _unseal(value)
    if len(body) != _BOUNDARY.size:
        raise RecordError(f"expected {_BOUNDARY.size} bytes, found {len(body)}")
    index, term = _BOUNDARY.unpack(body)
    return index, term
