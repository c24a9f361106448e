"""Where each entry of the write-ahead log lies on disk: (segment, offset, record length) by
index, in three flat arrays (24 bytes an entry, where a tuple per entry would cost 100)."""
from __future__ import annotations

from array import array


class EntryLocations:
    """Locations of the entries first..last, contiguous. Empty, it still knows where the next
    entry's index starts (`first`)."""

    def __init__(self, first: int = 1) -> None:
        self.first = first
        self._seq = array("Q")
        self._offset = array("Q")
        self._length = array("I")

    def __len__(self) -> int:
        return len(self._seq)

    @property
    def last(self) -> int:
        """Index of the last entry (first - 1 when empty)."""
        return self.first + len(self._seq) - 1

    def append(self, index: int, seq: int, offset: int, length: int) -> None:
        if index != self.last + 1:
            raise ValueError(f"entry {index} does not follow {self.last}")
        self._seq.append(seq)
        self._offset.append(offset)
        self._length.append(length)

    def locate(self, index: int) -> tuple[int, int, int]:
        """(segment seq, offset, record length) of the entry at index, which must be held."""
        k = index - self.first
        if not 0 <= k < len(self._seq):
            raise IndexError(f"entry {index} is not in {self.first}..{self.last}")
        return self._seq[k], self._offset[k], self._length[k]

    def reset(self, first: int) -> None:
        """Forget every entry; the next one will be `first`."""
        self.first = first
        del self._seq[:], self._offset[:], self._length[:]

    def truncate_from(self, index: int) -> None:
        """Forget entries >= index (all of them, and start again at index, when index < first)."""
        if index < self.first:
            self.reset(index)
            return
        k = index - self.first
        del self._seq[k:], self._offset[k:], self._length[k:]

    def drop_through(self, index: int) -> None:
        """Forget entries <= index; the log then begins after it."""
        if index >= self.last:
            self.reset(max(index + 1, self.first))
            return
        k = index - self.first + 1
        if k > 0:
            del self._seq[:k], self._offset[:k], self._length[:k]
            self.first = index + 1

    def oldest_segment(self) -> int | None:
        """Sequence number of the segment holding the first entry; None when empty."""
        return self._seq[0] if self._seq else None
