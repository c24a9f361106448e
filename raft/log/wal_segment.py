"""One segment file of the write-ahead log (wal_store.py): a preallocated file of records
(wal_records.py), named by its sequence number, appended to at its end and synced with one
fdatasync per write.

Preallocation (fallocate, as etcd's WAL does) makes a sync cheaper: writing inside space the file
already owns changes no file size, so fdatasync has no size update to carry. It also gives a torn
write away: a page never written reads as zeros.

A segment comes into being complete or not at all: it is written as a temporary file (SEGMENT
record, preallocated space, synced), renamed to its name, and the directory synced.
"""
from __future__ import annotations

import errno
import mmap
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from raft.log.wal_records import HEADER_SIZE, MAX_RECORD_BYTES, read_header, seal, segment_seed

SUFFIX = ".wal"
TEMP_SUFFIX = ".wal.tmp"
# A write into a full disk or past a quota fails with one of these: the log is full, not broken.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_SECTOR = 512


def segment_name(seq: int) -> str:
    return f"{seq:016x}{SUFFIX}"


def segment_seq(path: Path) -> int | None:
    """The sequence number a segment file's name carries; None for any other file."""
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
    if len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """An open segment file. `end` is where the next record goes (the scanned end when opened)."""

    def __init__(self, path: Path, seq: int, fd: int, size: int, end: int, tail_crc: int) -> None:
        self.path = path
        self.seq = seq
        self.fd = fd
        self.size = size  # bytes allocated
        self.end = end
        self.tail_crc = tail_crc  # crc of the last record: the next record chains to it

    @classmethod
    def create(cls, directory: Path, seq: int, first_record: bytes, size: int, *, fsync: bool) -> Segment:
        """A new segment of `size` bytes holding first_record (a SEGMENT body). Raises OSError
        (ENOSPC and friends when the disk is full) and leaves no file behind on failure."""
        data, crc = seal(first_record, segment_seed(seq))
        size = max(size, len(data))
        path = directory / segment_name(seq)
        temp = directory / f"{seq:016x}{TEMP_SUFFIX}"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            _write_all(fd, data, 0)
            if fsync:
                os.fdatasync(fd)
            os.rename(temp, path)
            if fsync:
                sync_directory(directory)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        return cls(path, seq, fd, size, len(data), crc)

    @classmethod
    def open(cls, path: Path, seq: int) -> Segment:
        fd = os.open(path, os.O_RDWR)
        return cls(path, seq, fd, os.fstat(fd).st_size, 0, segment_seed(seq))

    def room(self) -> int:
        return self.size - self.end

    def write(self, data: bytes, tail_crc: int) -> int:
        """Write records at the end (not yet synced); return the offset they start at. tail_crc
        is the last one's crc. On a failure the bytes that may have reached the file are zeroed
        again (best effort) and the segment is left as it was."""
        at = self.end
        try:
            _write_all(self.fd, data, at)
        except OSError:
            self._zero(at, len(data))
            raise
        self.end, self.tail_crc = at + len(data), tail_crc
        return at

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def cut_tail(self, fsync: bool) -> None:
        """Make everything from `end` on read as zeros again, keeping the allocation. Done to the
        last segment on every open: a torn write may have left any of its pages past the end
        (a lost page ends the replay cleanly when it held a record's start), and a later write
        must never find one of them following its records."""
        os.ftruncate(self.fd, self.end)
        os.posix_fallocate(self.fd, 0, self.size)
        if fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def _zero(self, at: int, length: int) -> None:
        try:
            _write_all(self.fd, bytes(min(length, max(self.size - at, 0))), at)
        except OSError:
            pass  # the chained checksums still keep whatever is left from passing as a record

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, end {self.end} of {self.size})"


def _write_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view, at = view[written:], at + written


class SegmentScan:
    """Reads a segment's records in order, checking each one's crc and the chain.

    Iterate for (offset, body) pairs (bodies are copies: the file is mapped only while read).
    When iteration stops, `end` is where the valid records end and `damage` says why a record
    there was refused (None at a clean end: a zero length or the end of the file). `torn` tells
    a torn write from damage to data that had been written whole.

    What a torn write looks like: a crash kept some pages of the last write from the disk, and
    those read as zeros (the file is preallocated, and everything past the log's end is zeroed on
    open). A damaged record whose header reached the disk but some later part did not therefore
    holds a sector, starting inside the record, that reads as zeros from its start to its end (or
    the end of the file): it was zeros before the write and the write never reached it. Record
    contents rarely give that (it takes 512 aligned zero bytes of payload at the tail of the log),
    where a trailing zero byte or two, or a flipped length, are common: those are damage. A
    length running past the file is damage too, since no write ever goes past it."""

    def __init__(self, fd: int, seq: int) -> None:
        self._fd = fd
        self._seed = segment_seed(seq)
        self.end = 0
        self.tail_crc = self._seed
        self.damage: str | None = None
        self.torn = False

    def records(self) -> Iterator[tuple[int, bytes]]:
        size = os.fstat(self._fd).st_size
        if size == 0:
            self.damage = "the file is empty"
            return
        with mmap.mmap(self._fd, size, access=mmap.ACCESS_READ) as buf:
            yield from self._walk(buf, size)

    def _walk(self, buf: mmap.mmap, size: int) -> Iterator[tuple[int, bytes]]:
        offset, prev = 0, self._seed
        while offset + HEADER_SIZE <= size:
            length, crc, stored_prev = read_header(buf, offset)
            if length == 0:
                break
            stop = offset + HEADER_SIZE + length
            problem = None
            if length > MAX_RECORD_BYTES or stop > size:
                problem = f"a record of {length} bytes runs past the end of the file"
            elif stored_prev != prev:
                problem = "the record does not follow the one before it"
            else:
                body = buf[offset + HEADER_SIZE: stop]
                if zlib.crc32(body, prev) != crc:
                    problem = "checksum mismatch"
            if problem is not None:
                self.end, self.tail_crc = offset, prev
                self.damage = f"{problem} at offset {offset}"
                self.torn = stop <= size and _has_lost_sector(buf, offset, stop, size)
                return
            yield offset, body
            prev, offset = crc, stop
        self.end, self.tail_crc = offset, prev


def _has_lost_sector(buf: mmap.mmap, start: int, stop: int, size: int) -> bool:
    """Whether a 512-byte sector beginning inside the record [start, stop) reads all zeros, up to
    its end or the file's: a sector the record's write never brought to the disk."""
    sector = start - start % _SECTOR + _SECTOR
    while sector < stop:
        end = min(sector + _SECTOR, size)
        if buf[sector:end] == bytes(end - sector):
            return True
        sector += _SECTOR
    return False
