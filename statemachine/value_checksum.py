"""Every value is stored with a checksum, so a value changed on the disk after it was written (a
flipped bit, a bad sector, a stray write into the LMDB file) is refused when read instead of
served.

A stored record is a 4-byte CRC-32 (big-endian) of key and body, then the body (for the user's
keys: a key version's revisions and its value, statemachine/key_record.py). The key is in the sum
so that a record that lands under another key is caught too. Sealing or checking a 100-byte value
costs about 0.3 µs here (zlib's CRC-32, in C; 0.5 µs per KiB), against the tens of µs a node
spends on each write or read. A whole-state check across members (kv/server/state_check.py)
catches what a per-value sum cannot: a record that is consistent but wrong (a replica that applied
differently)."""
from __future__ import annotations

import struct
import zlib

from statemachine.errors import CorruptStateError

CHECKSUM_BYTES = 4
_CRC = struct.Struct(">I")


def seal(key: bytes, body: bytes) -> bytes:
    """The record stored for `body` under `key`."""
    return _CRC.pack(zlib.crc32(body, zlib.crc32(key))) + body


def unseal(key: bytes, record: bytes, skip: int = 0) -> bytes:
    """The body in `record`, stored under `key`, less its first `skip` bytes (one copy);
    CorruptStateError when it fails its checksum."""
    verify(key, record, skip)
    return bytes(memoryview(record)[CHECKSUM_BYTES + skip:])


def verify(key: bytes, record: bytes, skip: int = 0) -> None:
    """CorruptStateError unless `record`, stored under `key`, passes its checksum and holds at
    least `skip` bytes of body."""
    if len(record) < CHECKSUM_BYTES + skip or _CRC.unpack_from(record)[0] != zlib.crc32(
            memoryview(record)[CHECKSUM_BYTES:], zlib.crc32(key)):
        raise CorruptStateError(f"the value stored under key {key[:64]!r} fails its checksum: the state on this "
                                "member's disk is damaged")
