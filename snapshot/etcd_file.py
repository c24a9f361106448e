"""etcd's snapshot files: a bbolt database (snapshot/bbolt_reader.py) and, as `etcdctl snapshot
save` writes them, the sha256 of the database appended (etcd's Maintenance.Snapshot streams it
last; clientv3/snapshot/v3_snapshot.go). Telling one from a raftkv snapshot by content, checking
the appended sum, and etcdctl's `snapshot status` (hash, revision, keys, size).

A file whose length is 32 past a multiple of 512 carries the sum (etcdctl's own test: a database
is whole pages, pages are whole sectors); any other length is a bare database (etcd's member/snap/db
copied by hand), whose pages are then checked without a sum.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from snapshot.bbolt_format import MAGIC, PAGE_HEADER
from snapshot.bbolt_reader import PAGE_SIZES, BoltFile, open_bolt
from snapshot.errors import SnapshotCorruptError

SHA256_BYTES = 32
SECTOR = 512
BLOCK_SIZE = 1 << 20
_REVISION_MAIN = slice(0, 8)


def is_etcd_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether the file starts as a bbolt database does: page 0, or page 1 at one of the page
    sizes bbolt uses (page 0 may be the damaged one), a meta page with bbolt's magic."""
    with open(path, "rb") as f:
        head = f.read(max(PAGE_SIZES) + PAGE_HEADER.size + 4)
    return any(_meta_magic_at(head, offset) for offset in (0, *PAGE_SIZES))


def _meta_magic_at(head: bytes, offset: int) -> bool:
    at = offset + PAGE_HEADER.size
    return len(head) >= at + 4 and int.from_bytes(head[at:at + 4], "little") == MAGIC


def has_checksum(size: int) -> bool:
    """etcdctl's hasChecksum: the file is the database (whole sectors) and 32 bytes of sha256."""
    return size % SECTOR == SHA256_BYTES


def database_size(path: str | os.PathLike[str]) -> int:
    """The length of the database in the file, after checking the appended sha256 if there is
    one (SnapshotCorruptError when it does not match)."""
    size = os.path.getsize(path)
    if not has_checksum(size):
        return size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        remaining = size - SHA256_BYTES
        while remaining:
            block = f.read(min(BLOCK_SIZE, remaining))
            if not block:
                raise SnapshotCorruptError(f"{path}: truncated while being read")
            digest.update(block)
            remaining -= len(block)
        expected = f.read(SHA256_BYTES)
    if digest.digest() != expected:
        raise SnapshotCorruptError(
            f"{path}: checksum mismatch (sha256 of the database {digest.hexdigest()}, the file's trailer says "
            f"{expected.hex()}): the file is damaged or truncated")
    return size - SHA256_BYTES


def open_etcd_snapshot(path: str | os.PathLike[str]) -> BoltFile:
    """The etcd snapshot at `path`, its sum and every page checked, with etcd's key and meta
    buckets; SnapshotCorruptError says what is wrong otherwise. Close it after use."""
    db = open_bolt(Path(path), database_size(path))
    for name in (b"key", b"meta"):
        if db.bucket(name) is None:
            db.close()
            raise SnapshotCorruptError(f"{path}: a bbolt database but not an etcd snapshot (no {name.decode()!r} bucket)")
    return db


@dataclass(frozen=True, slots=True)
class EtcdStatus:
    """What `etcdctl snapshot status` reports (its JSON's names: hash, revision, totalKey, totalSize)."""

    hash: int
    revision: int
    total_key: int
    total_size: int

    def to_dict(self) -> dict[str, int]:
        return {"hash": self.hash, "revision": self.revision, "totalKey": self.total_key, "totalSize": self.total_size}


def status(db: BoltFile) -> EtcdStatus:
    """etcdctl's `snapshot status` of an open database: CRC-32C over every top-level bucket's name
    and its items' keys and values in order, the main revision of the key bucket's last key, the
    items of all top-level buckets, and the database's size."""
    crc = 0
    revision = 0
    total = 0
    for name, bucket in db.root.buckets():
        crc = crc32c(name, crc)
        for key, value in bucket.items():
            crc = crc32c(value or b"", crc32c(key, crc))
            if name == b"key":
                revision = int.from_bytes(key[_REVISION_MAIN], "big")
            total += 1
    return EtcdStatus(crc, revision, total, db.meta.pgid * db.page_size)


def live_keys(db: BoltFile) -> int:
    """How many keys the store holds at its newest revision: each key's newest version in the key
    bucket (revision order) that is not a tombstone. Tells keys apart by decoding nothing: the
    key is field 1 of mvccpb.KeyValue, the first bytes of every record (tag, length, key)."""
    live: set[bytes] = set()
    bucket = db.bucket(b"key")
    for revision, value in bucket.items() if bucket is not None else ():
        key = _first_field(value or b"")
        if revision.endswith(b"t"):
            live.discard(key)
        else:
            live.add(key)
    return len(live)


def _first_field(record: bytes) -> bytes:
    """The bytes of field 1 (length-delimited) of a protobuf record that starts with it."""
    if not record or record[0] != 0x0A:
        return record
    length, shift, at = 0, 0, 1
    while at < len(record):
        byte = record[at]
        length |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            break
        shift += 7
    return record[at:at + length]


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), continuing `crc`: Go's crc32.MakeTable(crc32.Castagnoli)."""
    crc ^= 0xFFFFFFFF
    table = _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
