"""RaftLog: the log as the core sees it — the driver's durable LogStore, plus entries and a
truncation the core has decided on that the driver has not yet persisted (etcd's "unstable").

The driver may keep stepping the core while it persists a Ready, so the view must stay right while
a write is in flight: entries handed out are still read from here until `stable_to` confirms them,
and a truncation decided meanwhile is simply the next Ready's `truncate_from`."""
from __future__ import annotations

from raft.core.log_store import LogStore
from raft.core.membership import Membership, MembershipLog
from raft.core.types import Entry, EntryType


class LogCompactedError(IndexError):
    """The entries asked for were compacted into a snapshot (possibly just now, by the driver's
    compaction running beside the core): the reader must fall back to a snapshot."""


class RaftLog:
    def __init__(self, store: LogStore) -> None:
        self.store = store
        # The configurations along the log, told of every CONFIG entry appended and every
        # truncation (the core sets it).
        self.configs: MembershipLog | None = None
        self._reload()

    def _reload(self) -> None:
        """Take the store as the whole truth (at start, and after a snapshot install)."""
        last = self.store.last_index()
        self._offset = last + 1  # index of _unstable[0]; entries below it come from the store
        self._unstable: list[Entry] = []
        self._pending_truncate: int | None = None
        self._handed_to = last  # highest index handed to the driver to persist
        self.persisted_index = last  # the store holds our view of the log up to here

    # --- reads ---

    def before_begin(self) -> tuple[int, int]:
        return self.store.before_begin()

    def last_index(self) -> int:
        return self._offset - 1 + len(self._unstable)

    def last_term(self) -> int:
        term = self.term(self.last_index())
        assert term is not None
        return term

    def term(self, index: int) -> int | None:
        if index >= self._offset:
            k = index - self._offset
            return self._unstable[k].term if k < len(self._unstable) else None
        return self.store.term(index)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries lo <= index < hi (hi clipped to the end), at least one if any, within max_bytes."""
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return []
        out: list[Entry] = []
        if lo < self._offset:
            if lo <= self.store.before_begin()[0]:
                raise LogCompactedError(f"entry {lo} is compacted")
            try:
                out = self.store.entries(lo, min(hi, self._offset), max_bytes)
            except IndexError as e:
                raise LogCompactedError(str(e)) from e
            if out and out[-1].index < min(hi, self._offset) - 1:
                return out  # the byte limit stopped the store read
            lo = self._offset
        size = sum(e.size() for e in out)
        for e in self._unstable[max(0, lo - self._offset): max(0, hi - self._offset)]:
            if out and max_bytes is not None and size + e.size() > max_bytes:
                break
            out.append(e)
            size += e.size()
        return out

    def first_index_of_term(self, term: int) -> int | None:
        found = self.store.first_index_of_term(term)
        if found is not None and found < self._offset:
            return found
        for e in self._unstable:
            if e.term == term:
                return e.index
            if e.term > term:
                break
        return None

    def last_index_of_term(self, term: int) -> int | None:
        for e in reversed(self._unstable):
            if e.term == term:
                return e.index
            if e.term < term:
                return None
        found = self.store.last_index_of_term(term)
        if found is not None and found >= self._offset:
            # The store's run reaches into entries a pending truncation removes.
            found = self._offset - 1 if self.store.term(self._offset - 1) == term else None
        return found

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: is a log ending at (last_index, last_term) at least as new as ours?"""
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    # --- changes (in memory; persisted through Ready) ---

    def append(self, entries: list[Entry]) -> None:
        if entries and entries[0].index != self.last_index() + 1:
            raise AssertionError(f"append at {entries[0].index} after end {self.last_index()}")
        self._unstable.extend(entries)
        if self.configs is not None:
            for e in entries:
                if e.type is EntryType.CONFIG:
                    self.configs.appended(e.index, Membership.decode(e.payload))

    def truncate_from(self, index: int) -> None:
        """Drop entries >= index."""
        if self.configs is not None:
            self.configs.truncated_from(index)
        on_disk = index < self._offset or index <= self._handed_to  # written, or being written
        if index >= self._offset:
            del self._unstable[index - self._offset:]
        else:
            self._unstable = []
            self._offset = index
        if on_disk:
            self._pending_truncate = index if self._pending_truncate is None else min(self._pending_truncate, index)
        self._handed_to = min(self._handed_to, index - 1)
        self.persisted_index = min(self.persisted_index, index - 1)

    def take_unpersisted(self) -> tuple[int | None, list[Entry]]:
        """What the next Ready must persist: a truncation point and the entries not yet handed out."""
        truncate, self._pending_truncate = self._pending_truncate, None
        start = max(self._handed_to + 1, self._offset)
        entries = self._unstable[start - self._offset:]
        if entries:
            self._handed_to = entries[-1].index
        return truncate, entries

    def stable_to(self, index: int, term: int) -> None:
        """The driver persisted entries up to (index, term). Ignored if a truncation since then
        replaced that entry."""
        if self._pending_truncate is not None and self._pending_truncate <= index:
            return  # a truncation decided during the write supersedes it; the next Ready redoes it
        if index >= self._offset and self.term(index) == term:
            del self._unstable[: index - self._offset + 1]
            self._offset = index + 1
        if self.term(index) == term:
            self.persisted_index = max(self.persisted_index, index)

    def has_unpersisted(self) -> bool:
        return self._pending_truncate is not None or self.last_index() > max(self._handed_to, self._offset - 1)

    def discard_unpersisted(self) -> None:
        """A snapshot install supersedes every change not yet on disk; the store is reread after it."""
        if self.configs is not None:
            self.configs.truncated_from(self._offset)
        self._unstable = []
        self._pending_truncate = None
        self._handed_to = self._offset - 1

    def reload_after_snapshot(self) -> None:
        self._reload()
