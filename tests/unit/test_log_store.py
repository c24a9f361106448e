"""One conformance suite for every LogStore (the in-memory one the simulator uses, the write-ahead
log nodes run on by default, the same reopened after every write so that each test also checks
its replay, and the LMDB one), then what only the LMDB store promises: durability across reopen,
checksums, a full map, and opening a large log quickly. The write-ahead log's own promises are in
test_wal_store.py."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest

from raft.core.log_store import LogStore, MemoryLogStore
from raft.core.types import Entry, EntryType, HardState
from raft.log import LmdbLogStore, LogCorruptionError, LogFullError, WalLogStore
from raft.log.lmdb_store import VERIFY_TAIL_ENTRIES
from raft.log.records import index_key


def run(first: int, terms: list[int], payload_size: int | None = None) -> list[Entry]:
    """Entries first, first+1, ... with the given terms; payloads name their index."""
    return [
        Entry(first + k, t, EntryType.NOOP if (first + k) % 5 == 1 else EntryType.NORMAL,
              b"p" * payload_size if payload_size is not None else f"entry-{first + k}".encode())
        for k, t in enumerate(terms)
    ]


class ReopeningWal:
    """A WalLogStore with small segments, closed and opened again after every write: whatever a
    test then reads comes from the replay of what is on disk."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._store = self._open()

    def _open(self) -> WalLogStore:
        return WalLogStore(self._path, segment_bytes=64 << 10, fsync=False)

    def _reopen(self) -> None:
        self._store.close()
        self._store = self._open()

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self._store, name)
        if name not in ("save", "compact", "reset_to_snapshot"):
            return attribute

        def write_then_reopen(*args: object) -> None:
            try:
                attribute(*args)
            finally:
                self._reopen()
        return write_then_reopen

    def close(self) -> None:
        self._store.close()


@pytest.fixture(params=["memory", "wal", "wal-reopened", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    if request.param == "memory":
        yield MemoryLogStore()
        return
    disk_store: WalLogStore | LmdbLogStore | ReopeningWal
    if request.param == "wal":
        disk_store = WalLogStore(tmp_path / "wal")
    elif request.param == "wal-reopened":
        disk_store = ReopeningWal(tmp_path / "wal")
    else:
        disk_store = LmdbLogStore(tmp_path / "log")
    yield disk_store  # type: ignore[misc]
    disk_store.close()


# --- conformance: every LogStore ---

def test_new_store_is_empty(store: LogStore) -> None:
    assert store.hard_state() == HardState()
    assert store.before_begin() == (0, 0)
    assert store.last_index() == 0
    assert store.term(0) == 0
    assert store.term(1) is None
    assert store.entries(1, 10) == []
    assert store.first_index_of_term(1) is None
    assert store.last_index_of_term(1) is None


def test_append_and_read(store: LogStore) -> None:
    written = run(1, [1, 1, 2, 2, 2])
    store.save(HardState(2, "n2"), None, written)
    assert store.hard_state() == HardState(2, "n2")
    assert store.last_index() == 5
    assert store.entries(1, 6) == written
    assert store.entries(2, 4) == written[1:3]
    assert store.entries(4, 100) == written[3:]  # hi past the end is clamped
    assert store.entries(6, 10) == []
    assert store.entries(3, 3) == []
    assert [store.term(i) for i in range(0, 7)] == [0, 1, 1, 2, 2, 2, None]
    store.save(None, None, run(6, [3]))  # no hard state: the old one stays
    assert store.hard_state() == HardState(2, "n2")
    assert store.last_index() == 6


def test_hard_state_without_vote_and_with_empty_batch(store: LogStore) -> None:
    store.save(HardState(7, None), None, [])
    assert store.hard_state() == HardState(7, None)
    assert store.last_index() == 0


def test_truncate_suffix(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2]))
    store.save(None, 4, run(4, [3, 3]))
    assert [store.term(i) for i in range(1, 6)] == [1, 1, 2, 3, 3]
    assert store.entries(4, 6) == run(4, [3, 3])
    store.save(None, 5, [])  # truncation alone
    assert store.last_index() == 4
    assert store.term(5) is None
    store.save(None, 99, run(5, [3]))  # past the end: nothing to drop
    assert store.last_index() == 5


def test_non_contiguous_appends_are_refused(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 1]))
    with pytest.raises(ValueError):
        store.save(None, None, run(5, [1]))  # gap
    with pytest.raises(ValueError):
        store.save(None, None, run(3, [1]))  # overlap without truncation
    assert store.last_index() == 3
    assert store.entries(1, 4) == run(1, [1, 1, 1])


