"""What an on-disk log store's hot-path reads answer from, kept in memory: the hard state, the
before_begin boundary, the last index and the term runs. A store replaces it whole after each
durable write and never mutates it, so a reader on another thread always sees one consistent
state without a lock."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from raft.core.types import Entry, HardState
from raft.log.term_runs import TermRuns


@dataclass(frozen=True, slots=True)
class LogView:
    hard_state: HardState
    before_index: int
    before_term: int
    last_index: int
    runs: TermRuns

    def term(self, index: int) -> int | None:
        if index == self.before_index:
            return self.before_term
        if self.before_index < index <= self.last_index:
            return self.runs.term_at(index)
        return None

    def first_index_of_term(self, term: int) -> int | None:
        if (
            term == self.before_term
            and self.before_index > 0
            and (not self.runs.terms or self.runs.terms[0] >= term)
        ):
            # The run may have started inside the snapshot; the boundary is the first we know.
            return self.before_index
        return self.runs.first_index(term)

    def last_index_of_term(self, term: int) -> int | None:
        found = self.runs.last_index(term, self.last_index)
        if found is None and term == self.before_term and self.before_index > 0:
            return self.before_index
        return found

    def plan_save(self, truncate_from: int | None, entries: Sequence[Entry]) -> tuple[int | None, int, TermRuns]:
        """Check a save against this view before anything is written: ValueError for a
        truncation into the compacted log or entries that do not follow the (truncated) end.
        Returns the truncation still to do (None when it drops nothing), the last index before
        the entries, and the term runs after the save."""
        end, runs = self.last_index, self.runs
        if truncate_from is not None:
            if truncate_from <= self.before_index:
                raise ValueError(f"cannot truncate at {truncate_from}: compacted through {self.before_index}")
            if truncate_from > end:
                truncate_from = None  # nothing there to drop
            else:
                end, runs = truncate_from - 1, runs.truncated(truncate_from)
        for offset, e in enumerate(entries):
            if e.index != end + 1 + offset:
                raise ValueError(f"entry {e.index} does not follow the log's end {end + offset}")
        return truncate_from, end, runs.extended(entries)


class ViewReads:
    """The LogStore reads both on-disk stores answer from their current LogView (`_live()`,
    which raises once the store has failed)."""

    def _live(self) -> LogView:
        raise NotImplementedError

    def hard_state(self) -> HardState:
        return self._live().hard_state

    def before_begin(self) -> tuple[int, int]:
        view = self._live()
        return view.before_index, view.before_term

    def last_index(self) -> int:
        return self._live().last_index

    def term(self, index: int) -> int | None:
        return self._live().term(index)

    def first_index_of_term(self, term: int) -> int | None:
        return self._live().first_index_of_term(term)

    def last_index_of_term(self, term: int) -> int | None:
        return self._live().last_index_of_term(term)
