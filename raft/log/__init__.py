"""The log store on disk: entries by index, hard state, and the before_begin boundary. A
write-ahead log of preallocated segments by default (wal_store.py), or LMDB (lmdb_store.py)."""
from raft.log.errors import LogCorruptionError, LogFullError, LogStoreError, LogWriteError
from raft.log.lmdb_store import LmdbLogStore
from raft.log.opening import LOG_STORES, DiskLogStore, LogStoreMismatchError, log_store_kind, open_log_store
from raft.log.wal_store import WalLogStore

__all__ = ["LOG_STORES", "DiskLogStore", "LmdbLogStore", "LogCorruptionError", "LogFullError", "LogStoreError",
           "LogStoreMismatchError", "LogWriteError", "WalLogStore", "log_store_kind", "open_log_store"]
