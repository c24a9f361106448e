"""bbolt's on-disk format (go.etcd.io/bbolt, page.go, db.go, bucket.go), the part its reader and
writer share: page and element headers, the meta page and its checksum, the bucket header.

A bbolt file is an array of pages of one size (the meta's page_size, 4096 on etcd's machines).
Every page starts with a 16-byte header; all integers are little-endian:

    page header    id u64 | flags u16 | count u16 | overflow u32
    meta           magic u32 | version u32 | page_size u32 | flags u32 | root bucket (root u64,
                   sequence u64) | freelist u64 | pgid u64 (pages in use) | txid u64 | checksum u64
    branch element pos u32 | ksize u32 | child pgid u64      (the key at the element + pos)
    leaf element   flags u32 | pos u32 | ksize u32 | vsize u32  (key, then value, at element + pos)
    bucket header  root pgid u64 | sequence u64              (a bucket's value; root 0: inline)

Pages 0 and 1 are meta pages; a reader takes the valid one with the higher txid. A page of
`overflow` N spans N + 1 pages. The whole description is docs/etcd-snapshot-format.md.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0xED0CDAED
VERSION = 2
NO_FREELIST = 0xFFFF_FFFF_FFFF_FFFF  # the meta's freelist when the freelist is not written

BRANCH_PAGE, LEAF_PAGE, META_PAGE, FREELIST_PAGE = 0x01, 0x02, 0x04, 0x10
BUCKET_LEAF = 0x01  # a leaf element whose value is a bucket (header, and an inline page if root 0)

PAGE_HEADER = struct.Struct("<QHHI")
BRANCH_ELEMENT = struct.Struct("<IIQ")
LEAF_ELEMENT = struct.Struct("<IIII")
BUCKET_HEADER = struct.Struct("<QQ")
_META = struct.Struct("<IIII QQ QQQ")  # the meta's fields before its checksum
_CHECKSUM = struct.Struct("<Q")
META_BYTES = _META.size + _CHECKSUM.size
PGID = struct.Struct("<Q")
FREELIST_OVERFLOW_COUNT = 0xFFFF  # a freelist page's count when the real count is its first u64

_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv64a(data: bytes) -> int:
    """FNV-1a, 64 bits: bbolt's meta checksum (Go's hash/fnv New64a)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
    return h


@dataclass(frozen=True, slots=True)
class Meta:
    """One meta page's fields."""

    page_size: int
    root: int  # the root bucket's page
    freelist: int
    pgid: int  # pages in use: the file holds at least pgid * page_size bytes
    txid: int
    flags: int = 0
    sequence: int = 0
    magic: int = MAGIC
    version: int = VERSION
    checksum: int | None = None  # as read; None: computed when encoded

    def fields(self) -> bytes:
        return _META.pack(self.magic, self.version, self.page_size, self.flags, self.root, self.sequence,
                          self.freelist, self.pgid, self.txid)

    def encode(self) -> bytes:
        fields = self.fields()
        return fields + _CHECKSUM.pack(fnv64a(fields))

    def problem(self) -> str | None:
        """Why bbolt would refuse this meta (meta.validate), or None."""
        if self.magic != MAGIC:
            return f"bad magic {self.magic:#x}"
        if self.version != VERSION:
            return f"version {self.version} (bbolt writes {VERSION})"
        if self.checksum != 0 and self.checksum != fnv64a(self.fields()):
            return "checksum mismatch"
        return None


def decode_meta(buf: bytes | memoryview, offset: int) -> Meta:
    """The meta stored after the page header of the page at `offset`."""
    at = offset + PAGE_HEADER.size
    magic, version, page_size, flags, root, sequence, freelist, pgid, txid = _META.unpack_from(buf, at)
    (checksum,) = _CHECKSUM.unpack_from(buf, at + _META.size)
    return Meta(page_size, root, freelist, pgid, txid, flags, sequence, magic, version, checksum)


def meta_page(page_id: int, meta: Meta) -> bytes:
    """A whole meta page (header + meta), padded to the page size."""
    page = PAGE_HEADER.pack(page_id, META_PAGE, 0, 0) + meta.encode()
    return page + bytes(meta.page_size - len(page))
