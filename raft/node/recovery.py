"""Bringing the state machine and the log back into agreement at start, after a crash at a bad
moment. Runs before the node's core is built, on the same interfaces as the driver, so the
simulator's crashes exercise it too.

- A snapshot file damaged on disk is set aside (SnapshotHost.check), so no restore, install or
  stream uses it.
- The state machine skips fsync (the log is durable) and may be behind the log's compaction point
  after an OS crash: it is restored from the newest snapshot, which covers that point.
- A snapshot install swaps the state first and resets the log second: a crash in between leaves
  the state ahead of the log, or the log holding entries that disagree with it. The state is
  committed data, so the log is reset to begin after it."""
from __future__ import annotations

import logging

from raft.core.log_store import LogStore
from raft.node.ports import SnapshotHost, StateMachine

log = logging.getLogger(__name__)


class DamagedDataError(RuntimeError):
    """The data directory holds a state machine and a log that no repair can reconcile."""


def reconcile_state_and_log(log_store: LogStore, fsm: StateMachine, snapshots: SnapshotHost | None) -> None:
    if snapshots is not None:
        snapshots.check()  # a damaged newest snapshot is set aside before anything relies on it
    before_index, _ = log_store.before_begin()
    if fsm.applied_index < before_index:
        newest = snapshots.newest() if snapshots is not None else None
        if newest is None or newest.index < before_index:
            raise DamagedDataError(
                f"the state machine is at {fsm.applied_index}, behind the log's start {before_index}, and no "
                "snapshot covers the gap: the data directory is damaged")
        log.warning("state at %d is behind the log's start %d: restoring it from the snapshot at %d",
                    fsm.applied_index, before_index, newest.index)
        snapshots.restore(newest)  # type: ignore[union-attr]
    applied, term = fsm.applied_index, fsm.applied_term
    if applied > log_store.last_index() or log_store.term(applied) != term:
        log.warning("log disagrees with the state at index %d (term %d): the log now begins after it",
                    applied, term)
        log_store.reset_to_snapshot(applied, term)
