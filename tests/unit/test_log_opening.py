"""Which log store a data directory opens with (raft/log/opening.py): a new directory gets the
write-ahead log in DATA_DIR/wal, one holding an LMDB log in DATA_DIR/log keeps it under "auto",
and asking for the kind that is not there is refused with a message saying what to do. Then a real
node started on LMDB and restarted with the default: an upgrade in place keeps its log."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kv import embedded
from raft.core.config import CoreConfig
from raft.core.types import Entry, EntryType, HardState
from raft.log import (
    LmdbLogStore,
    LogStoreError,
    LogStoreMismatchError,
    WalLogStore,
    log_store_kind,
    open_log_store,
)
from raft.node.config import NodeConfig
from statemachine.commands import decode_command

FAST = CoreConfig(election_timeout_ms=300, heartbeat_interval_ms=30, lease_ms=250, push_timeout_ms=300)
SMALL = 64 << 20  # log and state map sizes for these tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def entries(first: int, terms: list[int]) -> list[Entry]:
    return [Entry(first + k, t, EntryType.NORMAL, f"entry-{first + k}".encode()) for k, t in enumerate(terms)]


def subdirs(data_dir: Path) -> set[str]:
    return {p.name for p in data_dir.iterdir() if p.is_dir()}


def make_lmdb_log(data_dir: Path) -> None:
    """A data directory as an earlier version left it: an LMDB log in DATA_DIR/log."""
    with LmdbLogStore(data_dir / "log", map_size=SMALL) as store:
        store.save(HardState(3, "n1"), None, entries(1, [1, 1, 2, 3, 3]))


def make_wal_log(data_dir: Path) -> None:
    with WalLogStore(data_dir / "wal", max_bytes=SMALL) as store:
        store.save(HardState(1, "n1"), None, entries(1, [1]))


# ---- choosing and opening -------------------------------------------------------------------

def test_a_new_data_dir_gets_the_write_ahead_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"  # not even created yet
    assert log_store_kind(data_dir) == "wal"
    assert log_store_kind(data_dir, "auto") == "wal"
    assert log_store_kind(data_dir, "wal") == "wal"
    with open_log_store(data_dir, max_bytes=SMALL) as store:
        assert isinstance(store, WalLogStore)
        store.save(HardState(2, "n2"), None, entries(1, [1, 2]))
    assert subdirs(data_dir) == {"wal"}
    # Opened again it is found as the write-ahead log, with what was written.
    assert log_store_kind(data_dir) == "wal"
    with open_log_store(data_dir, max_bytes=SMALL) as store:
        assert isinstance(store, WalLogStore)
        assert store.hard_state() == HardState(2, "n2")
        assert store.entries(1, 3) == entries(1, [1, 2])


def test_lmdb_asked_for_on_a_new_data_dir_is_lmdb_in_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    assert log_store_kind(data_dir, "lmdb") == "lmdb"
    with open_log_store(data_dir, "lmdb", max_bytes=SMALL) as store:
        assert isinstance(store, LmdbLogStore)
    assert subdirs(data_dir) == {"log"}
    assert log_store_kind(data_dir) == "lmdb"


def test_an_existing_lmdb_log_opens_as_lmdb_and_keeps_its_entries(tmp_path: Path) -> None:
    make_lmdb_log(tmp_path)
    assert log_store_kind(tmp_path) == "lmdb"
    assert log_store_kind(tmp_path, "lmdb") == "lmdb"
    for wanted in ("auto", "lmdb"):
        with open_log_store(tmp_path, wanted, max_bytes=SMALL) as store:
            assert isinstance(store, LmdbLogStore), wanted
            assert store.hard_state() == HardState(3, "n1")
            assert store.before_begin() == (0, 0)
            assert store.last_index() == 5
            assert store.entries(1, 6) == entries(1, [1, 1, 2, 3, 3])
    assert subdirs(tmp_path) == {"log"}  # no write-ahead log started next to it


# What each kind looks like on disk: how to make one, its directory, and how a message names it.
KINDS = {
    "lmdb": (make_lmdb_log, "an LMDB log (log/)"),
    "wal": (make_wal_log, "a write-ahead log (wal/)"),
}


def read_back(data_dir: Path, kind: str) -> list[Entry]:
    """The first entry of the log of `kind` in data_dir, opened as that kind."""
    with open_log_store(data_dir, kind, max_bytes=SMALL) as store:
        return store.entries(1, 2)


@pytest.mark.parametrize("present, asked", [("lmdb", "wal"), ("wal", "lmdb")])
def test_asking_for_the_kind_that_is_not_there_is_refused_with_what_to_do(
        tmp_path: Path, present: str, asked: str) -> None:
    make, named = KINDS[present]
    make(tmp_path)
    before = read_back(tmp_path, present)
    for attempt in (lambda: log_store_kind(tmp_path, asked),
                    lambda: open_log_store(tmp_path, asked, max_bytes=SMALL)):
        with pytest.raises(LogStoreMismatchError) as refused:
            attempt()
        message = str(refused.value)
        assert str(tmp_path) in message
        assert named in message  # the kind present, and where
        assert f"--log-store {present}" in message  # the flag that opens it
    assert isinstance(refused.value, LogStoreError)
    assert subdirs(tmp_path) == {"log" if present == "lmdb" else "wal"}  # refused before anything was created
    assert read_back(tmp_path, present) == before == entries(1, [1])  # and the log is untouched


def test_a_data_dir_holding_both_logs_is_refused_whatever_is_asked(tmp_path: Path) -> None:
    make_lmdb_log(tmp_path)
    make_wal_log(tmp_path)
    for wanted in ("auto", "wal", "lmdb"):
        with pytest.raises(LogStoreMismatchError, match="holds both") as refused:
            open_log_store(tmp_path, wanted, max_bytes=SMALL)
        message = str(refused.value)
        assert "wal/" in message and "log/" in message, wanted
        with pytest.raises(LogStoreMismatchError):
            log_store_kind(tmp_path, wanted)


def test_an_unknown_kind_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown log store 'rocksdb'"):
        log_store_kind(tmp_path, "rocksdb")
    with pytest.raises(ValueError, match="auto, wal, lmdb"):
        open_log_store(tmp_path, "LMDB", max_bytes=SMALL)
    assert not any(tmp_path.iterdir())


def test_node_config_checks_log_store() -> None:
    with pytest.raises(ValueError, match="--log-store must be one of auto, wal, lmdb, not 'bogus'"):
        NodeConfig(log_store="bogus")
    assert NodeConfig().log_store == "auto"
    for kind in ("auto", "wal", "lmdb"):
        assert NodeConfig(log_store=kind).log_store == kind


# ---- a real node --------------------------------------------------------------------------------

def open_node(data_dir: Path, port: int, **config: object) -> embedded.EmbeddedNode:
    return embedded.open(data_dir, listen=f"127.0.0.1:{port}", core=FAST, tick_interval_ms=5,
                         log_map_size=SMALL, state_map_size=SMALL, **config)


def logged_keys(data_dir: Path) -> tuple[tuple[int, int], int, set[bytes]]:
    """(before_begin, last index, keys put by the entries) of the LMDB log in data_dir/log."""
    with LmdbLogStore(data_dir / "log", map_size=SMALL) as store:
        last = store.last_index()
        keys = {op.put.key for e in store.entries(1, last + 1) if e.type == EntryType.NORMAL
                for op in decode_command(e.payload).ops if op.HasField("put")}
        return store.before_begin(), last, keys


def test_a_node_on_lmdb_restarted_with_the_default_keeps_its_lmdb_log(tmp_path: Path) -> None:
    port = free_port()
    with open_node(tmp_path, port, log_store="lmdb") as db:
        for i in range(10):
            written = db.put(b"k%d" % i, b"v%d" % i)
    assert subdirs(tmp_path) >= {"log", "state"} and "wal" not in subdirs(tmp_path)
    assert logged_keys(tmp_path)[1] >= written

    with open_node(tmp_path, port) as db:  # log_store left at its default, "auto"
        assert db.config.log_store == "auto"
        assert [db.get(b"k%d" % i) for i in range(10)] == [b"v%d" % i for i in range(10)]
        after = db.put(b"after", b"upgrade")
        assert after > written
        assert db.get(b"after") == b"upgrade"
    assert "wal" not in subdirs(tmp_path)
    # The entries of both lives are in the one LMDB log, from its first index on: it was kept and
    # appended to, not replaced by a new log starting after the state.
    before_begin, last, keys = logged_keys(tmp_path)
    assert before_begin == (0, 0)
    assert last >= after
    assert keys == {b"k%d" % i for i in range(10)} | {b"after"}


def test_a_node_asked_for_wal_on_an_lmdb_data_dir_does_not_start(tmp_path: Path) -> None:
    port = free_port()
    with open_node(tmp_path, port, log_store="lmdb") as db:
        db.put(b"k", b"v")
    with pytest.raises(LogStoreMismatchError, match="--log-store lmdb"):
        open_node(tmp_path, port, log_store="wal")
    assert "wal" not in subdirs(tmp_path)
    with open_node(tmp_path, port, log_store="lmdb") as db:  # still starts as it was
        assert db.get(b"k") == b"v"