def test_a_refused_save_changes_nothing(store: LogStore) -> None:
    """The protocol's save is one transaction: a refused one must leave no part behind."""
    store.save(HardState(1), None, run(1, [1, 1, 1]))
    with pytest.raises(ValueError):
        store.save(HardState(9, "n9"), 2, run(3, [2]))  # must follow the truncation point
    with pytest.raises(ValueError):
        store.save(None, None, run(4, [2]) + run(6, [2]))  # the second entry leaves a gap
    assert store.hard_state() == HardState(1)
    assert store.entries(1, 10) == run(1, [1, 1, 1])


def test_compact(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2, 3, 3, 3, 3, 3]))
    store.compact(4)
    assert store.before_begin() == (4, 2)
    assert store.term(4) == 2  # the boundary keeps its term
    assert store.term(3) is None
    assert store.last_index() == 10
    assert store.entries(5, 11) == run(5, [2, 3, 3, 3, 3, 3])
    with pytest.raises(IndexError):
        store.entries(4, 11)
    with pytest.raises(ValueError):
        store.compact(3)  # already compacted
    with pytest.raises(ValueError):
        store.compact(11)  # not in the log
    with pytest.raises(ValueError):
        store.save(None, 4, [])  # cannot truncate into the snapshot
    store.compact(10)  # the whole log
    assert store.before_begin() == (10, 3)
    assert store.last_index() == 10
    assert store.term(10) == 3
    assert store.entries(11, 20) == []
    store.save(None, None, run(11, [4]))
    assert store.entries(11, 12) == run(11, [4])


def test_reset_to_snapshot_keeps_a_matching_tail(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2, 3, 3, 3, 3, 3]))
    store.reset_to_snapshot(7, 3)
    assert store.before_begin() == (7, 3)
    assert store.last_index() == 10
    assert store.entries(8, 11) == run(8, [3, 3, 3])
    assert store.term(7) == 3 and store.term(6) is None


def test_reset_to_snapshot_drops_a_non_matching_log(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2, 3, 3, 3, 3, 3]))
    store.reset_to_snapshot(7, 4)  # our entry 7 has term 3: the whole log is stale
    assert store.before_begin() == (7, 4)
    assert store.last_index() == 7
    assert store.term(7) == 4
    assert store.term(8) is None
    assert store.entries(8, 11) == []
    assert store.first_index_of_term(3) is None
    store.save(None, None, run(8, [4, 5]))
    assert store.entries(8, 10) == run(8, [4, 5])


def test_reset_to_snapshot_past_the_end(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2]))
    store.reset_to_snapshot(20, 5)
    assert store.before_begin() == (20, 5)
    assert store.last_index() == 20
    assert store.term(3) is None
    store.save(None, None, run(21, [5]))
    assert store.last_index() == 21


def test_term_runs(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2, 5, 5, 7]))
    assert [store.first_index_of_term(t) for t in (1, 2, 5, 7)] == [1, 3, 6, 8]
    assert [store.last_index_of_term(t) for t in (1, 2, 5, 7)] == [2, 5, 7, 8]
    for missing in (0, 3, 4, 6, 8):
        assert store.first_index_of_term(missing) is None
        assert store.last_index_of_term(missing) is None


def test_term_runs_across_truncations(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2, 5, 5, 7]))
    store.save(None, 5, run(5, [2, 6]))  # term 2 grows back by one, 5 and 7 vanish, 6 appears
    assert store.last_index() == 6
    assert store.first_index_of_term(2) == 3 and store.last_index_of_term(2) == 5
    assert store.first_index_of_term(6) == 6 and store.last_index_of_term(6) == 6
    assert store.first_index_of_term(5) is None and store.last_index_of_term(7) is None
    store.save(None, 3, run(3, [3, 3]))  # a whole run replaced from its first index
    assert store.first_index_of_term(2) is None
    assert (store.first_index_of_term(3), store.last_index_of_term(3)) == (3, 4)
    store.save(None, None, run(5, [3]))  # appending in the same term extends the run
    assert store.last_index_of_term(3) == 5


def test_term_runs_across_compactions(store: LogStore) -> None:
    store.save(None, None, run(1, [1, 1, 2, 2, 2, 3, 3]))
    store.compact(3)  # inside term 2's run: the boundary is the first index we still know
    assert store.first_index_of_term(2) == 3
    assert store.last_index_of_term(2) == 5
    assert store.first_index_of_term(1) is None and store.last_index_of_term(1) is None
    store.compact(5)  # term 2 lives on only as the boundary
    assert (store.first_index_of_term(2), store.last_index_of_term(2)) == (5, 5)
    assert (store.first_index_of_term(3), store.last_index_of_term(3)) == (6, 7)
    store.compact(6)  # inside term 3: its run continues after the boundary
    assert (store.first_index_of_term(3), store.last_index_of_term(3)) == (6, 7)
    assert store.first_index_of_term(2) is None
    store.compact(7)  # empty log: the boundary alone answers
    assert (store.first_index_of_term(3), store.last_index_of_term(3)) == (7, 7)
    store.save(None, None, run(8, [4]))
    assert (store.first_index_of_term(3), store.last_index_of_term(3)) == (7, 7)
    assert (store.first_index_of_term(4), store.last_index_of_term(4)) == (8, 8)


