"""Snapshots: files (manifest + compacted LMDB state), the per-node store, chunked transfer to
followers and operators, install into a follower's state directory, and restore into a new cluster.

`restore` and `inspect` (snapshot.restore) are operator tools and are not imported here, so the
node can import this package without pulling in more of raft than it already has."""
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
