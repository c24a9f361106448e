"""The narrow view of a state machine the driver needs: where it stands, and apply a batch.

The KV state machine (statemachine.kv_state.KVStateMachine) satisfies it; tests use a dict."""
from __future__ import annotations

from typing import Protocol, Sequence

from raft.core.types import Entry


class StateMachine(Protocol):
    @property
    def applied_index(self) -> int:
        """Index of the last entry applied (durably enough that a restart resumes after it)."""
        ...

    def apply(self, entries: Sequence[Entry]) -> list[object]:
        """Apply committed entries in order, NOOPs included (they move applied_index). Returns one
        result per entry, handed to the proposer of that entry; runs on the driver's apply thread."""
        ...
