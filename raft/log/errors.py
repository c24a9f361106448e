"""Errors of the on-disk log stores. Each message tells an operator what happened and what to do."""
from __future__ import annotations


class LogStoreError(Exception):
    """Base class: the log store cannot do what was asked."""


class _AtPath(LogStoreError):
    """An error about the log at `path`; `detail` says what went wrong there."""

    def __init__(self, path: str, detail: str, message: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(message)


class LogCorruptionError(_AtPath):
    """A stored record fails its checksum or the store's own invariants. The node must not go on
    serving (or acknowledging) from this log: its entries can no longer be trusted."""

    def __init__(self, path: str, detail: str, index: int | None = None) -> None:
        self.index = index
        where = f"entry {index}: " if index is not None else ""
        super().__init__(
            path, detail,
            f"raft log at {path} is corrupt ({where}{detail}). This node stops using it so it cannot "
            f"serve or replicate wrong data. To recover: stop the node, remove its data directory "
            f"(the one holding {path}) and start it again with the same id and peers; it asks the "
            f"others what the cluster holds, rejoins empty and is brought up to date by snapshot and "
            f"append. Do this on one node at a time, while the others are up (both others of three "
            f"members, three of five)."
        )


class LogFullError(_AtPath):
    """The log reached its size limit (StorageConfig.log_max_bytes) or the disk is full. Nothing of
    the failed write was applied; reads still work."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            path, detail,
            f"raft log at {path} is full ({detail}); nothing of the write was stored here. Reads "
            f"still work, writes resume once space is freed, and a snapshot compacting the log frees "
            f"some. At its size limit, restart the node with a larger one (raftkv serve "
            f"--log-max-bytes; StorageConfig.log_max_bytes)."
        )


class LogWriteError(_AtPath):
    """The disk failed a write or a sync for a reason other than space (an I/O error). What the
    failed write left on disk is unknown, so the store refuses every later call; a restart
    replays the log up to its last complete record."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            path, detail,
            f"raft log at {path} could not be written ({detail}). This node stops using it: what "
            f"reached the disk is unknown. Check the disk (dmesg, free space, the file system), "
            f"then restart the node; it replays its log up to the last complete record and the "
            f"leader sends it anything missing."
        )
