"""Reading a bbolt database file (etcd's backend and snapshot) without Go: the meta pages, the
bucket tree (branch, leaf and overflow pages, inline and nested buckets) and the freelist, each
checked as it is read, so that a damaged or truncated file is refused with a message that says
what is wrong instead of yielding wrong data. The format: snapshot/bbolt_format.py and
docs/etcd-snapshot-format.md.

The file is mapped, not read: a bucket is walked page by page and its items are yielded as they
are met, so a database of millions of keys is read in the memory of one page path.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from snapshot.bbolt_format import (
    BRANCH_ELEMENT,
    BRANCH_PAGE,
    BUCKET_HEADER,
    BUCKET_LEAF,
    FREELIST_OVERFLOW_COUNT,
    FREELIST_PAGE,
    LEAF_ELEMENT,
    LEAF_PAGE,
    MAGIC,
    META_BYTES,
    META_PAGE,
    NO_FREELIST,
    PAGE_HEADER,
    PGID,
    Meta,
    decode_meta,
)
from snapshot.errors import SnapshotCorruptError

# Page sizes bbolt may have been written with (the OS page size of the writer's machine).
PAGE_SIZES = (4096, 8192, 16384, 32768, 65536, 1024, 2048)
# A B+tree of 4 KiB pages this deep would hold more keys than any file can: deeper is a cycle.
_MAX_DEPTH = 48


class BoltFile:
    """A bbolt database opened read-only. `size` limits it to the file's first bytes (etcd's
    snapshot appends a sha256 after the database). Use as a context manager."""

    def __init__(self, path: str | os.PathLike[str], size: int | None = None) -> None:
        self.name = str(path)
        with open(path, "rb") as f:
            actual = os.fstat(f.fileno()).st_size
            self.size = actual if size is None else min(size, actual)
            if self.size < PAGE_HEADER.size + META_BYTES:
                raise self.damage(f"truncated: {self.size} bytes cannot hold a bbolt meta page")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf = memoryview(self._map)
        try:
            self.meta = self._choose_meta()
            self.page_size = self.meta.page_size
            need = self.meta.pgid * self.page_size
            if need > self.size:
                raise self.damage(f"truncated: the database has {self.meta.pgid} pages of {self.page_size} bytes "
                                  f"({need} bytes), the file holds {self.size}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._map.closed:
            return
        self._buf.release()
        self._map.close()

    def __enter__(self) -> BoltFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def damage(self, what: str) -> SnapshotCorruptError:
        return SnapshotCorruptError(f"{self.name}: not a valid bbolt database: {what}")

    # ---- meta ----------------------------------------------------------------------------------

    def _choose_meta(self) -> Meta:
        """bbolt's DB.meta(): the valid meta with the higher txid, else the other valid one."""
        meta0 = decode_meta(self._buf, 0)
        problems = [f"meta page 0: {meta0.problem()}" if meta0.problem() else ""]
        sizes = (meta0.page_size,) if meta0.problem() is None else PAGE_SIZES
        meta1 = None
        for page_size in sizes:  # page 1 sits one page in: find it by the page size meta 0 gives
            if page_size <= 0 or page_size + PAGE_HEADER.size + META_BYTES > self.size:
                continue
            candidate = decode_meta(self._buf, page_size)
            if candidate.magic == MAGIC and candidate.page_size == page_size:
                meta1 = candidate
                break
        problems.append("meta page 1: " + (meta1.problem() or "") if meta1 else "meta page 1: not found")
        valid = [m for m in (meta0, meta1) if m is not None and m.problem() is None]
        if not valid:
            problems = [p for p in problems if not p.endswith(": ")]
            raise self.damage("no valid meta page (" + "; ".join(problems) + ")")
        meta = max(valid, key=lambda m: m.txid)
        if meta.page_size < 512 or meta.page_size & (meta.page_size - 1):
            raise self.damage(f"implausible page size {meta.page_size}")
        page = 1 if meta is meta1 else 0
        if not PAGE_HEADER.unpack_from(self._buf, page * meta.page_size)[1] & META_PAGE:
            raise self.damage(f"page {page}, whose meta is the valid one, is not marked a meta page")
        return meta

    # ---- pages -----------------------------------------------------------------------------------

    def page(self, pgid: int, kinds: int) -> tuple[int, int, int]:
        """(offset, flags, count) of page `pgid`, which must be one of `kinds` and lie whole inside
        the database; its span (overflow pages included) is checked too."""
        if pgid < 2 or pgid >= self.meta.pgid:
            raise self.damage(f"a reference to page {pgid}, outside the database's pages 2..{self.meta.pgid - 1}")
        offset = pgid * self.page_size
        page_id, flags, count, overflow = PAGE_HEADER.unpack_from(self._buf, offset)
        if page_id != pgid:
            raise self.damage(f"page {pgid} says it is page {page_id}")
        if not flags & kinds:
            raise self.damage(f"page {pgid} has type {flags:#x}, expected {_kind_names(kinds)}")
        if pgid + overflow >= self.meta.pgid:
            raise self.damage(f"page {pgid} spans {overflow + 1} pages, past the database's end")
        return offset, flags, count

    def span(self, pgid: int) -> int:
        """How many pages page `pgid` covers (1 + its overflow)."""
        return 1 + PAGE_HEADER.unpack_from(self._buf, pgid * self.page_size)[3]

    # ---- buckets ---------------------------------------------------------------------------------

    @property
    def root(self) -> Bucket:
        return Bucket(self, self.meta.root, None, "the root bucket")

    def bucket(self, *names: bytes) -> Bucket | None:
        """The bucket at that path of names (None: absent)."""
        bucket: Bucket | None = self.root
        for name in names:
            bucket = bucket.bucket(name) if bucket is not None else None
        return bucket

    def freelist(self) -> list[int]:
        """The free pages (empty when bbolt did not write its freelist)."""
        if self.meta.freelist == NO_FREELIST:
            return []
        offset, _, count = self.page(self.meta.freelist, FREELIST_PAGE)
        first = offset + PAGE_HEADER.size
        if count == FREELIST_OVERFLOW_COUNT:
            (count,) = PGID.unpack_from(self._buf, first)
            first += PGID.size
        if first + count * PGID.size > offset + self.span(self.meta.freelist) * self.page_size:
            raise self.damage(f"freelist page {self.meta.freelist} claims {count} entries, more than it holds")
        return [PGID.unpack_from(self._buf, first + i * PGID.size)[0] for i in range(count)]

    def check(self) -> None:
        """bbolt's Tx.Check: every page below pgid is a meta page, the freelist, free, or reached
        from the root exactly once; every item of every bucket readable, keys in order."""
        owner: dict[int, str] = {0: "meta", 1: "meta"}

        def claim(first: int, pages: int, what: str) -> None:
            for pgid in range(first, first + pages):
                if pgid in owner:
                    raise self.damage(f"page {pgid} is both {owner[pgid]} and {what}")
                owner[pgid] = what

        if self.meta.freelist != NO_FREELIST:
            claim(self.meta.freelist, self.span(self.meta.freelist), "the freelist")
            for pgid in self.freelist():
                if pgid >= self.meta.pgid:
                    raise self.damage(f"free page {pgid} is past the database's end")
                claim(pgid, 1, "free")
        stack = [self.root]
        while stack:
            bucket = stack.pop()
            for pgid in bucket.pages():
                claim(pgid, self.span(pgid), bucket.what)
            for key, value in bucket.items():
                if value is None:
                    stack.append(bucket.bucket(key))  # type: ignore[arg-type]
        if self.meta.freelist != NO_FREELIST:
            lost = [pgid for pgid in range(self.meta.pgid) if pgid not in owner]
            if lost:
                raise self.damage(f"{len(lost)} pages neither free nor reachable (the first: page {lost[0]})")


