"""The LogStore interface the core reads its stable log through, and an in-memory store for the
simulator and tests. The core only reads; the driver writes what each Ready asks for (one call to
`save` per Ready, which an on-disk store makes one fsynced transaction).

Indexes start at 1. The log holds entries (before_begin_index, last_index]; the entry at
before_begin_index was compacted into a snapshot but its term is kept, so a COMPARE at the
boundary still works (DLedger loses that term on restart; we persist it)."""
from __future__ import annotations

import bisect
from typing import Protocol, Sequence

from raft.core.types import Entry, HardState


class LogStore(Protocol):
    def hard_state(self) -> HardState: ...

    def before_begin(self) -> tuple[int, int]:
        """(index, term) of the last compacted entry; (0, 0) for a log never compacted."""
        ...

    def last_index(self) -> int:
        """Index of the last entry, or before_begin index when the log holds none."""
        ...

    def term(self, index: int) -> int | None:
        """Term of the entry at index; the before_begin term at its index; None when the index is
        compacted away or past the end."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries with lo <= index < hi, stopping (after at least one) once max_bytes is passed.
        lo must be above before_begin index."""
        ...

    def first_index_of_term(self, term: int) -> int | None:
        """First index holding `term` (terms never decrease along a log, so each term is one run)."""
        ...

    def last_index_of_term(self, term: int) -> int | None: ...

    # --- writes: the driver's, never the core's ---

    def save(self, hard_state: HardState | None, truncate_from: int | None, entries: Sequence[Entry]) -> None:
        """Durably, in one transaction: set the hard state, drop entries >= truncate_from, append."""
        ...

    def compact(self, index: int) -> None:
        """Drop entries <= index (which must be in the log) and make it the before_begin point."""
        ...

    def reset_to_snapshot(self, index: int, term: int) -> None:
        """After installing a snapshot at (index, term): keep the tail after it if the log holds
        that entry with that term, otherwise drop every entry. before_begin becomes (index, term)."""
        ...


class MemoryLogStore:
    """A LogStore kept in a list. `save` counts as durable the moment it returns."""

    def __init__(self) -> None:
        self._hard_state = HardState()
        self._before_index = 0
        self._before_term = 0
        self._entries: list[Entry] = []  # _entries[k].index == _before_index + 1 + k

    # reads
    def hard_state(self) -> HardState:
        return self._hard_state

    def before_begin(self) -> tuple[int, int]:
        return self._before_index, self._before_term

    def last_index(self) -> int:
        return self._before_index + len(self._entries)

    def term(self, index: int) -> int | None:
        if index == self._before_index:
            return self._before_term
        k = index - self._before_index - 1
        if 0 <= k < len(self._entries):
            return self._entries[k].term
        return None

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        if lo <= self._before_index:
            raise IndexError(f"entry {lo} is compacted (log begins after {self._before_index})")
        start, stop = lo - self._before_index - 1, min(hi, self.last_index() + 1) - self._before_index - 1
        out = self._entries[start:stop]
        if max_bytes is None:
            return list(out)
        taken, size = [], 0
        for e in out:
            if taken and size + e.size() > max_bytes:
                break
            taken.append(e)
            size += e.size()
        return taken

    def _terms(self) -> list[int]:
        return [e.term for e in self._entries]

    def first_index_of_term(self, term: int) -> int | None:
        if term == self._before_term and self._before_index > 0 and (not self._entries or self._entries[0].term >= term):
            # The run may have started inside the snapshot; the boundary is the first we know.
            return self._before_index
        terms = self._terms()
        k = bisect.bisect_left(terms, term)
        if k < len(terms) and terms[k] == term:
            return self._before_index + 1 + k
        return None

    def last_index_of_term(self, term: int) -> int | None:
        terms = self._terms()
        k = bisect.bisect_right(terms, term) - 1
        if k >= 0 and terms[k] == term:
            return self._before_index + 1 + k
        if term == self._before_term and self._before_index > 0:
            return self._before_index
        return None

    # writes
    def save(self, hard_state: HardState | None, truncate_from: int | None, entries: Sequence[Entry]) -> None:
        # Check everything before changing anything: a refused save writes nothing.
        end = self.last_index()
        if truncate_from is not None:
            if truncate_from <= self._before_index:
                raise ValueError(f"cannot truncate at {truncate_from}: compacted through {self._before_index}")
            end = min(end, truncate_from - 1)
        for k, e in enumerate(entries):
            if e.index != end + 1 + k:
                raise ValueError(f"entry {e.index} does not follow the log's end {end + k}")
        if hard_state is not None:
            self._hard_state = hard_state
        if truncate_from is not None:
            del self._entries[truncate_from - self._before_index - 1 :]
        self._entries.extend(entries)

    def compact(self, index: int) -> None:
        term = self.term(index)
        if term is None:
            raise ValueError(f"cannot compact at {index}: not in the log")
        del self._entries[: index - self._before_index]
        self._before_index, self._before_term = index, term

    def reset_to_snapshot(self, index: int, term: int) -> None:
        if self.term(index) == term and index >= self._before_index:
            self.compact(index)
        else:
            self._entries = []
        self._before_index, self._before_term = index, term
