"""Which committed entries go to the state machine next.

The core hands committed entries to the driver in Readies, at most max_apply_batch at a time, and
learns back how far the state machine got. Usually that is everything handed out; but a state
machine may end a batch early (the KV state machine does at a state check marker) or fail for a
full disk, and then what it did not apply is handed out again: at once, or (held) only after the
driver says space returned. A snapshot install moves everything to the snapshot's index."""
from __future__ import annotations


class ApplyCursor:
    def __init__(self, applied: int) -> None:
        self.applied = applied  # the state machine holds every entry up to here
        self.handed = applied  # entries handed to the driver up to here
        self.held = False  # the state machine is out of space: hand nothing out until resumed

    def has_more(self, commit: int) -> bool:
        return not self.held and commit > self.handed

    def take(self, commit: int, max_batch: int) -> tuple[int, int]:
        """The next indexes to hand out, [first, last]; they count as handed."""
        first, self.handed = self.handed + 1, min(commit, self.handed + max_batch)
        return first, self.handed

    def applied_to(self, index: int) -> None:
        self.applied = max(self.applied, index)

    def stopped(self, applied: int, hold: bool) -> None:
        """Only `applied` of what was handed out was applied: hand out the rest again (once
        resumed, with `hold`)."""
        self.applied_to(applied)
        self.handed = self.applied
        self.held = hold

    def resume(self) -> None:
        self.held = False

    def installed(self, index: int) -> None:
        """A snapshot through `index` replaced the state."""
        self.applied_to(index)
        self.handed = max(self.handed, index)
