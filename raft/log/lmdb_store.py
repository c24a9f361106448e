"""The Raft log on LMDB: a LogStore (raft/core/log_store.py) whose `save` is one fsynced write
transaction, so a Ready's hard state, truncation and many appended entries cost one fsync.

One LMDB environment (a directory) with three named databases:
- entries: index -> entry record (records.py), CRC-checked on every read;
- meta:    format version, hard state, before_begin (index, term);
- runs:    term -> first index of that term in the log (the TermRuns table, kept on disk in the
           same transactions as the entries so that opening a million-entry log reads only it).

The hot-path reads (term, last_index, first/last_index_of_term, hard_state, before_begin) answer
from an immutable in-memory view swapped in after each commit. Writes are serialised by a lock;
reads may come from other threads (LMDB's MVCC keeps a read transaction consistent).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Sequence, TypeVar

import lmdb

from raft.core.types import ENTRY_OVERHEAD, Entry, HardState
from raft.log.errors import LogCorruptionError, LogFullError
from raft.log.log_view import LogView, ViewReads
from raft.log.records import (
    ENTRY_HEADER_SIZE,
    RecordError,
    decode_boundary,
    decode_entry,
    decode_hard_state,
    decode_u64,
    encode_boundary,
    encode_entry,
    encode_hard_state,
    encode_u64,
    index_key,
    key_index,
)
from raft.log.term_runs import TermRuns

_FORMAT_VERSION = 1
_FORMAT_KEY = b"format"
_HARD_STATE_KEY = b"hard_state"
_BOUNDARY_KEY = b"before_begin"
# Entries whose checksum open() verifies, newest first: a torn or bad last write lands there, and
# a few hundred keep open fast for any log length. Older entries are checked when read.
VERIFY_TAIL_ENTRIES = 256
# LMDB's own reports of a damaged file (BadChecksumError only exists in newer py-lmdb).
_LMDB_CORRUPTION: tuple[type[Exception], ...] = tuple(
    getattr(lmdb, name) for name in ("CorruptedError", "PageNotFoundError", "BadChecksumError") if hasattr(lmdb, name)
)

# Extra map space (at least) that compaction may take when appends filled the map.
_MIN_FREEING_HEADROOM = 1 << 20

T = TypeVar("T")


class LmdbLogStore(ViewReads):
    """A LogStore on LMDB. With fsync=True (the default, and the only safe setting) every write
    method returns only once its transaction is on disk; fsync=False is for benchmarks."""

    def __init__(self, path: str | Path, *, map_size: int = 8 << 30, fsync: bool = True) -> None:
        self._path = Path(path)
        self._map_size = map_size
        self._path.mkdir(parents=True, exist_ok=True)
        # writemap off: a stray pointer write cannot reach the file, and sync/metasync give
        # durability at commit.
        try:
            self._env = lmdb.open(
                str(self._path), map_size=map_size, max_dbs=3, sync=fsync, metasync=fsync,
                writemap=False, map_async=False, subdir=True, lock=True,
            )
        except (lmdb.InvalidError, *_LMDB_CORRUPTION) as exc:
            raise LogCorruptionError(str(self._path), f"LMDB cannot open it: {exc}") from exc
        self._write_lock = threading.Lock()
        # Held by every read transaction and by map growth: LMDB may only resize a map while no
        # transaction of this process is open, and reads may come from other threads.
        self._map_lock = threading.Lock()
        self._corruption: LogCorruptionError | None = None
        self._closed = False
        try:
            self._entries_db = self._env.open_db(b"entries")
            self._meta_db = self._env.open_db(b"meta")
            self._runs_db = self._env.open_db(b"runs")
            self._initialise_if_new()
            self._view = self._load()
        except lmdb.MapFullError as exc:
            self._env.close()
            raise LogFullError(str(self._path), f"the {map_size}-byte LMDB map cannot hold a new log") from exc
        except BaseException:
            self._env.close()
            raise

    # --- LogStore reads (hard_state, before_begin, last_index, term, first/last_index_of_term:
    # ViewReads) ---

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        view = self._live()
        if lo <= view.before_index:
            raise IndexError(f"entry {lo} is compacted (log begins after {view.before_index})")
        taken: list[Entry] = []
        if hi <= lo:
            return taken
        size = 0
        with self._reading() as txn:
            cursor = txn.cursor(db=self._entries_db)
            if not cursor.set_key(index_key(lo)):
                self._check_absent_start(txn, lo)
                return taken
            expected = lo
            for key, value in cursor.iternext():
                index = self._index_of(key)
                if index >= hi:
                    break
                if index != expected:
                    raise self._corrupt(f"entry missing: the next stored entry is {index}", expected)
                if max_bytes is not None and taken and size + (len(value) - ENTRY_HEADER_SIZE + ENTRY_OVERHEAD) > max_bytes:
                    break  # sized from the record so the entry past the limit is never decoded
                entry = self._decode(key, value)
                taken.append(entry)
                size += entry.size()
                expected += 1
        return taken

    # --- LogStore writes ---

    def save(self, hard_state: HardState | None, truncate_from: int | None, entries: Sequence[Entry]) -> None:
        """Set the hard state, drop entries >= truncate_from, append entries: one transaction,
        durable on return. Invalid input raises ValueError before anything is written."""
        with self._write_lock:
            view = self._live()
            truncate_from, end, runs = view.plan_save(truncate_from, entries)
            records = [(index_key(e.index), encode_entry(e)) for e in entries]

            def write(txn: lmdb.Transaction) -> None:
                if hard_state is not None:
                    txn.put(_HARD_STATE_KEY, encode_hard_state(hard_state), db=self._meta_db)
                if truncate_from is not None:
                    self._delete_entries(txn, first=truncate_from, last=None)
                if records:
                    # MDB_APPEND: keys follow the (possibly just truncated) end, so LMDB skips the
                    # search and fills pages completely.
                    txn.cursor(db=self._entries_db).putmulti(records, dupdata=False, append=True)
                self._write_runs(txn, view.runs, runs)

            self._commit(write)
            self._view = replace(
                view, hard_state=hard_state if hard_state is not None else view.hard_state,
                last_index=end + len(entries), runs=runs,
            )

    def compact(self, index: int) -> None:
        """Drop entries <= index and make (index, its term) the before_begin point, in one
        transaction so the boundary survives a restart with the entries it replaced."""
        with self._write_lock:
            term = self.term(index)
            if term is None:
                raise ValueError(f"cannot compact at {index}: not in the log")
            self._compact_to(self._live(), index, term)

    def reset_to_snapshot(self, index: int, term: int) -> None:
        """After installing a snapshot at (index, term): keep the tail after it when the log holds
        that entry with that term, otherwise drop every entry. before_begin becomes (index, term)."""
        with self._write_lock:
            view = self._live()
            if self.term(index) == term and index >= view.before_index:
                self._compact_to(view, index, term)
                return

            def write(txn: lmdb.Transaction) -> None:
                txn.drop(self._entries_db, delete=False)
                txn.drop(self._runs_db, delete=False)
                txn.put(_BOUNDARY_KEY, encode_boundary(index, term), db=self._meta_db)

            self._commit_freeing(write)
            self._view = replace(view, before_index=index, before_term=term, last_index=index, runs=TermRuns())

    # --- housekeeping ---

    def size_bytes(self) -> int:
        """Size of the LMDB data file on disk (it grows as pages are used, never shrinks; pages
        freed by compaction are reused)."""
        return (self._path / "data.mdb").stat().st_size

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    def __enter__(self) -> LmdbLogStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        view = self._view
        return f"LmdbLogStore({str(self._path)!r}, entries ({view.before_index}, {view.last_index}])"

    # --- opening ---

    def _initialise_if_new(self) -> None:
        """Write the format marker, an empty hard state and a (0, 0) boundary into a new store,
        so that on every later open each must be present (a missing one is damage, not newness)."""
        with self._reading() as txn:
            if txn.get(_FORMAT_KEY, db=self._meta_db) is not None:
                return
            if txn.stat(self._entries_db)["entries"] or txn.stat(self._meta_db)["entries"]:
                raise self._corrupt("the format marker is missing from a store that holds data")

        def write(txn: lmdb.Transaction) -> None:
            txn.put(_FORMAT_KEY, encode_u64(_FORMAT_VERSION), db=self._meta_db)
            txn.put(_HARD_STATE_KEY, encode_hard_state(HardState()), db=self._meta_db)
            txn.put(_BOUNDARY_KEY, encode_boundary(0, 0), db=self._meta_db)

        self._commit(write)

    def _load(self) -> LogView:
        with self._reading() as txn:
            version = self._meta(txn, _FORMAT_KEY, decode_u64)
            if version != _FORMAT_VERSION:
                raise self._corrupt(f"unknown format version {version} (this build reads {_FORMAT_VERSION})")
            hard_state = self._meta(txn, _HARD_STATE_KEY, decode_hard_state)
            before_index, before_term = self._meta(txn, _BOUNDARY_KEY, decode_boundary)
            runs = self._load_runs(txn)
            last_index = self._check_entries(txn, before_index, runs)
        return LogView(hard_state, before_index, before_term, last_index, runs)

    def _meta(self, txn: lmdb.Transaction, key: bytes, decode: Callable[[bytes], T]) -> T:
        value = txn.get(key, db=self._meta_db)
        if value is None:
            raise self._corrupt(f"the {key.decode()} record is missing")
        try:
            return decode(value)
        except RecordError as exc:
            raise self._corrupt(f"the {key.decode()} record is damaged: {exc}") from None

    def _load_runs(self, txn: lmdb.Transaction) -> TermRuns:
        try:
            pairs = [(key_index(k), decode_u64(v)) for k, v in txn.cursor(db=self._runs_db)]
            return TermRuns.from_pairs(pairs)
        except ValueError as exc:  # RecordError is one
            raise self._corrupt(f"the term-run table is damaged: {exc}") from None

    def _check_entries(self, txn: lmdb.Transaction, before_index: int, runs: TermRuns) -> int:
        """Check the entries agree with the boundary and the run table, and verify the newest
        entries' checksums; return the last index."""
        count = txn.stat(self._entries_db)["entries"]
        if count == 0:
            if runs.terms:
                raise self._corrupt("the term-run table lists terms but the log holds no entries")
            return before_index
        cursor = txn.cursor(db=self._entries_db)
        cursor.first()
        first = self._index_of(cursor.key())
        cursor.last()
        last = self._index_of(cursor.key())
        if first != before_index + 1:
            raise self._corrupt(f"the log begins at {first}, not right after its compaction point {before_index}")
        if last - first + 1 != count:
            raise self._corrupt(f"{count} entries are stored for indexes {first}..{last}: some are missing")
        if not runs.starts or runs.starts[0] != first or runs.starts[-1] > last:
            raise self._corrupt(f"the term-run table does not describe entries {first}..{last}")
        expected = last
        for key, value in cursor.iterprev():
            if expected <= last - VERIFY_TAIL_ENTRIES:
                break
            entry = self._decode(key, value)
            if entry.index != expected:
                raise self._corrupt(f"entry missing: found {entry.index} where {expected} was expected", expected)
            if entry.term != runs.term_at(entry.index):
                raise self._corrupt(f"term {entry.term} disagrees with the term-run table", entry.index)
            expected -= 1
        return last

    # --- helpers ---

    def _live(self) -> LogView:
        """The current view, unless the store was found corrupt: then nothing may be served."""
        if self._corruption is not None:
            c = self._corruption
            raise LogCorruptionError(c.path, c.detail, c.index)
        return self._view

    def _corrupt(self, detail: str, index: int | None = None) -> LogCorruptionError:
        """Record that the store is corrupt (every later call fails too) and return the error."""
        self._corruption = LogCorruptionError(str(self._path), detail, index)
        return self._corruption

    def _decode(self, key: bytes, value: bytes) -> Entry:
        try:
            return decode_entry(key, value)
        except RecordError as exc:
            raise self._corrupt(str(exc), self._index_of(key)) from None

    def _index_of(self, key: bytes) -> int:
        try:
            return key_index(key)
        except RecordError as exc:
            raise self._corrupt(f"bad key {bytes(key)!r}: {exc}") from None

    def _check_absent_start(self, txn: lmdb.Transaction, lo: int) -> None:
        """Entry lo is not stored. Fine past the end; IndexError if a concurrent compaction took it
        (the view was read before this transaction began); otherwise a hole: corruption."""
        if not txn.cursor(db=self._entries_db).set_range(index_key(lo)):
            return
        before_index, _ = self._meta(txn, _BOUNDARY_KEY, decode_boundary)
        if lo <= before_index:
            raise IndexError(f"entry {lo} is compacted (log begins after {before_index})")
        raise self._corrupt("entry missing from the middle of the log", lo)

    def _compact_to(self, view: LogView, index: int, term: int) -> None:
        runs = view.runs.compacted(index, view.last_index)

        def write(txn: lmdb.Transaction) -> None:
            self._delete_entries(txn, first=None, last=index)
            txn.put(_BOUNDARY_KEY, encode_boundary(index, term), db=self._meta_db)
            self._write_runs(txn, view.runs, runs)

        self._commit_freeing(write)
        self._view = replace(view, before_index=index, before_term=term, last_index=max(view.last_index, index), runs=runs)

    def _delete_entries(self, txn: lmdb.Transaction, *, first: int | None, last: int | None) -> None:
        """Delete entries with first <= index <= last (None: unbounded on that side)."""
        cursor = txn.cursor(db=self._entries_db)
        positioned = cursor.first() if first is None else cursor.set_range(index_key(first))
        if not positioned:
            return
        stop = None if last is None else index_key(last)
        # A deleted cursor moves to the next record; key() is empty once none is left.
        while cursor.key() and (stop is None or cursor.key() <= stop):
            cursor.delete()

    def _write_runs(self, txn: lmdb.Transaction, old: TermRuns, new: TermRuns) -> None:
        if new is old:
            return
        old_pairs, new_pairs = old.pairs(), new.pairs()
        for term, _ in old_pairs - new_pairs:  # deletes first: a re-started term is put back below
            txn.delete(index_key(term), db=self._runs_db)
        for term, start in new_pairs - old_pairs:
            txn.put(index_key(term), encode_u64(start), db=self._runs_db)

    def _commit(self, write: Callable[[lmdb.Transaction], None]) -> None:
        """Run write in one write transaction and commit it (durably when fsync is on). A full map
        or disk aborts the whole transaction and raises LogFullError; the view is left as it was."""
        try:
            with self._env.begin(write=True) as txn:
                write(txn)
        except lmdb.MapFullError as exc:
            raise LogFullError(str(self._path), f"the LMDB map of {self._map_size} bytes is full") from exc
        except lmdb.DiskError as exc:
            raise LogFullError(str(self._path), "no space left on the device") from exc
        except _LMDB_CORRUPTION as exc:
            raise self._corrupt(f"LMDB reports damage: {exc}") from exc

    def _commit_freeing(self, write: Callable[[lmdb.Transaction], None]) -> None:
        """Commit a write that frees space (compaction, reset). Even deleting needs a few fresh
        pages in LMDB (copy-on-write), so a map that appends filled to the brim would leave the
        log unable to shrink: grow the map by a small headroom once and retry."""
        try:
            self._commit(write)
        except LogFullError:
            if not self._grow_map():
                raise
            self._commit(write)

    def _grow_map(self) -> bool:
        headroom = max(self._map_size // 64, _MIN_FREEING_HEADROOM)
        with self._map_lock:  # writers are already excluded: the caller holds the write lock
            try:
                self._env.set_mapsize(self._env.info()["map_size"] + headroom)
            except lmdb.Error:
                return False
        return True

    @contextmanager
    def _reading(self) -> Iterator[lmdb.Transaction]:
        try:
            with self._map_lock, self._env.begin(write=False, buffers=False) as txn:
                yield txn
        except _LMDB_CORRUPTION as exc:
            raise self._corrupt(f"LMDB reports damage: {exc}") from exc
