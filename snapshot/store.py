"""The snapshots of one node: a directory of snapshot files (file_format.py) named by index.

Crash safety: a snapshot is written under a temporary name (TMP_PREFIX...), fsynced, renamed to
its final name and the directory fsynced. A crash at any point leaves the previous snapshots as
they were plus, at worst, a temporary leftover that the next SnapshotStore(...) deletes; a file
under a final name is always complete.

Threads: `create` only reads the state machine (one LMDB read transaction) and may run on a
worker thread while the driver keeps applying; concurrent `create` calls use distinct temporary
names. `prune` must not run while a snapshot it may delete is being sent (keep >= 2 helps).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from snapshot.durable import fsync_file, replace_durably
from snapshot.errors import SnapshotCorruptError
from snapshot.file_format import payload_digest, read_manifest, write_snapshot
from snapshot.file_format import verify as verify_file
from snapshot.manifest import SnapshotManifest
from snapshot.state_payload import STATE_FILE, count_keys

log = logging.getLogger(__name__)

# Everything in the directory starting with this is unfinished work of a crashed process.
TMP_PREFIX = ".tmp-"
# A snapshot found damaged is renamed with this prefix: kept for inspection, no longer used.
DAMAGED_PREFIX = "damaged-"
_NAME = re.compile(r"^snapshot-(\d{20})-(\d{20})\.snap$")


class Snapshottable(Protocol):
    """What `create` needs from a state machine (KVStateMachine has it)."""

    def copy_to(self, directory: str | os.PathLike[str]) -> tuple[int, int, bytes]:
        """Write a consistent compacted copy to directory/data.mdb; return its (applied index,
        term, membership: raft/core/membership.py's encoding, b"" when none was applied)."""
        ...


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    index: int
    term: int
    path: Path


class SnapshotStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()

    def create(self, state_machine: Snapshottable, members: Sequence[str], cluster_id: str) -> SnapshotManifest:
        """Snapshot the state machine's current applied state; returns the manifest (the file is
        at `path_for(manifest)`). `members`: the bootstrap members, recorded when the state names
        no configuration."""
        token = uuid.uuid4().hex
        copy_dir = self.directory / f"{TMP_PREFIX}{token}.copy"
        tmp_file = self.directory / f"{TMP_PREFIX}{token}.snap"
        try:
            index, term, membership = state_machine.copy_to(copy_dir)
            payload = copy_dir / STATE_FILE
            size, sha256 = payload_digest(payload)
            if membership:
                members = sorted({**json.loads(membership)["voters"], **json.loads(membership)["learners"]})
            manifest = SnapshotManifest(
                index=index, term=term, members=tuple(members), membership=membership.decode(), cluster_id=cluster_id,
                size=size, sha256=sha256, key_count=count_keys(copy_dir))
            with open(tmp_file, "xb") as out:
                write_snapshot(out, manifest, payload)
                fsync_file(out)
            replace_durably(tmp_file, self.path_for(manifest))
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)
            tmp_file.unlink(missing_ok=True)
        log.info("snapshot at index %d (term %d): %d keys, %d bytes", index, term, manifest.key_count, size)
        return manifest

    def adopt(self, verified_file: str | os.PathLike[str]) -> tuple[SnapshotManifest, Path]:
        """Move a snapshot received from the leader (already verified by SnapshotReceiver.finish,
        which should write into this directory so the rename stays on one file system) under its
        final name. Returns (manifest, final path)."""
        manifest, _ = read_manifest(verified_file)
        final = self.path_for(manifest)
        replace_durably(Path(verified_file), final)
        return manifest, final

    def newest(self, verify: bool = False) -> tuple[SnapshotManifest, Path] | None:
        """The newest snapshot whose header and length check out, and with `verify` its payload's
        sha256 too; None if there is none. A damaged one is set aside (`set_aside`), falling back
        to an older one."""
        for stored in reversed(self.list()):
            try:
                manifest = verify_file(stored.path) if verify else read_manifest(stored.path)[0]
                if (manifest.index, manifest.term) != (stored.index, stored.term):
                    raise SnapshotCorruptError(f"its manifest says index {manifest.index} term {manifest.term}")
            except SnapshotCorruptError as exc:
                self.set_aside(stored.path, str(exc))
                continue
            return manifest, stored.path
        return None

    def set_aside(self, path: Path, why: str) -> Path:
        """Rename a damaged snapshot out of the store (kept for inspection as damaged-NAME): it is
        never offered, sent or restored again."""
        target = path.with_name(f"{DAMAGED_PREFIX}{path.name}")
        replace_durably(path, target)
        log.error("snapshot %s is damaged (%s): set aside as %s", path, why, target.name)
        return target

    def list(self) -> list[StoredSnapshot]:
        """Snapshot files under final names, oldest first."""
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append(StoredSnapshot(int(match[1]), int(match[2]), path))
        return sorted(found, key=lambda s: (s.index, s.term))

    def prune(self, keep: int = 2) -> list[Path]:
        """Delete all but the newest `keep` snapshots; returns the deleted paths."""
        if keep < 1:
            raise ValueError(f"prune must keep at least one snapshot, not {keep}")
        stale = [s.path for s in self.list()[:-keep]]
        for path in stale:
            path.unlink(missing_ok=True)
        return stale

    def path_for(self, manifest: SnapshotManifest) -> Path:
        return self.directory / f"snapshot-{manifest.index:020d}-{manifest.term:020d}.snap"

    def _remove_leftovers(self) -> None:
        for path in self.directory.iterdir():
            if not path.name.startswith(TMP_PREFIX):
                continue
            log.info("removing unfinished snapshot work %s", path)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
