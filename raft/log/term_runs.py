"""The first index of each term in a log. Terms never decrease along a Raft log, so each term is
one contiguous run; this small table answers term(i), first/last index of a term by bisection,
without touching disk. It is immutable: a store swaps in the new table after each commit."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence

from raft.core.types import Entry


@dataclass(frozen=True, slots=True)
class TermRuns:
    starts: tuple[int, ...] = ()  # ascending first indexes
    terms: tuple[int, ...] = ()  # ascending terms, terms[k] starting at starts[k]

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, int]]) -> TermRuns:
        """Build from (term, first index) pairs; ValueError unless both ascend strictly together."""
        ordered = sorted(pairs)
        for (term_a, start_a), (term_b, start_b) in zip(ordered, ordered[1:]):
            if not start_a < start_b:
                raise ValueError(f"term {term_b} starts at {start_b}, not after term {term_a} at {start_a}")
        return cls(tuple(s for _, s in ordered), tuple(t for t, _ in ordered))

    def pairs(self) -> set[tuple[int, int]]:
        return set(zip(self.terms, self.starts))

    def term_at(self, index: int) -> int:
        """Term of the entry at index, which must lie in the log these runs describe."""
        return self.terms[bisect.bisect_right(self.starts, index) - 1]

    def first_index(self, term: int) -> int | None:
        k = self._find(term)
        return None if k is None else self.starts[k]

    def last_index(self, term: int, log_last_index: int) -> int | None:
        k = self._find(term)
        if k is None:
            return None
        return self.starts[k + 1] - 1 if k + 1 < len(self.starts) else log_last_index

    def truncated(self, from_index: int) -> TermRuns:
        """The runs once entries >= from_index are gone."""
        k = bisect.bisect_left(self.starts, from_index)
        return self if k == len(self.starts) else TermRuns(self.starts[:k], self.terms[:k])

    def extended(self, entries: Sequence[Entry]) -> TermRuns:
        """The runs once entries (contiguous, following the log) are appended."""
        last_term = self.terms[-1] if self.terms else None
        new_starts: list[int] = []
        new_terms: list[int] = []
        for e in entries:
            if e.term == last_term:
                continue
            if last_term is not None and e.term < last_term:
                raise ValueError(f"entry {e.index} has term {e.term}, below the preceding entry's term {last_term}")
            new_starts.append(e.index)
            new_terms.append(e.term)
            last_term = e.term
        if not new_starts:
            return self
        return TermRuns(self.starts + tuple(new_starts), self.terms + tuple(new_terms))

    def compacted(self, index: int, log_last_index: int) -> TermRuns:
        """The runs once entries <= index are gone from a log ending at log_last_index."""
        if index >= log_last_index:
            return TermRuns()
        k = bisect.bisect_right(self.starts, index + 1) - 1  # the run that now holds the first entry
        if k < 0:
            return self
        return TermRuns((index + 1,) + self.starts[k + 1 :], self.terms[k:])

    def _find(self, term: int) -> int | None:
        k = bisect.bisect_left(self.terms, term)
        return k if k < len(self.terms) and self.terms[k] == term else None
