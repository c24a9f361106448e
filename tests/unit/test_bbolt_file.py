"""The bbolt reader and writer (snapshot/bbolt_reader.py, bbolt_writer.py) on files the writer
makes: multi-level trees, overflow pages, inline and nested buckets read back exactly, and every
kind of damage refused with a message naming it. Files from real etcd are the integration tests'
(tests/integration/test_etcd_snapshot.py); bbolt's own Go is never run."""
from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from snapshot.bbolt_format import PAGE_HEADER, fnv64a
from snapshot.bbolt_reader import BoltFile, open_bolt
from snapshot.bbolt_writer import write_bolt
from snapshot.errors import SnapshotCorruptError
from snapshot.etcd_file import crc32c, database_size, is_etcd_snapshot, open_etcd_snapshot

PAGE = 4096


def write(path: Path, buckets: dict) -> Path:
    with open(path, "wb") as f:
        size = write_bolt(f, buckets)
    assert path.stat().st_size == size and size % PAGE == 0
    return path


def many(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"key/{i:07d}".encode(), f"value-{i}".encode() * (1 + i % 5)) for i in range(n)]


def read_all(db: BoltFile, *names: bytes) -> list[tuple[bytes, bytes | None]]:
    bucket = db.bucket(*names)
    assert bucket is not None
    return list(bucket.items())


def test_fnv64a_and_crc32c_match_their_published_check_values() -> None:
    assert fnv64a(b"") == 0xCBF29CE484222325
    assert fnv64a(b"a") == 0xAF63DC4C8601EC8C
    assert crc32c(b"123456789") == 0xE3069283


def test_a_multi_level_tree_with_overflow_values_reads_back_exactly(tmp_path: Path) -> None:
    items = many(20_000)
    big = [(b"big/%d" % i, bytes([i]) * (PAGE * (i + 1) + 7)) for i in range(3)]
    path = write(tmp_path / "db", {b"key": items, b"big": big, b"empty": []})
    with open_bolt(path) as db:  # check(): every page reachable once, or free
        assert read_all(db, b"key") == items
        assert read_all(db, b"big") == big
        assert read_all(db, b"empty") == []
        assert [name for name, _ in db.root.buckets()] == [b"big", b"empty", b"key"]
        # a tree of three levels: the root of "key" is a branch whose children are branches
        key = db.root.bucket(b"key")
        offset, flags, count = db.page(key._root, 0x01)
        first_child = key._branch(key._root, offset, count, 0)[0][1]
        assert flags == 0x01 and count > 1 and db.page(first_child, 0x01)[1] == 0x01
        assert any(db.span(pgid) > 1 for pgid in db.root.bucket(b"big").pages())  # overflow pages


def test_small_buckets_are_inline_and_nested_buckets_read(tmp_path: Path) -> None:
    path = write(tmp_path / "db", {b"outer": [(b"a", b"1"), (b"inner", {b"x": b"X", b"deeper": {b"y": b"Y"}}),
                                              (b"z", b"26")],
                                   b"small": [(b"k", b"v")]})
    with open_bolt(path) as db:
        assert db.root.bucket(b"small")._inline is not None  # inline: no page of its own
        assert read_all(db, b"outer") == [(b"a", b"1"), (b"inner", None), (b"z", b"26")]
        assert read_all(db, b"outer", b"inner") == [(b"deeper", None), (b"x", b"X")]
        assert read_all(db, b"outer", b"inner", b"deeper") == [(b"y", b"Y")]
        assert db.bucket(b"outer", b"a") is None and db.bucket(b"absent") is None


def test_the_writer_refuses_keys_out_of_order(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="strictly ascending"):
        write(tmp_path / "db", {b"b": [(b"2", b""), (b"1", b"")]})
    with pytest.raises(ValueError, match="strictly ascending"):
        write(tmp_path / "db", {b"b": many(2000)[::-1]})


def damaged(tmp_path: Path, change) -> Path:  # type: ignore[no-untyped-def]
    good = write(tmp_path / "good", {b"key": many(3000), b"meta": [(b"m", b"1")]})
    raw = bytearray(good.read_bytes())
    change(raw)
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(raw))
    return bad