class Bucket:
    """One bucket: its tree rooted at a page, or an inline page inside its parent's value."""

    def __init__(self, db: BoltFile, root: int, inline: bytes | None, what: str) -> None:
        self._db = db
        self._root = root
        self._inline = inline
        self.what = what

    def items(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Every (key, value) in key order; value None for a nested bucket (open it with `bucket`)."""
        last: bytes | None = None
        for key, value, flags in self._elements():
            if last is not None and key <= last:
                raise self._db.damage(f"{self.what}: keys out of order ({last[:40]!r} then {key[:40]!r})")
            last = key
            yield key, (None if flags & BUCKET_LEAF else value)

    def bucket(self, name: bytes) -> Bucket | None:
        """The nested bucket `name` (None: no such bucket)."""
        for key, value, flags in self._elements():
            if key == name:
                return self._nested(key, value) if flags & BUCKET_LEAF else None
            if key > name:
                return None
        return None

    def buckets(self) -> Iterator[tuple[bytes, Bucket]]:
        """The nested buckets, by name."""
        for key, value, flags in self._elements():
            if flags & BUCKET_LEAF:
                yield key, self._nested(key, value)

    def pages(self) -> Iterator[int]:
        """The pages of this bucket's own tree (none for an inline bucket)."""
        if self._inline is not None:
            return
        stack = [(self._root, 0)]
        while stack:
            pgid, depth = stack.pop()
            yield pgid
            offset, flags, count = self._db.page(pgid, BRANCH_PAGE | LEAF_PAGE)
            if flags & BRANCH_PAGE:
                stack.extend((child, depth + 1) for _, child in self._branch(pgid, offset, count, depth))

    def _nested(self, key: bytes, value: bytes) -> Bucket:
        what = f"bucket {key[:60]!r}" if self.what == "the root bucket" else f"{self.what}/{key[:60]!r}"
        if len(value) < BUCKET_HEADER.size:
            raise self._db.damage(f"{what}: its header is {len(value)} bytes")
        root, _ = BUCKET_HEADER.unpack_from(value)
        if root == 0:  # inline: a leaf page follows the header inside the value
            page = value[BUCKET_HEADER.size:]
            if len(page) < PAGE_HEADER.size or not PAGE_HEADER.unpack_from(page)[1] & LEAF_PAGE:
                raise self._db.damage(f"{what}: an inline bucket without a leaf page")
            return Bucket(self._db, 0, bytes(page), what)
        return Bucket(self._db, root, None, what)

    def _elements(self) -> Iterator[tuple[bytes, bytes, int]]:
        if self._inline is not None:
            _, _, count, _ = PAGE_HEADER.unpack_from(self._inline)
            yield from _leaf(self._db, memoryview(self._inline), 0, len(self._inline), count, self.what)
            return
        yield from self._walk(self._root, 0)

    def _walk(self, pgid: int, depth: int) -> Iterator[tuple[bytes, bytes, int]]:
        offset, flags, count = self._db.page(pgid, BRANCH_PAGE | LEAF_PAGE)
        if flags & LEAF_PAGE:
            end = offset + self._db.span(pgid) * self._db.page_size
            yield from _leaf(self._db, self._db._buf, offset, end, count, f"{self.what}, page {pgid}")
            return
        for _, child in self._branch(pgid, offset, count, depth):
            yield from self._walk(child, depth + 1)

    def _branch(self, pgid: int, offset: int, count: int, depth: int) -> list[tuple[bytes, int]]:
        db = self._db
        if depth > _MAX_DEPTH:
            raise db.damage(f"{self.what}: the tree is deeper than {_MAX_DEPTH} pages at page {pgid} (a cycle)")
        if count == 0:
            raise db.damage(f"{self.what}: branch page {pgid} has no elements")
        end = offset + db.span(pgid) * db.page_size
        children = []
        for i in range(count):
            at = offset + PAGE_HEADER.size + i * BRANCH_ELEMENT.size
            if at + BRANCH_ELEMENT.size > end:
                raise db.damage(f"{self.what}: branch page {pgid} claims {count} elements, more than it holds")
            pos, ksize, child = BRANCH_ELEMENT.unpack_from(db._buf, at)
            if at + pos + ksize > end:
                raise db.damage(f"{self.what}: branch page {pgid}, element {i}: its key runs past the page")
            children.append((bytes(db._buf[at + pos:at + pos + ksize]), child))
        return children


def _leaf(db: BoltFile, buf: memoryview, offset: int, end: int, count: int,
          where: str) -> Iterator[tuple[bytes, bytes, int]]:
    """The (key, value, flags) of a leaf page at `offset` whose bytes end at `end`."""
    if offset + PAGE_HEADER.size + count * LEAF_ELEMENT.size > end:
        raise db.damage(f"{where}: a leaf page that claims {count} elements, more than it holds")
    for i in range(count):
        at = offset + PAGE_HEADER.size + i * LEAF_ELEMENT.size
        flags, pos, ksize, vsize = LEAF_ELEMENT.unpack_from(buf, at)
        start = at + pos
        if start + ksize + vsize > end:
            raise db.damage(f"{where}, element {i}: its key and value run past the page")
        yield bytes(buf[start:start + ksize]), bytes(buf[start + ksize:start + ksize + vsize]), flags


def _kind_names(kinds: int) -> str:
    names = {BRANCH_PAGE: "branch", LEAF_PAGE: "leaf", META_PAGE: "meta", FREELIST_PAGE: "freelist"}
    return " or ".join(name for bit, name in names.items() if kinds & bit)


def open_bolt(path: str | os.PathLike[str], size: int | None = None) -> BoltFile:
    """A checked BoltFile (`BoltFile.check` run), for a file about to be trusted whole."""
    db = BoltFile(Path(path), size)
    try:
        db.check()
    except BaseException:
        db.close()
        raise
    return db
