"""A key's version as the state machine stores it: etcd's mvccpb.KeyValue (create and mod
revision, version, lease, value) plus the change's place within its revision, sealed with a
checksum (statemachine/value_checksum.py).

    record = CRC-32 | create_revision | mod_revision | mod_sub | version | lease | value

A version of 0 marks a tombstone: the key was deleted at (mod_revision, mod_sub). Tombstones live
only in the history (statemachine/mvcc.py); the current table holds live keys."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from statemachine.value_checksum import CHECKSUM_BYTES, seal, unseal, verify

_HEADER = struct.Struct(">qqIqq")  # create_revision, mod_revision, mod_sub, version, lease
HEADER_BYTES = _HEADER.size


@dataclass(frozen=True, slots=True)
class KeyVersion:
    """One version of one key. (mod_revision, mod_sub) names the change that wrote it: every
    change of one revision (a transaction's, a batch's) has a sub of its own, as in etcd."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int  # puts since the key was created: 1 on creation; 0 for a tombstone
    lease: int = 0
    mod_sub: int = 0

    @property
    def tombstone(self) -> bool:
        return self.version == 0


def encode(kv: KeyVersion) -> bytes:
    return seal(kv.key, _HEADER.pack(kv.create_revision, kv.mod_revision, kv.mod_sub, kv.version, kv.lease) + kv.value)


def decode(key: bytes, record: bytes) -> KeyVersion:
    """The version stored in `record` under `key`; CorruptStateError when it fails its checksum."""
    value = unseal(key, record, HEADER_BYTES)
    create, mod, sub, version, lease = _HEADER.unpack_from(record, CHECKSUM_BYTES)
    return KeyVersion(key, value, create, mod, version, lease, sub)


def listed(key: bytes, record: bytes, keys_only: bool) -> tuple[int, int, int, int, bytes]:
    """(create_revision, mod_revision, version, lease, value) of a record, checked like `decode`,
    without a KeyVersion: a list's per-key read (statemachine/range_read.py). The value is b""
    when `keys_only`, and a slice of `record` (one copy: reads are made without LMDB buffers)."""
    verify(key, record, HEADER_BYTES)
    create, mod, _, version, lease = _HEADER.unpack_from(record, CHECKSUM_BYTES)
    return create, mod, version, lease, b"" if keys_only else record[CHECKSUM_BYTES + HEADER_BYTES:]


def stored_value(key: bytes, record: bytes) -> bytes:
    """The value alone (the read path of plain gets and scans), checked like `decode`."""
    return unseal(key, record, HEADER_BYTES)


def revisions_of(record: bytes) -> tuple[int, int, int, int, int]:
    """(create_revision, mod_revision, mod_sub, version, lease) of a record, unchecked: the write
    path needs only these to write the next version (the record is checked when it is read)."""
    return _HEADER.unpack_from(record, CHECKSUM_BYTES)


def change_of(record: bytes) -> tuple[int, int]:
    """(mod_revision, mod_sub) of a record, unchecked: where the history files it."""
    _, mod, sub, _, _ = _HEADER.unpack_from(record, CHECKSUM_BYTES)
    return mod, sub
