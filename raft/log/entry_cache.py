"""The write-ahead log's cache of recent entries: the leader sends and applies entries right after
writing them, so those are served from memory instead of a pread and a checksum each. It holds a
suffix of the log, contiguous, up to a byte budget."""
from __future__ import annotations

from typing import Sequence

from raft.core.types import Entry


class EntryCache:
    def __init__(self, budget_bytes: int) -> None:
        self._budget = budget_bytes
        self._entries: list[Entry] = []  # _entries[k].index == _first + k
        self._first = 1
        self._size = 0

    def get(self, index: int) -> Entry | None:
        k = index - self._first
        return self._entries[k] if 0 <= k < len(self._entries) else None

    def add(self, entries: Sequence[Entry]) -> None:
        """Entries just appended to the log (after any truncation was applied here too)."""
        if not entries:
            return
        if not self._entries or self._first + len(self._entries) != entries[0].index:
            self._entries, self._first, self._size = [], entries[0].index, 0
        self._entries.extend(entries)
        self._size += sum(e.size() for e in entries)
        if self._size > self._budget:
            # Trim to three quarters, so the list's front is cut once per many saves.
            drop, freed = 0, 0
            while drop < len(self._entries) - 1 and self._size - freed > self._budget * 3 // 4:
                freed += self._entries[drop].size()
                drop += 1
            self._cut_front(drop, freed)

    def drop_from(self, index: int) -> None:
        """Forget entries >= index (a truncation)."""
        k = max(index - self._first, 0)
        if k < len(self._entries):
            self._size -= sum(e.size() for e in self._entries[k:])
            del self._entries[k:]

    def drop_through(self, index: int) -> None:
        """Forget entries <= index (a compaction)."""
        k = min(index - self._first + 1, len(self._entries))
        if k > 0:
            self._cut_front(k, sum(e.size() for e in self._entries[:k]))

    def clear(self) -> None:
        self._entries, self._size = [], 0

    def _cut_front(self, count: int, size: int) -> None:
        del self._entries[:count]
        self._first += count
        self._size -= size
