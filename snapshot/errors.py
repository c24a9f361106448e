"""Errors of the snapshot package. Each message names the file or directory and what to do."""
from __future__ import annotations


class SnapshotError(Exception):
    """Base class: a snapshot could not be written, read, transferred or restored."""


class SnapshotCorruptError(SnapshotError):
    """A snapshot file (or stream) is not a complete, intact raftkv snapshot of a version this build
    reads: wrong magic, damaged header, unsupported version, truncated, or checksum mismatch."""


class SnapshotTransferError(SnapshotError):
    """A chunked transfer went wrong in a way that is not the file's fault: a chunk at an offset
    other than the next expected one, or use of a receiver that was finished or aborted."""


class RestoreRefusedError(SnapshotError):
    """`restore` will not write into this data directory (it is not empty, or the node is not a
    member); nothing was changed."""
