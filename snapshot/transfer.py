"""Moving a snapshot file in chunks: the sender side (`chunk_file`) and the receiving side
(`SnapshotReceiver`). Used by the InstallSnapshot gRPC stream (proto/raft.proto SnapshotChunk) in
both directions and by `raftkv snapshot save`.

Contract of a stream: chunks carry consecutive offsets starting at 0 and the last one has
done=True; the announced `total_size` is the size of the whole snapshot FILE and the announced
`sha256` is the manifest's payload sha256 (what SnapshotManifest.sha256 holds, so the sender need
not hash anything). The receiver parses the header as it arrives and hashes the payload on the
fly, so `finish` verifies without reading the file again.
"""
from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from snapshot.durable import fsync_file, fsync_path
from snapshot.errors import SnapshotCorruptError, SnapshotTransferError
from snapshot.file_format import BLOCK_SIZE, check_complete, parse_header
from snapshot.manifest import SnapshotManifest
from snapshot.store import TMP_PREFIX
from snapshot.throttle import TokenBucket

log = logging.getLogger(__name__)


class FileChunk(NamedTuple):
    offset: int
    data: bytes
    done: bool


def chunk_file(path: str | os.PathLike[str], chunk_size: int = BLOCK_SIZE,
               bytes_per_second: float | None = None, *, throttle: TokenBucket | None = None) -> Iterator[FileChunk]:
    """Yield the file as (offset, data, done) chunks of `chunk_size` bytes (the last may be
    shorter; an empty file is one empty chunk with done=True). With `bytes_per_second` (or an
    explicit `throttle`) the generator waits between chunks to keep to that rate."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if throttle is None and bytes_per_second is not None:
        throttle = TokenBucket(bytes_per_second, capacity=chunk_size)
    with open(path, "rb") as f:
        offset = 0
        data = f.read(chunk_size)
        while True:
            # Read one ahead so the last chunk is marked done without trusting a stat() size.
            following = f.read(chunk_size) if data else b""
            if throttle is not None and data:
                throttle.take(len(data))
            done = not following
            yield FileChunk(offset, data, done)
            if done:
                return
            offset += len(data)
            data = following


class SnapshotReceiver:
    """Reassembles a streamed snapshot into a temporary file in `tmp_dir` (use the SnapshotStore
    directory: its leftovers are cleaned on open, and `SnapshotStore.adopt` can rename the result
    in place). Use as a context manager: leaving it without `finish` aborts."""

    def __init__(self, tmp_dir: str | os.PathLike[str], source: str = "snapshot stream") -> None:
        self.tmp_dir = Path(tmp_dir)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.tmp_dir / f"{TMP_PREFIX}recv-{uuid.uuid4().hex}.snap"
        self._name = f"{source} (into {self.path})"
        self._file = open(self.path, "xb")
        self._received = 0
        self._head = bytearray()  # bytes before the header is complete
        self._header: tuple[SnapshotManifest, int] | None = None
        self._payload_digest = hashlib.sha256()
        self._state = "open"

    @property
    def received(self) -> int:
        """Bytes accepted so far: the offset the next chunk must have."""
        return self._received

    @property
    def manifest(self) -> SnapshotManifest | None:
        """The snapshot's manifest, once its header has arrived."""
        return self._header[0] if self._header else None

    def feed(self, offset: int, data: bytes) -> None:
        """Append a chunk. Raises SnapshotTransferError for an offset other than `received`
        (nothing is written; the receiver stays usable), SnapshotCorruptError (after aborting)
        as soon as the bytes cannot be a snapshot."""
        self._require_open()
        if offset != self._received:
            raise SnapshotTransferError(
                f"{self._name}: chunk at offset {offset} refused, the next expected offset is {self._received}")
        try:
            self._track(data)
            self._file.write(data)
        except BaseException:
            self.abort()
            raise
        self._received += len(data)

    def finish(self, expected_size: int, expected_sha256: str) -> Path:
        """Check the whole file arrived and verifies, make it durable and return its path (still a
        temporary name: the caller renames it, e.g. with SnapshotStore.adopt). On any failure the
        file is removed and SnapshotCorruptError raised."""
        self._require_open()
        try:
            manifest = self._verify(expected_size, expected_sha256)
            fsync_file(self._file)
            self._file.close()
            fsync_path(self.tmp_dir)
        except BaseException:
            self.abort()
            raise
        self._state = "finished"
        log.info("received snapshot at index %d (%d bytes) into %s", manifest.index, self._received, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the partial file. Harmless after finish (the file is the caller's then) or twice."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._file.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SnapshotReceiver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.abort()

    def _require_open(self) -> None:
        if self._state != "open":
            raise SnapshotTransferError(f"{self._name}: the receiver is {self._state}")

    def _track(self, data: bytes) -> None:
        """Parse the header once it is complete and hash every payload byte after it."""
        if self._header is None:
            self._head += data
            self._header = parse_header(bytes(self._head), self._name)
            if self._header is None:
                return
            data = bytes(self._head[self._header[1]:])
            self._head = bytearray()
        self._payload_digest.update(data)

    def _verify(self, expected_size: int, expected_sha256: str) -> SnapshotManifest:
        if self._received < expected_size:
            raise SnapshotCorruptError(
                f"{self._name}: truncated (received {self._received} of the {expected_size} bytes announced)")
        if self._received > expected_size:
            raise SnapshotCorruptError(
                f"{self._name}: damaged (received {self._received} bytes, {expected_size} were announced)")
        if self._header is None:
            raise SnapshotCorruptError(f"{self._name}: truncated (the stream ended inside the header)")
        manifest, offset = self._header
        check_complete(self._name, manifest, offset, self._received, self._payload_digest.hexdigest())
        if expected_sha256 != manifest.sha256:
            raise SnapshotCorruptError(
                f"{self._name}: checksum mismatch (the sender announced sha256 {expected_sha256}, "
                f"the snapshot's manifest says {manifest.sha256})")
        return manifest
