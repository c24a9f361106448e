"""What an on-disk log store's hot-path reads answer from, kept in memory: the hard state, the
before_begin boundary, the last index and the term runs. A store replaces it whole after each
durable write and never mutates it, so a reader on another thread always sees one consistent
state without a lock."""
from __future__ import annotations

from dataclasses import dataclass

from raft.log.term_runs import TermRuns
from raft.core.types import HardState


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
