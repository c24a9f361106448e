"""What the write-ahead log store (raft/log/wal_store.py) promises beyond the LogStore conformance
suite that every store passes in test_log_store.py: durability across reopen and segment
rotation, torn-write recovery, corruption detection, the size cap and a full disk, snapshots,
concurrent reads, a real process crash, the read cache, and reopening a large log.

Every test runs the real store on real files under tmp_path. Damage is done to the files the way a
crash or a bad disk would do it, at places found by parsing the segment format (wal_records.py)
here, independently of the store's own reader.
"""
from __future__ import annotations

import errno
import json
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from raft.core.log_store import MemoryLogStore
from raft.core.types import Entry, EntryType, HardState
from raft.log import LogCorruptionError, LogFullError, WalLogStore
from tests.unit.test_log_store import run

REPO = Path(__file__).resolve().parents[2]
SMALL_SEGMENT = 64 << 10  # the smallest segment the store makes: rotations come quickly
SECTOR = 512
PAGE = 4096
REMOVE_HINT = "remove its data directory"  # what every LogCorruptionError tells the operator

# --- the segment format, read here without the store (see wal_records.py) ---

_HEADER = struct.Struct("<III")  # length (of kind + fields), crc, prev_crc
_ENTRY_FIELDS = struct.Struct("<BQQB")  # kind, index, term, entry type
_SEGMENT_FIELDS = struct.Struct("<B4sIQQQQQ")  # kind, magic, version, seq, first index, before index/term, term
HEADER_SIZE = _HEADER.size
ENTRY_RECORD_OVERHEAD = HEADER_SIZE + _ENTRY_FIELDS.size  # an ENTRY record's bytes besides its payload
BOUNDARY_RECORD_SIZE = HEADER_SIZE + 17  # kind, index, term
KIND_SEGMENT, KIND_STATE, KIND_TRUNCATE, KIND_ENTRY, KIND_BOUNDARY = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Record:
    """One record of a segment file: where it lies, its kind, and the index of an ENTRY record."""

    offset: int
    size: int  # header and body
    kind: int
    index: int | None

    @property
    def stop(self) -> int:
        return self.offset + self.size


def segment_files(path: Path) -> list[Path]:
    """The log's segment files, oldest first (`*.wal`, never the `*.wal.tmp` of a creation)."""
    return sorted(path.glob("*.wal"))


def seq_of(segment: Path) -> int:
    return int(segment.name[:16], 16)


def segment_seqs(path: Path) -> list[int]:
    return [seq_of(p) for p in segment_files(path)]


def segment_path(path: Path, seq: int) -> Path:
    return path / f"{seq:016x}.wal"


def read_records(segment: Path) -> list[Record]:
    """The valid records at the start of a segment file: each one's crc checked and chained to the
    one before (the first to the seed drawn from the sequence number), up to a zero length or the
    first record that fails."""
    data = segment.read_bytes()
    prev = zlib.crc32(struct.pack("<Q", seq_of(segment)))
    found: list[Record] = []
    offset = 0
    while offset + HEADER_SIZE <= len(data):
        length, crc, stored_prev = _HEADER.unpack_from(data, offset)
        body = data[offset + HEADER_SIZE: offset + HEADER_SIZE + length]
        if length == 0 or len(body) != length or stored_prev != prev or zlib.crc32(body, prev) != crc:
            break
        index = _ENTRY_FIELDS.unpack_from(body)[1] if body[0] == KIND_ENTRY else None
        found.append(Record(offset, HEADER_SIZE + length, body[0], index))
        prev, offset = crc, offset + HEADER_SIZE + length
    return found


def entry_records(segment: Path) -> list[Record]:
    return [r for r in read_records(segment) if r.kind == KIND_ENTRY]


def live_entry_segments(path: Path) -> dict[int, int]:
    """Index -> sequence number of the segment holding its newest ENTRY record: after a
    truncation the re-appended entry comes later in the log and wins, as in a replay."""
    where: dict[int, int] = {}
    for segment in segment_files(path):
        for record in entry_records(segment):
            assert record.index is not None
            where[record.index] = seq_of(segment)
    return where


def flip_byte(file: Path, offset: int, mask: int = 0x01) -> None:
    """Change one byte in place, as a bad disk or a stray write would."""
    with open(file, "r+b") as f:
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([old ^ mask]))


def zero(file: Path, start: int, stop: int) -> None:
    """Make [start, stop) read as zeros: what a page that never reached the disk looks like in a
    preallocated file."""
    with open(file, "r+b") as f:
        f.seek(start)
        f.write(bytes(stop - start))


def room_in(segment: Path) -> int:
    """Bytes left after a segment's last record."""
    return segment.stat().st_size - read_records(segment)[-1].stop



def is_zero_after(file: Path, offset: int) -> bool:
    data = file.read_bytes()
    return data[offset:] == bytes(len(data) - offset)


# --- entries and expectations ---

