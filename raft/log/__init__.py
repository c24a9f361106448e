"""The log store on disk: entries by index, hard state, and the before_begin boundary, on LMDB."""
from raft.log.errors import LogCorruptionError, LogFullError, LogStoreError
from raft.log.lmdb_store import LmdbLogStore

__all__ = ["LmdbLogStore", "LogCorruptionError", "LogFullError", "LogStoreError"]
