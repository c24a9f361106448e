"""What the driver needs from snapshots, as a narrow interface (hashicorp/raft's SnapshotStore
and FSM.Restore in one): raft/ does not import the snapshot package; kv/ composes the two.

All methods may block (disk, LMDB); the driver calls them from worker threads."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    index: int
    term: int
    path: Path
    file_size: int  # bytes of the whole snapshot file (what a stream carries)
    sha256: str  # of the payload, as the manifest records it (what a receiver verifies)


class SnapshotReceiving(Protocol):
    def feed(self, offset: int, data: bytes) -> None: ...
    def finish(self, expected_size: int, expected_sha256: str) -> Path: ...
    def abort(self) -> None: ...


class SnapshotHost(Protocol):
    def newest(self) -> SnapshotInfo | None:
        """The newest complete snapshot on disk."""
        ...

    def take(self) -> SnapshotInfo:
        """Snapshot the state machine at its applied index, without stopping it applying, and
        make sure the state machine itself is on disk at least that far (so the log may be
        compacted up to the snapshot)."""
        ...

    def receiver(self, source: str) -> SnapshotReceiving:
        """Where a snapshot streamed from the leader is written and verified."""
        ...

    def install(self, verified_file: Path) -> SnapshotInfo:
        """Replace the state machine's contents by the snapshot's (atomically: a crash leaves
        either the old or the new state) and keep the file as the newest snapshot."""
        ...

    def chunks(self, info: SnapshotInfo, chunk_size: int) -> Iterator[tuple[int, bytes, bool]]:
        """The snapshot file as (offset, data, done) pieces."""
        ...

    def prune(self) -> None:
        """Drop snapshot files no longer needed."""
        ...
