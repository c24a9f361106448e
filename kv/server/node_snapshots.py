"""NodeSnapshots: raft/node's SnapshotHost, built from the snapshot package and the node's
replaceable state machine (kv/ is where the two meet: raft/ imports neither)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from kv.server.replaceable_state import ReplaceableStateMachine
from raft.node.ports import SnapshotInfo
from snapshot.errors import SnapshotCorruptError
from snapshot.file_format import verify as verify_file
from snapshot.manifest import SnapshotManifest
from snapshot.store import SnapshotStore
from snapshot.transfer import SnapshotReceiver, chunk_file


class NodeSnapshots:
    def __init__(self, directory: Path, state: ReplaceableStateMachine, members: Sequence[str],
                 cluster_id: str, keep: int = 2) -> None:
        self.store = SnapshotStore(directory)
        self._state = state
        self._members = tuple(members)
        self._cluster_id = cluster_id
        self._keep = keep

    def _info(self, manifest: SnapshotManifest, path: Path) -> SnapshotInfo:
        return SnapshotInfo(manifest.index, manifest.term, path, path.stat().st_size, manifest.sha256,
                            manifest.membership.encode())

    def newest(self) -> SnapshotInfo | None:
        found = self.store.newest()
        return self._info(*found) if found else None

    def check(self) -> None:
        """(At start) Verify the newest snapshot's payload, setting damaged ones aside."""
        self.store.newest(verify=True)

    def verify(self, info: SnapshotInfo) -> bool:
        try:
            verify_file(info.path)
        except SnapshotCorruptError as e:
            self.store.set_aside(info.path, str(e))
            return False
        return True

    def take(self) -> SnapshotInfo:
        manifest = self.store.create(self._state, self._members, self._cluster_id)
        # The state environment skips fsync (the log is durable); before the log is compacted up
        # to this snapshot, the state must be on disk at least that far.
        self._state.sync()
        return self._info(manifest, self.store.path_for(manifest))

    def receiver(self, source: str) -> SnapshotReceiver:
        return SnapshotReceiver(self.store.directory, source)

    def restore(self, info: SnapshotInfo) -> None:
        self._state.replace_with(info.path)

    def install(self, verified_file: Path) -> SnapshotInfo:
        self._state.replace_with(verified_file)
        manifest, path = self.store.adopt(verified_file)
        return self._info(manifest, path)

    def chunks(self, info: SnapshotInfo, chunk_size: int) -> Iterator[tuple[int, bytes, bool]]:
        return chunk_file(info.path, chunk_size)  # FileChunk is an (offset, data, done) tuple

    def prune(self) -> None:
        self.store.prune(self._keep)
