"""One conformance suite for every LogStore: the in-memory one the simulator uses, the write-ahead
log nodes run on, and the same reopened after every write so that each test also checks its
replay. The write-ahead log's own promises are in test_wal_store.py."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raft.core.log_store import LogStore, MemoryLogStore
from raft.core.types import Entry, EntryType, HardState
from raft.log import WalLogStore


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


@pytest.fixture(params=["memory", "wal", "wal-reopened"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    if request.param == "memory":
        yield MemoryLogStore()
        return
    disk_store: WalLogStore | ReopeningWal
    if request.param == "wal":
        disk_store = WalLogStore(tmp_path / "wal")
    else:
        disk_store = ReopeningWal(tmp_path / "wal")
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
