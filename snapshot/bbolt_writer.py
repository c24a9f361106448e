"""Writing a bbolt database file without Go: what etcd's Maintenance.Snapshot on raftkv streams
(kv/server/etcd_backup.py), a file etcd's bbolt opens, checks and writes to as its own.

The file is written in one pass, bottom-up: each bucket's items, in key order, fill leaf pages
(an item larger than a page gets a page with overflow), the first key of each page goes into the
branch pages above them, level by level, until one page is the root. A bucket whose items take
at most a quarter of a page is written inline in its parent, as bbolt writes a small bucket.
Then the root bucket (the top-level buckets by name), an empty freelist page, and the two meta
pages at the front (txid 2 and 1, as Tx.WriteTo writes a copy). Every page below the meta's pgid
is a meta page, the freelist, or reachable exactly once: bbolt's Tx.Check passes.

Only the first keys of the pages of one level are held in memory, never a bucket's items.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import BinaryIO

from snapshot.bbolt_format import (
    BRANCH_ELEMENT,
    BRANCH_PAGE,
    BUCKET_HEADER,
    BUCKET_LEAF,
    FREELIST_PAGE,
    LEAF_ELEMENT,
    LEAF_PAGE,
    PAGE_HEADER,
    Meta,
    meta_page,
)

DEFAULT_PAGE_SIZE = 4096

Item = tuple[bytes, bytes, int]  # key, value, leaf element flags
# A bucket's value: bytes, or a nested bucket's pairs (key order) or mapping.
BucketValue = bytes | Iterable[tuple[bytes, "BucketValue"]] | Mapping[bytes, "BucketValue"]


class _Pages:
    """Pages appended to the file from page 2 on (0 and 1, the metas, are written last)."""

    def __init__(self, out: BinaryIO, page_size: int) -> None:
        self.out = out
        self.page_size = page_size
        self.next = 2
        out.write(bytes(2 * page_size))

    def write(self, flags: int, count: int, body: bytes) -> int:
        """Append a page of `flags` holding `count` elements (`body`: after the header); its id."""
        pgid = self.next
        size = PAGE_HEADER.size + len(body)
        span = -(-size // self.page_size)
        self.out.write(PAGE_HEADER.pack(pgid, flags, count, span - 1))
        self.out.write(body)
        self.out.write(bytes(span * self.page_size - size))
        self.next += span
        return pgid


def write_bolt(out: BinaryIO, buckets: Mapping[bytes, Iterable[tuple[bytes, BucketValue]]],
               page_size: int = DEFAULT_PAGE_SIZE) -> int:
    """Write a bbolt database holding `buckets` (name -> its (key, value) pairs in key order, each
    key once; a value that is not bytes is a nested bucket) to `out`, a new file positioned at its
    start. Returns the database's size in bytes. Raises ValueError for keys out of order or empty."""
    pages = _Pages(out, page_size)
    root_items = [(name, _bucket(pages, name, buckets[name]), BUCKET_LEAF) for name in sorted(buckets)]
    root = _tree(pages, iter(root_items), b"the root bucket")
    freelist = pages.write(FREELIST_PAGE, 0, b"")
    meta = Meta(page_size=page_size, root=root, freelist=freelist, pgid=pages.next, txid=2)
    end = out.tell()
    out.seek(0)
    out.write(meta_page(0, meta))
    out.write(meta_page(1, Meta(page_size=page_size, root=root, freelist=freelist, pgid=pages.next, txid=1)))
    out.seek(end)
    return pages.next * page_size


def _bucket(pages: _Pages, name: bytes, pairs: Iterable[tuple[bytes, BucketValue]]) -> bytes:
    """A bucket's value in its parent: the header, and the items inline when they are few and
    none is a bucket (bucket.go's inlineable)."""
    items = (_item(pages, key, value) for key, value in pairs)
    limit = pages.page_size // 4  # bbolt's maxInlineBucketSize
    head: list[Item] = []
    size = PAGE_HEADER.size
    for item in items:
        head.append(item)
        size += LEAF_ELEMENT.size + len(item[0]) + len(item[1])
        if size > limit or item[2] & BUCKET_LEAF:
            return BUCKET_HEADER.pack(_tree(pages, itertools.chain(head, items), name), 0)
    _check_order(head, name)
    return BUCKET_HEADER.pack(0, 0) + PAGE_HEADER.pack(0, LEAF_PAGE, len(head), 0) + _leaf_body(head)


def _item(pages: _Pages, key: bytes, value: BucketValue) -> Item:
    """A leaf item: a value, or a nested bucket (a mapping or iterable of its own pairs) written
    first, its pages before its parent's."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return key, bytes(value), 0
    pairs = sorted(value.items()) if isinstance(value, Mapping) else value
    return key, _bucket(pages, key, pairs), BUCKET_LEAF


def _tree(pages: _Pages, items: Iterator[Item], name: bytes) -> int:
    """Write a B+tree of `items` (in key order); its root page."""
    level = list(_pack(pages, _ordered(items, name), LEAF_PAGE, LEAF_ELEMENT.size, _leaf_body))
    if not level:
        return pages.write(LEAF_PAGE, 0, b"")  # an empty bucket too big to inline: never, but valid
    while len(level) > 1:
        children = ((key, b"", pgid) for key, pgid in level)
        level = list(_pack(pages, children, BRANCH_PAGE, BRANCH_ELEMENT.size, _branch_body))
    return level[0][1]


def _pack(pages: _Pages, elements: Iterable[tuple[bytes, bytes, int]], flags: int, element_size: int,
          body: object) -> Iterator[tuple[bytes, int]]:
    """Fill pages of `flags` with `elements`, as many as fit a page (at least one: a larger one
    gets overflow pages); yields (first key, page id) of each page written."""
    batch: list[tuple[bytes, bytes, int]] = []
    size = PAGE_HEADER.size
    for element in elements:
        need = element_size + len(element[0]) + len(element[1])
        if batch and size + need > pages.page_size:
            yield batch[0][0], pages.write(flags, len(batch), body(batch))  # type: ignore[operator]
            batch, size = [], PAGE_HEADER.size
        batch.append(element)
        size += need
    if batch:
        yield batch[0][0], pages.write(flags, len(batch), body(batch))  # type: ignore[operator]


def _leaf_body(items: list[Item]) -> bytes:
    """Leaf elements, then each key and value; an element's pos counts from the element itself."""
    elements = bytearray()
    data = bytearray()
    for i, (key, value, flags) in enumerate(items):
        pos = (len(items) - i) * LEAF_ELEMENT.size + len(data)
        elements += LEAF_ELEMENT.pack(flags, pos, len(key), len(value))
        data += key
        data += value
    return bytes(elements + data)


def _branch_body(children: list[tuple[bytes, bytes, int]]) -> bytes:
    elements = bytearray()
    data = bytearray()
    for i, (key, _, pgid) in enumerate(children):
        pos = (len(children) - i) * BRANCH_ELEMENT.size + len(data)
        elements += BRANCH_ELEMENT.pack(pos, len(key), pgid)
        data += key
    return bytes(elements + data)


def _ordered(items: Iterator[Item], name: bytes) -> Iterator[Item]:
    last: bytes | None = None
    for item in items:
        key = item[0]
        if not key or (last is not None and key <= last):
            raise ValueError(f"bucket {name[:60]!r}: keys must be non-empty and strictly ascending "
                             f"({last!r:.60} then {key!r:.60})")
        last = key
        yield item


def _check_order(items: list[Item], name: bytes) -> None:
    for _ in _ordered(iter(items), name):
        pass
