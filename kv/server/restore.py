"""Seeding a new cluster from a snapshot file (`raftkv snapshot restore`): raftkv's own, or an
etcd 3.x snapshot (`etcdctl snapshot save`), told apart by content.

A restored data directory looks exactly like one of a running node that installed the snapshot
and compacted its log:

    data_dir/state       the snapshot's state (applied index = the snapshot's index; for an etcd
                         snapshot its data imported, applied index = etcd's consistent index)
    data_dir/wal         an empty log whose before_begin is (index, term), hard state term = term
    data_dir/cluster_id  a NEW cluster id

It lives with the server, not in the snapshot package, because it lays out a node's whole data
directory: the state (snapshot.install), the log (raft.log) and the cluster id (raft.node).

The new cluster id keeps nodes of the restored cluster from ever exchanging messages with nodes of
the cluster the snapshot came from (peers refuse another cluster id). To restore a multi-node
cluster, restore the same file on every member with the same `cluster_id` (`--cluster-id`):
members restored with different ids refuse each other. Without one, each call makes up a random
id, which is only right for a single-node cluster.
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from kv.server.data_dir import LOCK_FILE, DataDirLock
from kv.server.etcd_backup import restore_etcd_state
from raft.core.membership import Membership
from raft.core.types import HardState
from raft.log import open_log_store
from raft.node.cluster_id import resolve_cluster_id
from snapshot.durable import fsync_path
from snapshot.errors import RestoreRefusedError
from snapshot.etcd_file import is_etcd_snapshot
from snapshot.install import extract_state
from statemachine.kv_state import KVStateMachine

STATE_DIR = "state"


def new_cluster_id() -> str:
    return "c-" + secrets.token_hex(8)


def restore(snapshot_file: str | os.PathLike[str], data_dir: str | os.PathLike[str], node_id: str,
            peers: dict[str, str], cluster_id: str | None = None) -> str:
    """Create `data_dir` for member `node_id` of a new cluster (`peers`) from the snapshot; returns
    the new cluster id. Refuses a non-empty `data_dir` (RestoreRefusedError) and a snapshot that
    does not verify (SnapshotCorruptError); either way `data_dir` is left as it was found."""
    data_dir = Path(data_dir)
    if node_id not in peers:
        raise RestoreRefusedError(f"node {node_id!r} is not one of the peers {sorted(peers)}; nothing was restored")
    existed = data_dir.exists()
    if existed and not data_dir.is_dir():
        raise RestoreRefusedError(f"{data_dir} is not a directory; restore into a new or empty directory")
    had_lock_file = (data_dir / LOCK_FILE).exists()
    lock = DataDirLock(data_dir)
    lock.acquire(f"raftkv snapshot restore of {node_id}")  # refuses a directory a node is using
    restored = False
    try:
        _require_empty(data_dir)
        new_id = cluster_id or new_cluster_id()
        try:
            index, term = _restore_state(snapshot_file, data_dir / STATE_DIR, new_id)
            with KVStateMachine(data_dir / STATE_DIR) as state:  # a new cluster: the members of `peers`
                state.replace_membership(Membership.of_voters(peers).encode())
            _create_log(data_dir, index, term)
            resolve_cluster_id(data_dir, new_id, list(peers))
            fsync_path(data_dir)
        except BaseException:
            _undo(data_dir)
            raise
        restored = True
    finally:
        lock.release()
        if not restored:  # refused or failed: leave the directory as it was found
            if not existed:
                shutil.rmtree(data_dir, ignore_errors=True)
            elif not had_lock_file:
                (data_dir / LOCK_FILE).unlink(missing_ok=True)
    return new_id


def _require_empty(data_dir: Path) -> None:
    if any(p.name != LOCK_FILE for p in data_dir.iterdir()):
        raise RestoreRefusedError(
            f"data directory {data_dir} is not empty; restore only into a new or empty directory "
            "(move the old one aside first: restoring over a node's data would mix two clusters)")


def _restore_state(snapshot_file: str | os.PathLike[str], state_dir: Path, cluster_id: str) -> tuple[int, int]:
    """The snapshot's state in `state_dir`, told by content: a raftkv snapshot's payload, or an
    etcd 3.x snapshot's data imported (kv/server/etcd_backup.py). Returns its (index, term)."""
    if is_etcd_snapshot(snapshot_file):
        restore_etcd_state(snapshot_file, state_dir, cluster_id)
        with KVStateMachine(state_dir) as state:
            return state.applied_index, state.applied_term
    manifest = extract_state(snapshot_file, state_dir)
    return manifest.index, manifest.term


def _create_log(data_dir: Path, index: int, term: int) -> None:
    """The restored member's log (of the default kind), beginning after the snapshot."""
    with open_log_store(data_dir) as log:
        # currentTerm must be at least the last log term, which is now the snapshot's term.
        log.save(HardState(term=term), None, [])
        log.reset_to_snapshot(index, term)


def _undo(data_dir: Path) -> None:
    """Put the data directory back as it was found: empty (but for the lock file)."""
    for child in data_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        elif child.name != LOCK_FILE:
            child.unlink(missing_ok=True)
