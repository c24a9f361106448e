"""raft/node/giving_way.py: when a node gives way, and how a large apply is sliced."""
from __future__ import annotations

import pytest

from raft.core.types import Entry, Role
from raft.node.giving_way import apply_in_slices, gives_way


@pytest.mark.parametrize(("role", "entries", "every", "expected"), [
    (Role.FOLLOWER, 9, 8, True),
    (Role.FOLLOWER, 8, 8, False),       # not more than the bound
    (Role.CANDIDATE, 100, 8, True),
    (Role.LEADER, 100, 8, False),       # everything a leader does is on some client's path
    (Role.FOLLOWER, 100, 0, False),     # turned off
])
def test_who_gives_way(role: Role, entries: int, every: int, expected: bool) -> None:
    assert gives_way(role, entries, every) is expected


def test_a_large_apply_goes_in_slices_with_a_pause_between_them() -> None:
    entries = [Entry(index=i, term=1) for i in range(1, 21)]
    calls: list[list[int]] = []
    events: list[str] = []

    def apply(batch: list[Entry]) -> list[int]:
        calls.append([e.index for e in batch])
        events.append("apply")
        return [e.index * 10 for e in batch]

    results = apply_in_slices(apply, entries, 8, pause=lambda: events.append("pause"))
    assert calls == [list(range(1, 9)), list(range(9, 17)), list(range(17, 21))]
    assert events == ["apply", "pause", "apply", "pause", "apply"]
    assert results == [i * 10 for i in range(1, 21)]  # as one call would give
