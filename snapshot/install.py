"""Replacing a follower's state directory with a snapshot's state, crash-safely.

`install_into_state(file, state_dir)`, with the state machine on `state_dir` CLOSED:

1. verify the snapshot while extracting its payload into ``<state_dir>.incoming`` (a fresh
   directory beside it), fsync the file and the directory;
2. rename ``<state_dir>`` to ``<state_dir>.old`` (skipped when there is no state yet);
3. rename ``<state_dir>.incoming`` to ``<state_dir>``, fsync the parent;
4. remove ``<state_dir>.old``.

Recovery rule, applied by `recover_state_dir(state_dir)`, which the node must call before opening
the state machine:

- ``<state_dir>`` exists: the swap either never started or completed. Any ``.incoming`` (maybe
  partial) and ``.old`` are leftovers and are deleted. An install that never swapped is simply
  lost; the leader sends the snapshot again.
- ``<state_dir>`` is missing but ``.old`` exists: the crash came between the two renames. Step 2
  only runs once ``.incoming`` is complete and on disk, so the install is rolled FORWARD:
  ``.incoming`` becomes ``<state_dir>`` and ``.old`` is deleted. (Should ``.incoming`` be gone too,
  which no crash of this code produces, ``.old`` is put back.)
- neither exists: there was no state before, so any ``.incoming`` may be partial: deleted.

Either way the state directory is complete: the old state or the whole snapshot. Note for the
driver: the log is reset to the snapshot only after the swap, so after a crash the state may be
ahead of the log; on start, if the state's applied (index, term) is past the log's end or not in
it, call the log store's reset_to_snapshot(applied index, applied term) before replaying.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from snapshot.durable import fsync_file, fsync_path
from snapshot.file_format import copy_payload
from snapshot.manifest import SnapshotManifest
from snapshot.state_payload import STATE_FILE

log = logging.getLogger(__name__)

INCOMING_SUFFIX = ".incoming"
OLD_SUFFIX = ".old"


def incoming_dir(state_dir: Path) -> Path:
    return state_dir.with_name(state_dir.name + INCOMING_SUFFIX)


def old_dir(state_dir: Path) -> Path:
    return state_dir.with_name(state_dir.name + OLD_SUFFIX)


def extract_state(snapshot_file: str | os.PathLike[str], directory: Path) -> SnapshotManifest:
    """Verify `snapshot_file` while writing its payload to directory/data.mdb (directory must not
    exist), fsynced. On a corrupt snapshot the directory is removed and SnapshotCorruptError raised."""
    directory.mkdir(parents=True)
    try:
        with open(directory / STATE_FILE, "xb") as out:
            manifest = copy_payload(snapshot_file, out)
            fsync_file(out)
        fsync_path(directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return manifest


def install_into_state(snapshot_file: str | os.PathLike[str], state_dir: str | os.PathLike[str]) -> SnapshotManifest:
    """Make `state_dir` hold exactly the snapshot's state (see the module docstring). The state
    machine on `state_dir` must be closed; reopen it afterwards. Raises SnapshotCorruptError (and
    leaves `state_dir` untouched) if the file does not verify."""
    state_dir = Path(state_dir)
    recover_state_dir(state_dir)  # a leftover .incoming/.old from an earlier crash would be in the way
    incoming, old = incoming_dir(state_dir), old_dir(state_dir)
    manifest = extract_state(snapshot_file, incoming)
    had_state = state_dir.exists()
    if had_state:
        os.rename(state_dir, old)
    os.rename(incoming, state_dir)
    fsync_path(state_dir.parent)
    if had_state:
        shutil.rmtree(old)
        fsync_path(state_dir.parent)
    log.info("installed snapshot at index %d (term %d) into %s", manifest.index, manifest.term, state_dir)
    return manifest


def recover_state_dir(state_dir: str | os.PathLike[str]) -> None:
    """Finish or undo an install interrupted by a crash (rules in the module docstring)."""
    state_dir = Path(state_dir)
    incoming, old = incoming_dir(state_dir), old_dir(state_dir)
    if not state_dir.exists() and old.exists():
        if incoming.exists():
            log.warning("completing a snapshot install interrupted by a crash in %s", state_dir)
            os.rename(incoming, state_dir)
        else:
            log.warning("putting back the state in %s: a snapshot install left no new state", state_dir)
            os.rename(old, state_dir)
        fsync_path(state_dir.parent)
    for leftover in (incoming, old):
        if leftover.exists():
            log.info("removing %s left by an interrupted snapshot install", leftover)
            shutil.rmtree(leftover)
    if state_dir.parent.exists():
        fsync_path(state_dir.parent)