def meta_offset(page: int) -> int:
    return page * PAGE + PAGE_HEADER.size


def test_a_damaged_newer_meta_falls_back_to_the_older_one_as_bbolt_does(tmp_path: Path) -> None:
    def flip_meta0(raw: bytearray) -> None:
        raw[meta_offset(0) + 40] ^= 1  # inside the checksummed fields: the checksum fails
    with open_bolt(damaged(tmp_path, flip_meta0)) as db:
        assert db.meta.txid == 1  # meta 1's
        assert len(read_all(db, b"key")) == 3000


@pytest.mark.parametrize("change, message", [
    (lambda raw: raw.__setitem__(slice(meta_offset(0), meta_offset(0) + 4), bytes(4)) or
     raw.__setitem__(slice(meta_offset(1), meta_offset(1) + 4), bytes(4)), "no valid meta page"),
    (lambda raw: raw.__setitem__(slice(meta_offset(0) + 56, meta_offset(0) + 64), b"\x01" * 8) or
     raw.__setitem__(slice(meta_offset(1) + 48, meta_offset(1) + 56), b"\xff" * 8), "checksum mismatch"),
    (lambda raw: raw.__delitem__(slice(len(raw) // 2, None)), "truncated"),
    (lambda raw: raw.__setitem__(slice(3 * PAGE, 3 * PAGE + 8), struct.pack("<Q", 99)), "says it is page 99"),
    (lambda raw: raw.__setitem__(slice(3 * PAGE + 8, 3 * PAGE + 10), struct.pack("<H", 0x10)), "expected branch or leaf"),
    (lambda raw: raw.__setitem__(slice(3 * PAGE + 10, 3 * PAGE + 12), struct.pack("<H", 4000)), "more than it holds"),
    (lambda raw: raw.__setitem__(slice(3 * PAGE + 200, 3 * PAGE + 201), b"\x00"), "out of order"),
])
def test_damage_is_refused_with_what_is_wrong(tmp_path: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    bad = damaged(tmp_path, change)
    with pytest.raises(SnapshotCorruptError, match=message) as refused:
        with open_bolt(bad) as db:
            read_all(db, b"key")
    assert str(bad) in str(refused.value)


def test_a_page_reached_twice_or_never_is_found_by_the_check(tmp_path: Path) -> None:
    path = write(tmp_path / "db", {b"a": many(2000), b"b": many(2000)})
    raw = bytearray(path.read_bytes())
    with BoltFile(path) as db:
        a_root, b_root = db.root.bucket(b"a")._root, db.root.bucket(b"b")._root
        a_value = next(v for k, v, _ in db.root._elements() if k == b"a")
    at = bytes(raw).index(a_value)
    raw[at:at + 8] = struct.pack("<Q", b_root)  # bucket a now points at bucket b's tree
    (tmp_path / "bad").write_bytes(bytes(raw))
    with pytest.raises(SnapshotCorruptError, match=f"page {b_root} is both"):
        open_bolt(tmp_path / "bad").close()
    assert a_root != b_root


def test_an_etcd_file_is_told_by_content_and_its_trailer_checked(tmp_path: Path) -> None:
    db = write(tmp_path / "db", {b"key": [], b"meta": []})
    raw = db.read_bytes()
    snap = tmp_path / "etcd.snap"
    snap.write_bytes(raw + hashlib.sha256(raw).digest())
    assert is_etcd_snapshot(snap) and database_size(snap) == len(raw)
    open_etcd_snapshot(snap).close()
    flipped = bytearray(snap.read_bytes())
    flipped[2 * PAGE + 20] ^= 0xFF
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    with pytest.raises(SnapshotCorruptError, match="checksum mismatch"):
        open_etcd_snapshot(tmp_path / "flipped")
    other = write(tmp_path / "other", {b"key": []})
    with pytest.raises(SnapshotCorruptError, match="not an etcd snapshot .no 'meta' bucket"):
        open_etcd_snapshot(other)
    raftkv = tmp_path / "raftkv.snap"
    raftkv.write_bytes(b"RAFTKV-SNAPSHOT\n" + bytes(100))
    assert not is_etcd_snapshot(raftkv)
