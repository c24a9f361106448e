"""Which log store a data directory holds, and opening it.

A node's log lives in DATA_DIR/wal (the write-ahead log, the default since the eighth session)
or DATA_DIR/log (the LMDB log store of earlier versions). "auto" opens whichever the directory
already holds, so a node upgraded in place keeps its log, and starts a new directory on the
write-ahead log. Asking for one kind where the other is present is refused: the two are not
converted into each other."""
from __future__ import annotations

from pathlib import Path

from raft.log.errors import LogStoreError
from raft.log.lmdb_store import LmdbLogStore
from raft.log.wal_store import WalLogStore

# `raftkv serve --log-store`
LOG_STORES = ("auto", "wal", "lmdb")
LOG_DIRS = {"wal": "wal", "lmdb": "log"}

DiskLogStore = WalLogStore | LmdbLogStore
_NAMES = {"wal": "a write-ahead log", "lmdb": "an LMDB log"}


class LogStoreMismatchError(LogStoreError):
    """The data directory holds a log of the other kind than the one asked for."""


def log_store_kind(data_dir: Path, wanted: str = "auto") -> str:
    """"wal" or "lmdb": the kind `wanted` resolves to for data_dir."""
    if wanted not in LOG_STORES:
        raise ValueError(f"unknown log store {wanted!r}: expected one of {', '.join(LOG_STORES)}")
    present = [kind for kind, name in LOG_DIRS.items() if (data_dir / name).exists()]
    if len(present) > 1:
        raise LogStoreMismatchError(
            f"{data_dir} holds both a write-ahead log ({LOG_DIRS['wal']}/) and an LMDB log "
            f"({LOG_DIRS['lmdb']}/); a node has one. Move the one that is not this node's aside.")
    if wanted == "auto":
        return present[0] if present else "wal"
    if present and present[0] != wanted:
        raise LogStoreMismatchError(
            f"{data_dir} holds {_NAMES[present[0]]} ({LOG_DIRS[present[0]]}/), but --log-store {wanted} asks "
            f"for {_NAMES[wanted]}; start the node with --log-store {present[0]} (or auto), or start the member "
            f"in a new, empty data directory to have the leader send it its data.")
    return wanted


def open_log_store(data_dir: Path, wanted: str = "auto", *, max_bytes: int = 8 << 30,
                   fsync: bool = True) -> DiskLogStore:
    """Open (or create) the log store of data_dir; `max_bytes` caps its size on disk."""
    kind = log_store_kind(data_dir, wanted)
    path = data_dir / LOG_DIRS[kind]
    if kind == "wal":
        return WalLogStore(path, max_bytes=max_bytes, fsync=fsync)
    return LmdbLogStore(path, map_size=max_bytes, fsync=fsync)