def numbered(first: int, terms: Sequence[int], size: int = 1000) -> list[Entry]:
    """Entries first, first+1, ... with the given terms and `size`-byte payloads that name their
    index and term, so that a stale or misplaced entry can never pass for the right one."""
    return [
        Entry(first + k, t, EntryType.NOOP if (first + k) % 5 == 1 else EntryType.NORMAL,
              (f"entry-{first + k}-term-{t};".encode() * (size // 8 + 1))[:size])
        for k, t in enumerate(terms)
    ]


def names_itself(entry: Entry) -> bool:
    """Whether a payload made by numbered() carries this entry's own index and term."""
    return entry.payload.split(b";")[0] == f"entry-{entry.index}-term-{entry.term}".encode()


def apply(stores: Sequence[object], method: str, *args: object) -> None:
    """The same write on each store: the WalLogStore under test and a MemoryLogStore as the model."""
    for s in stores:
        getattr(s, method)(*args)


def assert_same_log(store: WalLogStore, model: MemoryLogStore) -> None:
    """Every read of the store answers as the in-memory model does."""
    assert store.hard_state() == model.hard_state()
    assert store.before_begin() == model.before_begin()
    before, last = model.before_begin()[0], model.last_index()
    assert store.last_index() == last
    assert store.entries(before + 1, last + 1) == model.entries(before + 1, last + 1)
    for index in range(max(0, before - 2), last + 3):
        assert store.term(index) == model.term(index), index
    terms = {e.term for e in model.entries(before + 1, last + 1)} | {model.before_begin()[1]}
    for term in terms | {0, max(terms) + 1}:
        assert store.first_index_of_term(term) == model.first_index_of_term(term), term
        assert store.last_index_of_term(term) == model.last_index_of_term(term), term


def open_small(path: Path, **kwargs: object) -> WalLogStore:
    """A store with 64 KiB segments. fsync=False unless asked: within one process the page cache
    makes a reopen see every write either way, and these tests are about what is written."""
    options: dict[str, object] = {"segment_bytes": SMALL_SEGMENT, "fsync": False}
    options.update(kwargs)
    return WalLogStore(path, **options)  # type: ignore[arg-type]


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a script in a fresh Python process from the repository root (so `raft` and `tests`
    import), failing the test with its stderr if it fails."""
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done


# --- 1. durability across reopen and rotation ---

def test_everything_survives_reopen_across_rotations_truncation_and_compaction(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    model = MemoryLogStore()
    store = open_small(path)
    counts = []
    for first in range(1, 401, 10):  # 400 entries of 1000 B: about six 64 KiB segments
        term = 1 + (first - 1) // 100
        apply((store, model), "save", HardState(term, f"n{term}"), None, numbered(first, [term] * 10))
        counts.append(len(segment_files(path)))
    # Rotation adds one file at a time, the old ones stay, and sequence numbers have no gaps.
    assert counts == sorted(counts) and all(b - a <= 1 for a, b in zip(counts, counts[1:]))
    assert counts[0] == 1 and counts[-1] >= 5
    assert segment_seqs(path) == list(range(counts[-1]))

    # A truncation reaching back into a sealed segment: the new entries go to the current one.
    assert live_entry_segments(path)[255] < segment_seqs(path)[-1]
    apply((store, model), "save", HardState(5, "n5"), 255, numbered(255, [5] * 20))
    assert_same_log(store, model)
    store.close()
    store = open_small(path)
    assert_same_log(store, model)

    # Compaction deletes the segments that hold only entries up to its point, and no other.
    keep_from = live_entry_segments(path)[151]
    assert keep_from > 0 and room_in(segment_files(path)[-1]) >= BOUNDARY_RECORD_SIZE  # no rotation now
    apply((store, model), "compact", 150)
    assert segment_seqs(path) == [s for s in range(counts[-1]) if s >= keep_from]
    store.close()
    store = open_small(path)
    assert_same_log(store, model)
    assert segment_seqs(path) == [s for s in range(counts[-1]) if s >= keep_from]  # a reopen deletes nothing

    # Compacting the whole log leaves only the current segment, which must stay: it is written next.
    current = segment_seqs(path)[-1]
    assert room_in(segment_files(path)[-1]) >= BOUNDARY_RECORD_SIZE
    apply((store, model), "compact", model.last_index())
    assert segment_seqs(path) == [current]
    store.close()
    store = open_small(path)
    assert_same_log(store, model)
    for first in range(model.last_index() + 1, model.last_index() + 101, 10):
        apply((store, model), "save", None, None, numbered(first, [6] * 10))
    assert segment_seqs(path)[0] == current and len(segment_files(path)) > 1
    store.close()
    with open_small(path) as store:
        assert_same_log(store, model)


# --- 2. a torn last write ---

def log_with_final_save(path: Path) -> tuple[Path, list[Record]]:
    """A log of entries 1..70 (hard state (1, n1)) over two segments, then a final save of hard
    state (2, n2) and entries 71..82 of 1000 B (about three pages) into the second. Returns the
    last segment and the final save's records, a STATE record then twelve ENTRY records."""
    with open_small(path) as store:
        for first in range(1, 71, 10):
            store.save(HardState(1, "n1"), None, numbered(first, [1] * 10))
        assert len(segment_files(path)) == 2
        last = segment_files(path)[-1]
        before = read_records(last)
        store.save(HardState(2, "n2"), None, numbered(71, [2] * 12))
        assert segment_files(path)[-1] == last  # the final save did not start a new segment
        final = read_records(last)[len(before):]
    assert [r.kind for r in final] == [KIND_STATE] + [KIND_ENTRY] * 12
    return last, final


def zeroed_page_inside(final: list[Record]) -> tuple[int, int]:
    """A 4 KiB-aligned page within the final save's entries that does not begin at a record (a
    page beginning exactly at a record is the case of the test after this one)."""
    starts = {r.offset for r in final}
    first_page = -(-final[1].offset // PAGE) * PAGE
    page = next(p for p in range(first_page, final[-1].stop - PAGE + 1, PAGE) if p not in starts)
    return page, page + PAGE


def zeroed_tail_of_last_record(final: list[Record]) -> tuple[int, int]:
    """From the first sector boundary inside the last record to its end: the record was cut short."""
    last = final[-1]
    start = (last.offset // SECTOR + 1) * SECTOR
    assert start < last.stop
    return start, last.stop


def zeroed_after_first_record(final: list[Record]) -> tuple[int, int]:
    """Everything the final save wrote after its first record (the STATE) never reached the disk."""
    return final[1].offset, final[-1].stop


@pytest.mark.parametrize("damage", [zeroed_page_inside, zeroed_tail_of_last_record, zeroed_after_first_record],
                         ids=["page-inside-the-write", "tail-of-last-record", "all-after-first-record"])
def test_a_torn_last_write_ends_the_log_before_the_damage(
    tmp_path: Path, damage: Callable[[list[Record]], tuple[int, int]]
) -> None:
    path = tmp_path / "wal"
    last_segment, final = log_with_final_save(path)
    size = last_segment.stat().st_size
    start, stop = damage(final)
    zero(last_segment, start, stop)

    # The log must end right before the first record the zeros reach; earlier ones stay whole.
    damaged = next(k for k, r in enumerate(final) if r.stop > start)
    survivors = final[:damaged]
    expected_last = max([70] + [r.index for r in survivors if r.index is not None])
    expected_state = HardState(2, "n2") if survivors else HardState(1, "n1")
    expected = numbered(1, [1] * 70) + numbered(71, [2] * 12)
    with open_small(path) as store:
        assert store.last_index() == expected_last
        assert store.hard_state() == expected_state
        assert store.entries(1, 200) == expected[:expected_last]
        # The replay zeroed the rest of the segment and kept its allocation: nothing of the torn
        # write can be read as a record later, whatever is written next.
        replayed_end = read_records(last_segment)[-1].stop
        assert replayed_end == final[damaged].offset
        assert is_zero_after(last_segment, replayed_end)
        assert last_segment.stat().st_size == size
        # New writes go on from there and survive the next reopen, exactly.
        store.save(HardState(3, "n3"), None, numbered(expected_last + 1, [3] * 3, size=300))
    with open_small(path) as store:
        assert store.last_index() == expected_last + 3
        assert store.hard_state() == HardState(3, "n3")
        assert store.entries(1, 200) == expected[:expected_last] + numbered(expected_last + 1, [3] * 3, size=300)


@pytest.mark.parametrize("resent", ["same-entry", "entry-of-a-new-term"])
def test_a_torn_page_beginning_exactly_at_a_record_leaves_no_stale_records(tmp_path: Path, resent: str) -> None:
    """A crash can lose a page that begins exactly where a record begins. The replay then sees a
    zero length, a clean end, before the torn write's later records, which did reach the disk.
    Those stale records must not come back: the log after the next save and reopen must be
    exactly what the store acknowledged, whatever that save wrote. (Today the replay zeroes the
    tail only after a damaged record, not after a clean end, so resending the same entry 3
    brings entries 4 and 5 back, and a different entry 3 makes the next open fail with
    LogCorruptionError on the stale entry 4.)"""
    path = tmp_path / "wal"
    segment = segment_path(path, 0)
    with open_small(path) as store:
        # Entry 1 ends exactly at 4 KiB, then four entries of exactly one page each.
        store.save(None, None, [Entry(1, 1, EntryType.NORMAL, b"a" * (PAGE - read_records(segment)[0].stop
                                                                      - ENTRY_RECORD_OVERHEAD))])
        store.save(None, None, [Entry(i, 1, EntryType.NORMAL, b"b" * (PAGE - ENTRY_RECORD_OVERHEAD))
                                for i in range(2, 6)])
    assert [r.offset for r in entry_records(segment)][1:] == [PAGE, 2 * PAGE, 3 * PAGE, 4 * PAGE]
    zero(segment, 2 * PAGE, 3 * PAGE)  # entry 3's page never reached the disk; 4 and 5 did

    with open_small(path) as store:
        assert store.last_index() == 2
        entry_3 = (Entry(3, 1, EntryType.NORMAL, b"b" * (PAGE - ENTRY_RECORD_OVERHEAD)) if resent == "same-entry"
                   else Entry(3, 2, EntryType.NORMAL, b"c" * (PAGE - ENTRY_RECORD_OVERHEAD)))
        store.save(None, None, [entry_3])  # e.g. the leader sends entry 3 again
        assert store.last_index() == 3
        acknowledged = store.entries(1, 10)
    with open_small(path) as store:
        assert store.last_index() == 3  # not 5: entries 4 and 5 were never part of the log again
        assert store.entries(1, 10) == acknowledged


# --- 3. corruption that is not a torn write ---

@dataclass(frozen=True)
class Damage:
    """One changed byte: in which segment, in which of its ENTRY records, where in the record."""

    payload_size: int
    segment: int  # 0: the first (sealed) segment, -1: the last one
    pick: Callable[[list[Record]], Record]
    at: Callable[[Record], int]  # offset within the record
    mask: int = 0x01


def middle(record: Record) -> int:
    return record.size // 2


def high_byte_of_length(record: Record) -> int:
    return 3  # the length u32 is little-endian: byte 3 is its top byte


def ends_in_a_new_sector_by_zero_bytes(records: list[Record]) -> Record:
    """An entry record, not the last, whose last few bytes spill into the next sector. With an
    empty payload a record ends in its term's zero high bytes and the zero entry type, so its
    part in that sector is all zeros although the record was written whole."""
    return next(r for r in records[:-1] if 0 < r.stop % SECTOR <= 8)


DAMAGES = {
    "last-segment-early-record": Damage(1000, -1, lambda rs: rs[1], middle),
    "last-segment-last-record": Damage(1000, -1, lambda rs: rs[-1], middle),
    "sealed-segment-record": Damage(1000, 0, lambda rs: rs[len(rs) // 2], middle),
    "sealed-segment-length-field": Damage(1000, 0, lambda rs: rs[len(rs) // 2], high_byte_of_length, 0x80),
    "last-segment-length-field": Damage(1000, -1, lambda rs: rs[1], high_byte_of_length, 0x80),
    "last-segment-record-ending-in-zero-bytes": Damage(0, -1, ends_in_a_new_sector_by_zero_bytes,
                                                       lambda r: HEADER_SIZE + 1),  # its index
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_damage_that_is_not_a_torn_write_refuses_to_open(tmp_path: Path, damage: Damage) -> None:
    """One changed byte in a record that was written whole, followed by valid records (or, for the
    last record, with no zero sector in it): a bad disk, not a crash. Dropping the records after
    it would silently lose acknowledged entries, so the store must refuse to open, leave the file
    as it is, and tell the operator what to do. (Today the last two cases pass for torn writes:
    SegmentScan treats any record whose length runs past the file, or that has an all-zero piece
    in some sector, as torn, and the replay drops it and every later record.)"""
    path = tmp_path / "wal"
    # At least two segments either way: 120 records of 1 KiB, or 4000 of 30 bytes.
    count, batch = (4000, 100) if damage.payload_size == 0 else (120, 10)
    with open_small(path) as store:
        for first in range(1, count + 1, batch):
            store.save(HardState(1, "n1"), None,
                       [Entry(i, 1, EntryType.NORMAL, b"x" * damage.payload_size) for i in range(first, first + batch)])
    assert len(segment_files(path)) >= 2
    segment = segment_files(path)[damage.segment]
    record = damage.pick(entry_records(segment))
    flip_byte(segment, record.offset + damage.at(record), damage.mask)
    damaged_bytes = segment.read_bytes()

    with pytest.raises(LogCorruptionError) as info:
        open_small(path)
    assert str(path) in str(info.value) and REMOVE_HINT in str(info.value)
    assert segment.read_bytes() == damaged_bytes  # no "repair": the evidence stays on disk


def test_a_damaged_entry_found_on_read_fails_every_later_call(tmp_path: Path) -> None:
    """The replay at open checks every record; damage that appears afterwards is caught when the
    entry is read back from disk, and from then on the store serves and writes nothing."""
    path = tmp_path / "wal"
    with open_small(path) as store:
        for first in range(1, 201, 10):
            store.save(HardState(1, "n1"), None, numbered(first, [1] * 10))
    assert len(segment_files(path)) >= 3
    first_segment = segment_files(path)[0]
    (victim,) = [r for r in entry_records(first_segment) if r.index == 5]
    with open_small(path, cache_bytes=4096) as store:  # a fresh open: entry 5 is read from disk
        assert store.entries(1, 10) == numbered(1, [1] * 9)
        flip_byte(first_segment, victim.offset + middle(victim))
        with pytest.raises(LogCorruptionError) as info:
            store.entries(3, 8)
        assert info.value.index == 5
        assert "entry 5" in str(info.value) and REMOVE_HINT in str(info.value)
        later_calls: list[Callable[[], object]] = [
            store.hard_state, store.before_begin, store.last_index, lambda: store.term(100),
            lambda: store.first_index_of_term(1), lambda: store.last_index_of_term(1),
            lambda: store.entries(100, 101), lambda: store.save(None, None, numbered(201, [1])),
            lambda: store.compact(100), lambda: store.reset_to_snapshot(300, 2),
        ]
        for call in later_calls:
            with pytest.raises(LogCorruptionError):
                call()


# --- 4. missing and foreign segment files ---

@pytest.mark.parametrize("which", ["first", "middle"])
def test_a_missing_segment_is_corruption(tmp_path: Path, which: str) -> None:
    """A segment deleted while its entries are still in the log leaves a gap the replay must see."""
    path = tmp_path / "wal"
    with open_small(path) as store:
        for first in range(1, 301, 10):
            store.save(HardState(1, "n1"), None, numbered(first, [1] * 10))
    assert len(segment_files(path)) >= 4
    segment_files(path)[0 if which == "first" else 2].unlink()  # its entries were never compacted
    with pytest.raises(LogCorruptionError) as info:
        open_small(path)
    assert "missing" in str(info.value) and REMOVE_HINT in str(info.value)


@pytest.mark.parametrize("position", ["before-the-others", "after-the-others"])
def test_a_garbage_file_named_like_a_segment_is_corruption(tmp_path: Path, position: str) -> None:
    """A file the store never wrote (no SEGMENT record, no zeros) must not be replayed, nor
    deleted as if it were a segment whose creation a crash cut short. (Today, named after the
    others, it is taken for a last segment torn at birth and deleted without a word.)"""
    path = tmp_path / "wal"
    with open_small(path) as store:
        for first in range(1, 201, 10):
            store.save(HardState(1, "n1"), None, numbered(first, [1] * 10))
        store.compact(150)  # segment 0 is deleted, so a file may be named below the others
    seqs = segment_seqs(path)
    assert seqs[0] > 0
    garbage = segment_path(path, 0 if position == "before-the-others" else seqs[-1] + 1)
    garbage.write_bytes(b"not a raftkv log segment\n" * 4000)
    with pytest.raises(LogCorruptionError) as info:
        open_small(path)
    assert REMOVE_HINT in str(info.value)
    assert garbage.exists()


# --- 5. leftovers of an interrupted segment creation ---

def test_leftover_temporary_segments_are_removed_on_open(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    with open_small(path) as store:
        store.save(HardState(1, "n1"), None, numbered(1, [1] * 40))
    seqs = segment_seqs(path)
    # A crash between creating a segment's temporary file and renaming it leaves one of these;
    # one has the sequence number the next rotation will use.
    leftovers = [path / f"{seqs[-1] + 1:016x}.wal.tmp", path / f"{seqs[-1] + 7:016x}.wal.tmp"]
    for leftover in leftovers:
        leftover.write_bytes(b"half-made segment" * 1000)
    with open_small(path) as store:
        assert not any(p.exists() for p in leftovers)
        assert segment_seqs(path) == seqs
        assert store.entries(1, 100) == numbered(1, [1] * 40)
        store.save(None, None, numbered(41, [1] * 80))  # rotates into the leftover's sequence number
    assert segment_seqs(path)[-1] > seqs[-1]
    with open_small(path) as store:
        assert store.entries(1, 200) == numbered(1, [1] * 120)


# --- 6. the size cap and a full disk ---

def test_max_bytes_refuses_a_save_with_nothing_stored_until_compaction_frees_segments(tmp_path: Path) -> None:
    """A save that needs a segment past max_bytes raises LogFullError and changes nothing, in memory
    or on disk; compaction deletes segments and saves work again."""
    path = tmp_path / "wal"
    cap = 1 << 20  # segments of cap // 8 = 128 KiB: eight fit
    with WalLogStore(path, max_bytes=cap, fsync=False) as store:
        store.save(HardState(1, "n1"), None, run(1, [1]))
        index = 2
        with pytest.raises(LogFullError) as info:
            while index < 10_000:  # 1 MiB cannot hold 10k entries of 4 KiB
                store.save(HardState(index, "n1"), None, run(index, [1], payload_size=4096))
                index += 1
        assert "full" in str(info.value) and "StorageConfig.log_max_bytes" in str(info.value)
        assert len(segment_files(path)) == 8 and store.size_bytes() <= cap
        # Nothing of the refused save (entry `index`, hard state term `index`) was applied...
        assert store.last_index() == index - 1
        assert store.hard_state() == HardState(index - 1, "n1")
        assert store.entries(index, index + 1) == []
        # ...and reads still work.
        assert store.entries(1, index) == run(1, [1]) + run(2, [1] * (index - 2), payload_size=4096)
    with WalLogStore(path, max_bytes=cap, fsync=False) as store:  # nor written to disk
        assert store.last_index() == index - 1
        assert store.hard_state() == HardState(index - 1, "n1")
        store.compact(index - 10)
        assert len(segment_files(path)) <= 2  # the segments below the point are gone
        for k in range(index, index + 100):  # saves work again, into new segments
            store.save(None, None, run(k, [1], payload_size=4096))
        assert store.entries(index - 9, index + 100) == run(index - 9, [1] * 109, payload_size=4096)


def test_compaction_works_when_the_log_is_full_and_its_last_segment_has_no_room(tmp_path: Path) -> None:
    """Compaction is how a full log gets space back, so it must not itself need a new segment when
    the log is at its cap. Entries sized so that records fill each segment to its last byte
    leave no room there for the BOUNDARY record compaction writes. (Today compact() raises
    LogFullError here: _compact_to writes the BOUNDARY through _write, which needs a new segment
    and checks the cap, so a full log can never be compacted.)"""
    path = tmp_path / "wal"
    cap = 1 << 20
    segment_size = cap // 8
    vote = "n1"
    # A SEGMENT record ends with the vote (a flag byte, then the name); 32 entry records of this
    # size fill the rest of a segment exactly.
    segment_record = HEADER_SIZE + _SEGMENT_FIELDS.size + 1 + len(vote)
    record_size = (segment_size - segment_record) // 32
    assert segment_record + 32 * record_size == segment_size
    with WalLogStore(path, max_bytes=cap, fsync=False) as store:
        store.save(HardState(1, vote), None, [])
        index = 1
        with pytest.raises(LogFullError):
            while index < 10_000:
                store.save(None, None, run(index, [1], payload_size=record_size - ENTRY_RECORD_OVERHEAD))
                index += 1
        last = segment_files(path)[-1]
        assert read_records(last)[-1].stop == last.stat().st_size  # the premise: not a byte left
        store.compact(index - 1)
        store.save(None, None, run(index, [1]))
        assert store.entries(index, index + 1) == run(index, [1])


FULL_DISK_SCRIPT = """
import json, resource, signal, sys
from pathlib import Path
from raft.core.types import HardState
from raft.log import LogFullError, WalLogStore
from tests.unit.test_log_store import run
from tests.unit.test_wal_store import read_records, segment_files

path, case = sys.argv[1], sys.argv[2]
store = WalLogStore(path, segment_bytes=64 << 10, fsync=True)
store.save(HardState(1, "n1"), None, run(1, [1] * 10, payload_size=1000))  # 10 KiB of a 64 KiB segment
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG back instead of being killed
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
if case == "new-segment":
    # No file may pass 64 KiB: writes into the current segment still fit, a new 60 KiB save does
    # not fit its room and needs a new segment of twice its size, which the kernel refuses.
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    refused = run(11, [2] * 60, payload_size=1000)
else:
    # The limit falls inside the next save's bytes: its first three records (the STATE, entries
    # 11 and 12) reach the file whole before the write is cut short.
    end = read_records(segment_files(Path(path))[-1])[-1].stop
    resource.setrlimit(resource.RLIMIT_FSIZE, (end + 2500, hard))
    refused = run(11, [2] * 4, payload_size=1000)
result = {}
try:
    store.save(HardState(2, "n2"), None, refused)
except LogFullError as e:
    result["error"], result["errno"] = str(e), e.__cause__.errno
result["last_index"] = store.last_index()
result["hard_state"] = [store.hard_state().term, store.hard_state().voted_for]
result["reads"] = store.entries(1, 100) == run(1, [1] * 10, payload_size=1000)
if case == "new-segment":
    store.save(None, None, run(11, [1], payload_size=1000))  # a save that fits still works
result["acknowledged"] = store.last_index()
store.close()
print(json.dumps(result))
"""


@pytest.mark.parametrize("case", ["new-segment", "write-inside-a-segment"])
def test_a_full_disk_raises_log_full_and_keeps_exactly_the_acknowledged_entries(tmp_path: Path, case: str) -> None:
    """A real kernel refusal standing in for a full disk: RLIMIT_FSIZE in a child process makes
    creating a file past the limit (or writing past it) fail with EFBIG. The store must raise
    LogFullError, keep serving reads, and a reopen must show exactly the acknowledged entries:
    nothing of the refused save, even the records of it that reached the file whole."""
    path = tmp_path / "wal"
    result = json.loads(run_python(FULL_DISK_SCRIPT, str(path), case).stdout)
    assert "error" in result, "the save past the limit was not refused"
    assert result["errno"] == errno.EFBIG
    assert "full" in result["error"] and "StorageConfig.log_max_bytes" in result["error"]
    assert result["last_index"] == 10 and result["hard_state"] == [1, "n1"] and result["reads"]
    acknowledged = result["acknowledged"]
    assert acknowledged == (11 if case == "new-segment" else 10)
    assert not list(path.glob("*.wal.tmp")) and len(segment_files(path)) == 1  # no half-made segment
    expected = run(1, [1] * 10, payload_size=1000) + run(11, [1], payload_size=1000)
    with open_small(path) as store:
        assert store.last_index() == acknowledged
        assert store.hard_state() == HardState(1, "n1")
        assert store.entries(1, 100) == expected[:acknowledged]
        assert is_zero_after(segment_files(path)[-1], read_records(segment_files(path)[-1])[-1].stop)


# --- 7. snapshots ---

def test_reset_to_snapshot_survives_reopen_and_deletes_old_segments(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    model = MemoryLogStore()
    store = open_small(path)
    for first in range(1, 301, 10):
        term = 1 if first <= 150 else 2
        apply((store, model), "save", HardState(3, "n1"), None, numbered(first, [term] * 10))
    seqs = segment_seqs(path)
    assert len(seqs) >= 4

    # Matching (entry 200 has term 2): the tail after it stays, the segments below it go.
    keep_from = live_entry_segments(path)[201]
    assert room_in(segment_files(path)[-1]) >= BOUNDARY_RECORD_SIZE
    apply((store, model), "reset_to_snapshot", 200, 2)
    assert segment_seqs(path) == [s for s in seqs if s >= keep_from]
    store.close()
    store = open_small(path)
    assert_same_log(store, model)
    assert store.entries(201, 301) == numbered(201, [2] * 100)

    # Not matching (entry 250 has term 2, not 7): every entry goes, and every old segment.
    apply((store, model), "reset_to_snapshot", 250, 7)
    assert segment_seqs(path) == [seqs[-1] + 1]
    assert store.last_index() == 250 and store.term(250) == 7 and store.term(251) is None
    store.close()
    store = open_small(path)
    assert_same_log(store, model)
    assert store.hard_state() == HardState(3, "n1")  # the new segment carried it over
    apply((store, model), "save", None, None, numbered(251, [7] * 5))
    store.close()
    with open_small(path) as store:
        assert_same_log(store, model)


# --- 8. reads on another thread ---

def test_reads_from_another_thread_stay_consistent(tmp_path: Path) -> None:
    """The node saves on a persist thread while the core reads on the event loop's thread. With a
    tiny cache the reads come from disk, from segments that compaction deletes meanwhile. Each
    read must be one consistent log: contiguous, every entry the right one, terms never going
    back. (A race shows only when a thread switch lands inside it, so this test catches a missing
    lock only sometimes; it never fails a correct store.)"""
    done = threading.Event()
    failures: list[BaseException] = []
    model = MemoryLogStore()

    def write(s: WalLogStore) -> None:
        try:
            for round_ in range(1, 1501):  # many rounds: a race shows only now and then
                last = s.last_index()
                if round_ % 7 == 0 and last - 4 > s.before_begin()[0]:
                    # Replace the last five entries (and add five) in a new, higher term.
                    apply((s, model), "save", HardState(round_), last - 4, numbered(last - 4, [round_] * 10, size=400))
                else:
                    apply((s, model), "save", HardState(round_), None, numbered(last + 1, [round_] * 10, size=400))
                if round_ % 25 == 0:
                    apply((s, model), "compact", s.last_index() - 5)
        except BaseException as exc:  # surfaced by the assertion below
            failures.append(exc)
        finally:
            done.set()

    def check(got: list[Entry], lo: int) -> None:
        assert [e.index for e in got] == list(range(lo, lo + len(got)))
        assert all(names_itself(e) for e in got)  # no entry from another place or another term
        assert [e.term for e in got] == sorted(e.term for e in got)  # never old after new

    reads = 0
    path = tmp_path / "wal"
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so reads land inside the writer's steps
    try:
        with open_small(path, cache_bytes=4096) as s:
            writer = threading.Thread(target=write, args=(s,))
            writer.start()
            while not done.is_set():
                before, last = s.before_begin()[0], s.last_index()
                for lo in (before + 1, max(before + 1, last - 30)):  # the oldest entries and the newest
                    try:
                        got = s.entries(lo, lo + 60)
                    except IndexError:
                        # Allowed only because lo was compacted meanwhile, not for a half-updated index.
                        assert s.before_begin()[0] >= lo
                        continue
                    check(got, lo)
                    reads += 1
            writer.join()
            assert not failures
            assert_same_log(s, model)
    finally:
        sys.setswitchinterval(switch_interval)
    assert reads > 0
    # Compaction kept deleting segments while the writer rotated through dozens of them.
    assert segment_seqs(path)[-1] >= 15 and len(segment_files(path)) <= 3
    with open_small(path) as s:
        assert_same_log(s, model)


# --- 9. a real crash ---

CRASH_SCRIPT = """
import sys
from raft.log import WalLogStore
from tests.unit.test_wal_store import crash_save

store = WalLogStore(sys.argv[1], segment_bytes=64 << 10, fsync=True)
while True:
    hard_state, entries = crash_save(store.last_index() + 1)
    store.save(hard_state, None, entries)
    print(store.last_index(), flush=True)  # acknowledged: save returned
"""


def crash_term(index: int) -> int:
    return 1 + (index - 1) // 100


def crash_save(first: int) -> tuple[HardState, list[Entry]]:
    """The save the crash test's child makes when its log ends at first - 1: five entries of
    400 to 700 B whose content depends on the index alone, so the parent knows what each must be."""
    entries = [numbered(i, [crash_term(i)], size=400 + i % 300)[0] for i in range(first, first + 5)]
    return HardState(crash_term(first + 4), "n1"), entries


def test_every_acknowledged_entry_survives_a_killed_process(tmp_path: Path) -> None:
    """A child process saves with fsync=True and prints each last index once save has returned;
    the parent SIGKILLs it after 200 acknowledgements, twice over (the second child continues the
    log the first one left). Every acknowledged entry must be there after a reopen, and every
    entry there must be the right one.

    This cannot test power loss (the killed process's writes are in the page cache, which
    survives it); it proves that nothing acknowledged depends on the process living on: no
    buffered write, no state only in memory, and that a log cut off at any point reopens."""
    path = tmp_path / "wal"
    acknowledged = 0
    for _ in range(2):
        child = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(path)], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None
        try:
            for _ in range(200):
                line = child.stdout.readline()
                if not line:
                    child.wait()
                    pytest.fail(f"the child stopped: {child.stderr.read() if child.stderr else ''}")
                assert int(line) > acknowledged
                acknowledged = int(line)
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
        assert child.returncode == -signal.SIGKILL
        with open_small(path) as store:
            last = store.last_index()
            assert last >= acknowledged
            entries = store.entries(1, last + 1)
            assert [e.index for e in entries] == list(range(1, last + 1))
            assert entries == [crash_save(i)[1][0] for i in range(1, last + 1)]
            assert store.hard_state().term >= crash_term(acknowledged)
            assert [store.first_index_of_term(t) for t in range(1, crash_term(last) + 1)] == \
                [1 + 100 * (t - 1) for t in range(1, crash_term(last) + 1)]
    assert len(segment_files(path)) > 3  # the children rotated segments as they went


# --- 10. the read cache ---

def varied(first: int, count: int, term: int) -> list[Entry]:
    """Entries with payloads of 50 to 750 bytes, so that a size limit falls between different sizes."""
    return [numbered(i, [term], size=50 + (i * 97) % 700)[0] for i in range(first, first + count)]


def test_reads_past_the_cache_come_from_disk_and_max_bytes_stops_at_the_right_entry(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    model = MemoryLogStore()
    with open_small(path, cache_bytes=4096) as store:  # the cache holds the newest 3 KiB or so
        for first in range(1, 301, 10):
            apply((store, model), "save", None, None, varied(first, 10, 1 + first // 100))
        assert store.entries(1, 301) == model.entries(1, 301)
        for lo in [1, 2, 57, *range(270, 301, 3)]:  # old entries, and across the cache's edge
            for limit in (0, 100, 500, 1000, 1001, 2500, 10_000, 10**9):
                assert store.entries(lo, 301, max_bytes=limit) == model.entries(lo, 301, max_bytes=limit), (lo, limit)

        # Damage the disk copies of the newest entry and of the entry just past a limit, to see
        # which reads touch the disk.
        where = {r.index: (seg, r) for seg in segment_files(path) for r in entry_records(seg)}
        limited = model.entries(20, 301, max_bytes=2000)
        past = limited[-1].index + 1
        for index in (300, past):
            segment, record = where[index]
            flip_byte(segment, record.offset + record.size - 1)
        # The newest entry is served from memory: its damaged disk copy is never read.
        assert store.entries(300, 301) == model.entries(300, 301)
        # An old entry past the limit is sized from its location, never read...
        assert store.entries(20, 301, max_bytes=2000) == limited
        # ...but read back from disk and checked when asked for.
        with pytest.raises(LogCorruptionError) as info:
            store.entries(past, past + 1)
        assert info.value.index == past


# --- 11. a large log ---

def test_a_large_log_reopens(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    total, batch = 100_000, 1000
    started = time.perf_counter()
    with WalLogStore(path, segment_bytes=8 << 20, fsync=False) as store:
        for first in range(1, total + 1, batch):
            term = 1 + first // 10_000  # ten runs
            store.save(HardState(term, "n1"), None, run(first, [term] * batch, payload_size=300))
        size = store.size_bytes()
    saved = time.perf_counter()
    with WalLogStore(path, segment_bytes=8 << 20, fsync=False) as store:
        opened = time.perf_counter()
        assert store.last_index() == total
        assert store.hard_state() == HardState(10, "n1")
        assert store.first_index_of_term(5) == 40_001 and store.last_index_of_term(5) == 50_000
        assert [store.term(i) for i in (1, 10_000, 10_001, 99_999, 100_000)] == [1, 1, 2, 10, 10]
        assert store.entries(55_555, 55_560) == run(55_555, [6] * 5, payload_size=300)
    assert len(segment_files(path)) >= 4
    print(f"\n{total} entries of 300 B in {total // batch} saves: {saved - started:.2f}s ({size / 1e6:.1f} MB in "
          f"{len(segment_files(path))} segments); reopen {1000 * (opened - saved):.1f} ms")
