"""The leader's auto compaction (kv/server/auto_compaction.py) decides from a clock and the store's
revisions: stepped here with a fake node and a fake clock."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kv.server.auto_compaction import AutoCompactor


@dataclass
class FakeCore:
    term: int = 1


@dataclass
class FakeNode:
    id: str = "n1"
    leader: str | None = "n1"
    core: FakeCore = field(default_factory=FakeCore)


@dataclass
class FakeStore:
    revision: int = 1
    compacted_revision: int = 0


def test_periodic_keeps_the_retention_of_history_and_compacts_the_rest() -> None:
    now = [0.0]
    node, store = FakeNode(), FakeStore()
    compactor = AutoCompactor(node, store, "periodic", 100.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert compactor.interval_s == 10.0
    targets = []
    for step in range(25):  # a revision a second, noted every 10 s
        now[0] = step * 10.0
        store.revision = 1 + step * 10
        targets.append(compactor.step())
    # Nothing until a note is 100 s old; then, each time, the revision noted 100 s before.
    assert targets[:10] == [None] * 10
    assert targets[10] == 1 + 0 and targets[24] == 1 + 140
    store.compacted_revision = 141
    now[0] += 10
    store.revision += 10
    assert compactor.step() == 151


def test_revision_mode_keeps_the_last_revisions_and_a_follower_or_new_term_forgets_its_notes() -> None:
    node, store = FakeNode(), FakeStore(revision=5000)
    compactor = AutoCompactor(node, store, "revision", 1000, clock=lambda: 0.0)  # type: ignore[arg-type]
    assert compactor.step() == 4000
    store.compacted_revision = 4000
    assert compactor.step() is None
    periodic = AutoCompactor(node, store, "periodic", 100.0, clock=lambda: 0.0)  # type: ignore[arg-type]
    periodic.step()
    node.leader = "n2"
    assert periodic.step() is None and not periodic._noted
    node.leader, node.core.term = "n1", 2
    assert periodic.step() is None and len(periodic._noted) == 1


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="periodic"):
        AutoCompactor(FakeNode(), FakeStore(), "hourly", 1.0)  # type: ignore[arg-type]