def test_max_bytes_batching(store: LogStore) -> None:
    written = run(1, [1] * 5, payload_size=100)  # 124 bytes each by Entry.size()
    store.save(None, None, written)
    assert store.entries(1, 6, max_bytes=None) == written
    assert store.entries(1, 6, max_bytes=300) == written[:2]
    assert store.entries(1, 6, max_bytes=248) == written[:2]  # exactly full
    assert store.entries(1, 6, max_bytes=247) == written[:1]
    assert store.entries(2, 6, max_bytes=0) == written[1:2]  # at least one entry
    assert store.entries(1, 6, max_bytes=10_000) == written


# --- LMDB only ---

def fill(path: Path, count: int, **kwargs: object) -> None:
    with LmdbLogStore(path, **kwargs) as s:  # type: ignore[arg-type]
        s.save(HardState(3, "n1"), None, run(1, [1] * (count // 2) + [2] * (count - count // 2)))


def rewrite_raw(path: Path, db_name: bytes, key: bytes, change: Callable[[bytes], bytes | None]) -> None:
    """Change one stored value with the lmdb module directly, as disk damage would."""
    env = lmdb.open(str(path), max_dbs=3)
    try:
        db = env.open_db(db_name)
        with env.begin(write=True, db=db) as txn:
            new = change(txn.get(key))
            if new is None:
                txn.delete(key)
            else:
                txn.put(key, new)
    finally:
        env.close()


def flip_last_byte(value: bytes) -> bytes:
    return value[:-1] + bytes([value[-1] ^ 0x01])


def test_lmdb_everything_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with LmdbLogStore(path) as s:
        s.save(HardState(5, "n3"), None, run(1, [1, 1, 2, 2, 3, 3, 3, 4]))
        s.save(None, 8, run(8, [3, 5]))
        s.compact(3)
    with LmdbLogStore(path) as s:
        assert s.hard_state() == HardState(5, "n3")
        assert s.before_begin() == (3, 2)
        assert s.last_index() == 9
        assert s.entries(4, 10) == run(4, [2, 3, 3, 3, 3, 5])
        assert s.term(3) == 2
        assert (s.first_index_of_term(2), s.last_index_of_term(2)) == (3, 4)
        assert (s.first_index_of_term(3), s.last_index_of_term(3)) == (5, 8)
        s.save(HardState(6, None), None, run(10, [6]))
        s.reset_to_snapshot(10, 7)  # non-matching: log emptied, boundary (10, 7)
    with LmdbLogStore(path) as s:
        assert s.hard_state() == HardState(6, None)
        assert s.before_begin() == (10, 7)
        assert s.last_index() == 10
        assert s.term(10) == 7 and s.term(9) is None
        assert s.first_index_of_term(7) == 10


def test_lmdb_refuses_decreasing_terms(tmp_path: Path) -> None:
    """Its term-run table relies on terms never decreasing along a log."""
    with LmdbLogStore(tmp_path / "log") as s:
        s.save(HardState(1), None, run(1, [1, 2]))
        with pytest.raises(ValueError):
            s.save(None, None, run(3, [2, 1]))
        with pytest.raises(ValueError):
            s.save(None, None, run(3, [1]))
        assert s.entries(1, 10) == run(1, [1, 2])


def test_lmdb_flipped_byte_is_detected_on_read(tmp_path: Path) -> None:
    path = tmp_path / "log"
    fill(path, VERIFY_TAIL_ENTRIES + 50)  # entry 3 lies outside the tail checked on open
    rewrite_raw(path, b"entries", index_key(3), flip_last_byte)
    with LmdbLogStore(path) as s:
        assert s.entries(4, 6) == s.entries(4, 6)  # undamaged entries still read
        with pytest.raises(LogCorruptionError) as info:
            s.entries(1, 10)
        assert info.value.index == 3
        assert str(path) in str(info.value) and "entry 3" in str(info.value)
        with pytest.raises(LogCorruptionError):  # once found corrupt, nothing is served
            s.term(4)


@pytest.mark.parametrize(
    ("db_name", "key", "change"),
    [
        (b"entries", index_key(20), flip_last_byte),  # payload of the newest entry
        (b"entries", index_key(15), lambda v: bytes([v[0] ^ 0x80]) + v[1:]),  # its term
        (b"entries", index_key(10), lambda v: None),  # a hole in the log
        (b"meta", b"hard_state", flip_last_byte),
        (b"meta", b"before_begin", flip_last_byte),
        (b"runs", index_key(2), lambda v: None),  # the term-run table lost a term
    ],
    ids=["entry-payload", "entry-term", "missing-entry", "hard-state", "boundary", "run-table"],
)
def test_lmdb_damage_is_detected_on_open(
    tmp_path: Path, db_name: bytes, key: bytes, change: Callable[[bytes], bytes | None]
) -> None:
    path = tmp_path / "log"
    fill(path, 20)
    rewrite_raw(path, db_name, key, change)
    with pytest.raises(LogCorruptionError) as info:
        LmdbLogStore(path)
    message = str(info.value)
    assert str(path) in message and "remove its data directory" in message


def test_lmdb_garbage_file_is_reported_as_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"not an lmdb file" * 4096)
    with pytest.raises(LogCorruptionError, match="remove its data directory"):
        LmdbLogStore(path)


def test_lmdb_full_map_raises_log_full_and_reads_still_work(tmp_path: Path) -> None:
    with LmdbLogStore(tmp_path / "log", map_size=1 << 20) as s:
        s.save(HardState(1, "n1"), None, run(1, [1]))
        index = 2
        with pytest.raises(LogFullError) as info:
            while index < 10_000:  # 1 MiB cannot hold 10k entries of 4 KiB
                s.save(HardState(2, "n2"), None, run(index, [1], payload_size=4096))
                index += 1
        assert "full" in str(info.value) and "NodeConfig.log_map_size" in str(info.value)
        # the refused save left nothing behind, and everything before it reads
        assert s.last_index() == index - 1
        assert s.entries(index, index + 1) == []
        assert s.entries(1, 2) == run(1, [1])
        assert len(s.entries(2, index)) == index - 2
        assert s.hard_state() == HardState(2, "n2")
        # compaction frees pages that later appends reuse
        s.compact(index - 1)
        s.save(None, None, run(index, [1], payload_size=4096))
        assert s.last_index() == index


def test_lmdb_compaction_reuses_pages(tmp_path: Path) -> None:
    with LmdbLogStore(tmp_path / "log", fsync=False) as s:
        batch = 2000
        s.save(None, None, run(1, [1] * batch, payload_size=300))
        s.compact(batch)
        grown = s.size_bytes()
        for _ in range(5):
            first = s.last_index() + 1
            s.save(None, None, run(first, [1] * batch, payload_size=300))
            s.compact(s.last_index())
        assert s.size_bytes() < 2 * grown


def test_lmdb_reads_from_another_thread_stay_consistent(tmp_path: Path) -> None:
    """The node saves on a persist thread while the core reads on the event loop's thread."""
    done = threading.Event()
    failures: list[BaseException] = []

    def write(s: LmdbLogStore) -> None:
        try:
            for round_ in range(1, 201):
                s.save(HardState(round_), None, run(s.last_index() + 1, [round_] * 10))
                if round_ % 20 == 0:
                    s.compact(s.last_index() - 5)
        except BaseException as exc:  # surfaced by the assertion below
            failures.append(exc)
        finally:
            done.set()

    reads = 0
    with LmdbLogStore(tmp_path / "log", fsync=False) as s:
        writer = threading.Thread(target=write, args=(s,))
        writer.start()
        while not done.is_set():
            lo = s.before_begin()[0] + 1
            try:
                got = s.entries(lo, lo + 50)
            except IndexError:  # compacted between before_begin() and the read: allowed
                continue
            assert [e.index for e in got] == list(range(lo, lo + len(got)))
            assert all(e.term == 1 + (e.index - 1) // 10 for e in got)
            reads += 1
        writer.join()
        assert not failures
        assert s.last_index() == 2000 and s.before_begin() == (1995, 200)
    assert reads > 0


def test_lmdb_large_log_reopens_fast(tmp_path: Path) -> None:
    path = tmp_path / "log"
    total, batch = 100_000, 1000
    started = time.perf_counter()
    with LmdbLogStore(path) as s:
        for first in range(1, total + 1, batch):
            term = 1 + first // 10_000  # ten runs
            s.save(HardState(term, "n1"), None, run(first, [term] * batch, payload_size=300))
        size = s.size_bytes()
    saved = time.perf_counter()
    with LmdbLogStore(path) as s:
        opened = time.perf_counter()
        assert s.last_index() == total
        assert s.first_index_of_term(5) == 40_001 and s.last_index_of_term(5) == 50_000
        assert [e.index for e in s.entries(55_555, 55_560)] == list(range(55_555, 55_560))
    print(f"\n{total} entries of 300 B in {total // batch} fsynced saves: {saved - started:.2f}s "
          f"({size / 1e6:.1f} MB); reopen {1000 * (opened - saved):.1f} ms")
