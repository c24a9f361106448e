"""The log store on disk: a write-ahead log of preallocated segments with chained CRCs
(wal_store.py), holding entries by index, the hard state and the before_begin boundary."""
from pathlib import Path

from raft.log.errors import LogCorruptionError, LogFullError, LogStoreError, LogWriteError
from raft.log.wal_store import WalLogStore

# Where a node's log lives in its data directory.
LOG_DIR = "wal"


def open_log_store(data_dir: Path, *, max_bytes: int = 8 << 30, fsync: bool = True) -> WalLogStore:
    """Open (or create) the log of a node's data directory; `max_bytes` caps its size on disk."""
    return WalLogStore(Path(data_dir) / LOG_DIR, max_bytes=max_bytes, fsync=fsync)


__all__ = ["LOG_DIR", "LogCorruptionError", "LogFullError", "LogStoreError", "LogWriteError", "WalLogStore",
           "open_log_store"]
