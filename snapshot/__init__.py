"""Snapshots: files (manifest + compacted LMDB state), the per-node store, chunked transfer to
followers and operators, install into a follower's state directory, and inspection of a file
(snapshot.inspection). Seeding a new cluster's data directory from a file is the server's
(kv/server/restore.py): it also lays out the log and the cluster id."""
from snapshot.errors import RestoreRefusedError, SnapshotCorruptError, SnapshotError, SnapshotTransferError
from snapshot.install import install_into_state, recover_state_dir
from snapshot.manifest import FORMAT_VERSION, SnapshotManifest
from snapshot.store import SnapshotStore, Snapshottable, StoredSnapshot
from snapshot.throttle import TokenBucket
from snapshot.transfer import FileChunk, SnapshotReceiver, chunk_file

__all__ = [
    "FORMAT_VERSION", "FileChunk", "RestoreRefusedError", "SnapshotCorruptError", "SnapshotError",
    "SnapshotManifest", "SnapshotReceiver", "SnapshotStore", "SnapshotTransferError", "Snapshottable",
    "StoredSnapshot", "TokenBucket", "chunk_file", "install_into_state", "recover_state_dir",
]
