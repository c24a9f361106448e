"""Snapshot files and the snapshot store, on real LMDB state machines in temporary directories."""
from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from raft.core import Entry, EntryType
from snapshot import SnapshotCorruptError, SnapshotManifest, SnapshotStore
from snapshot.file_format import MAGIC, PREFIX_SIZE, read_manifest, verify
from snapshot.install import extract_state
from statemachine import KVStateMachine, delete_op, encode_command, put_op
from statemachine.commands import encode_registration, session_id

MAP_SIZE = 256 << 20


# ---- helpers shared by the other test_snapshot_* files ------------------------------------------

def make_entries(count: int, term: int = 3, keys: int = 3000) -> list[Entry]:
    """Deterministic entries 1..count: five client sessions registered first, then puts over
    `keys` keys in those sessions, every 7th also deleting one, and a NOOP now and then, so the
    sessions are in the snapshot too."""
    made: list[Entry] = []
    clients: list[str] = []
    for i in range(1, count + 1):
        if len(clients) < 5:
            secret = b"client-%d" % len(clients) + b"-" * 8
            made.append(Entry(i, term, EntryType.NORMAL, encode_registration(secret)))
            clients.append(session_id(i, secret))
            continue
        if i % 500 == 0:
            made.append(Entry(i, term, EntryType.NOOP))
            continue
        ops = [put_op(f"key/{i % keys:05d}".encode(), f"value-{i}".encode() * 3)]
        if i % 7 == 0:
            ops.append(delete_op(f"key/{(i * 13) % keys:05d}".encode()))
        made.append(Entry(i, term, EntryType.NORMAL, encode_command(ops, clients[i % 5], i)))
    return made


def apply_in_batches(sm: KVStateMachine, entries: list[Entry], batch: int = 50) -> None:
    for start in range(0, len(entries), batch):
        sm.apply(entries[start:start + batch])


def replayed(path: Path, entries: list[Entry]) -> KVStateMachine:
    """A second machine fed exactly `entries`."""
    sm = KVStateMachine(path, map_size=MAP_SIZE)
    apply_in_batches(sm, entries, batch=200)
    return sm


def open_payload(snapshot_file: Path, where: Path) -> KVStateMachine:
    extract_state(snapshot_file, where)
    return KVStateMachine(where, map_size=MAP_SIZE)


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[tuple[KVStateMachine, list[Entry]]]:
    entries = make_entries(3000)
    sm = KVStateMachine(tmp_path / "state", map_size=MAP_SIZE)
    apply_in_batches(sm, entries)
    yield sm, entries
    sm.close()


@pytest.fixture
def snapshot_file(tmp_path: Path, filled: tuple[KVStateMachine, list[Entry]]) -> Path:
    store = SnapshotStore(tmp_path / "snapshots")
    manifest = store.create(filled[0], ["n1", "n2", "n3"], "c-old")
    return store.path_for(manifest)


# ---- manifest --------------------------------------------------------------------------------

def test_manifest_json_round_trip() -> None:
    manifest = SnapshotManifest(index=42, term=7, members=("n1", "n2"), cluster_id="c-1", size=4096,
                                sha256="ab" * 32, key_count=10)
    assert SnapshotManifest.from_json(manifest.to_json()) == manifest
    assert manifest.created_at.endswith("+00:00")


@pytest.mark.parametrize("field, value, complaint", [
    ("index", -1, "negative"), ("term", "7", "should be int"), ("members", ["n1", 2], "should list strings"),
    ("sha256", "xyz", "not a hex sha256"), ("size", True, "should be int"),
])
def test_manifest_refuses_bad_fields(field: str, value: object, complaint: str) -> None:
    fields = json.loads(SnapshotManifest(1, 1, ("n1",), "c", 1, "0" * 64, 0).to_json())
    fields[field] = value
    with pytest.raises(ValueError, match=complaint):
        SnapshotManifest.from_json(json.dumps(fields).encode())


# ---- create while applying -------------------------------------------------------------------

def test_snapshot_taken_during_apply_equals_state_at_its_index(tmp_path: Path) -> None:
    entries = make_entries(20_000)
    sm = KVStateMachine(tmp_path / "live", map_size=MAP_SIZE)
    apply_in_batches(sm, entries[:3000])  # a few thousand keys before the snapshot starts
    applying, stop = threading.Event(), threading.Event()

    def keep_applying() -> None:
        for start in range(3000, len(entries), 5):
            sm.apply(entries[start:start + 5])
            applying.set()
            if stop.is_set():
                return

    applier = threading.Thread(target=keep_applying)
    applier.start()
    try:
        assert applying.wait(10)
        store = SnapshotStore(tmp_path / "snapshots")
        manifest = store.create(sm, ["n1"], "c-live")
    finally:
        stop.set()
        applier.join()
    assert 3000 < manifest.index <= len(entries)
    assert manifest.term == 3

    with replayed(tmp_path / "replay", entries[:manifest.index]) as expected, \
            open_payload(store.path_for(manifest), tmp_path / "restored") as restored:
        assert restored.applied_index == manifest.index
        assert restored.state_hash() == expected.state_hash()
        assert restored.count() == expected.count() == manifest.key_count
        assert restored.session_stats() == expected.session_stats()
    sm.close()


def test_created_file_verifies_and_describes_itself(snapshot_file: Path, filled: tuple[KVStateMachine, list[Entry]]) -> None:
    sm, _ = filled
    manifest = verify(snapshot_file)
    assert (manifest.index, manifest.term) == (sm.applied_index, sm.applied_term)
    assert manifest.members == ("n1", "n2", "n3")
    assert manifest.cluster_id == "c-old"
    assert manifest.key_count == sm.count()
    assert snapshot_file.stat().st_size == read_manifest(snapshot_file)[1] + manifest.size


# ---- damaged files -----------------------------------------------------------------------------

def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def test_flipped_payload_byte_is_a_checksum_mismatch(snapshot_file: Path) -> None:
    flip_byte(snapshot_file, snapshot_file.stat().st_size - 100)
    read_manifest(snapshot_file)  # the header is fine: only the full check can tell
    with pytest.raises(SnapshotCorruptError, match="checksum mismatch") as caught:
        verify(snapshot_file)
    assert str(snapshot_file) in str(caught.value)


def test_flipped_manifest_byte_is_a_damaged_header(snapshot_file: Path) -> None:
    flip_byte(snapshot_file, PREFIX_SIZE + 10)
    with pytest.raises(SnapshotCorruptError, match=r"damaged header \(manifest checksum mismatch\)"):
        verify(snapshot_file)


def test_truncated_file_is_refused(snapshot_file: Path) -> None:
    size = snapshot_file.stat().st_size
    os.truncate(snapshot_file, size - 1)
    with pytest.raises(SnapshotCorruptError, match=r"truncated \(payload has \d+ of \d+ bytes\)") as caught:
        verify(snapshot_file)
    assert str(snapshot_file) in str(caught.value)
    os.truncate(snapshot_file, PREFIX_SIZE + 3)
    with pytest.raises(SnapshotCorruptError, match="truncated .*inside the header"):
        verify(snapshot_file)


def test_trailing_bytes_are_refused(snapshot_file: Path) -> None:
    with open(snapshot_file, "ab") as f:
        f.write(b"junk")
    with pytest.raises(SnapshotCorruptError, match="4 unexpected bytes after the payload"):
        verify(snapshot_file)


def test_wrong_magic_is_not_a_snapshot(tmp_path: Path, snapshot_file: Path) -> None:
    flip_byte(snapshot_file, 0)
    with pytest.raises(SnapshotCorruptError, match="not a raftkv snapshot") as caught:
        verify(snapshot_file)
    assert str(snapshot_file) in str(caught.value)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(SnapshotCorruptError, match="not a raftkv snapshot"):
        verify(other)


def test_newer_format_version_is_unsupported(snapshot_file: Path) -> None:
    with open(snapshot_file, "r+b") as f:
        f.seek(len(MAGIC))
        f.write(struct.pack(">H", 2))
    with pytest.raises(SnapshotCorruptError, match="unsupported snapshot format version 2"):
        verify(snapshot_file)


def test_manifest_version_disagreeing_with_header_is_damage(snapshot_file: Path) -> None:
    manifest, offset = read_manifest(snapshot_file)
    data = snapshot_file.read_bytes()
    header = json.loads(data[PREFIX_SIZE:offset])
    header["format_version"] = 9
    raw = json.dumps(header).encode()
    snapshot_file.write_bytes(MAGIC + struct.pack(">HII", 1, len(raw), zlib.crc32(raw)) + raw + data[offset:])
    with pytest.raises(SnapshotCorruptError, match="manifest says version 9"):
        verify(snapshot_file)


# ---- the store -----------------------------------------------------------------------------------

def test_newest_and_prune_keep_the_newest(tmp_path: Path) -> None:
    entries = make_entries(400)
    store = SnapshotStore(tmp_path / "snapshots")
    assert store.newest() is None
    with KVStateMachine(tmp_path / "state", map_size=MAP_SIZE) as sm:
        made = []
        for step in range(4):
            sm.apply(entries[step * 100:(step + 1) * 100])
            made.append(store.create(sm, ["n1"], "c"))
    newest = store.newest()
    assert newest is not None and newest[0].index == 400 and newest[1] == store.path_for(made[-1])
    removed = store.prune(keep=2)
    assert sorted(removed) == sorted(store.path_for(m) for m in made[:2])
    assert [s.index for s in store.list()] == [300, 400]
    assert store.prune(keep=2) == []
    with pytest.raises(ValueError):
        store.prune(keep=0)


def two_snapshots(tmp_path: Path) -> tuple[SnapshotStore, SnapshotManifest, SnapshotManifest]:
    """A store holding a snapshot at index 100 and a newer one at 200."""
    entries = make_entries(200)
    store = SnapshotStore(tmp_path / "snapshots")
    with KVStateMachine(tmp_path / "state", map_size=MAP_SIZE) as sm:
        sm.apply(entries[:100])
        older = store.create(sm, ["n1"], "c")
        sm.apply(entries[100:])
        newer = store.create(sm, ["n1"], "c")
    return store, older, newer


def test_newest_skips_a_damaged_file(tmp_path: Path) -> None:
    store, older, newer = two_snapshots(tmp_path)
    os.truncate(store.path_for(newer), 10)
    newest = store.newest()
    assert newest is not None and newest[0] == older
    # Set aside, kept for inspection, never listed or offered again.
    assert not store.path_for(newer).exists()
    assert (store.directory / f"damaged-{store.path_for(newer).name}").exists()
    assert [s.index for s in store.list()] == [100]


def test_newest_with_verify_sets_aside_a_flipped_payload(tmp_path: Path) -> None:
    store, older, newer = two_snapshots(tmp_path)
    damaged = store.path_for(newer)
    flip_byte(damaged, damaged.stat().st_size - 100)
    assert store.newest() == (newer, damaged)  # only the header is read: the flip goes unseen
    assert store.newest(verify=True) == (older, store.path_for(older))
    assert [p.name for p in sorted(store.directory.iterdir())] == [f"damaged-{damaged.name}", store.path_for(older).name]


class CrashingCopy:
    """A state machine whose copy fails half way, as a crash during `create` would."""

    def __init__(self, real: KVStateMachine) -> None:
        self.real = real

    def copy_to(self, directory: str | os.PathLike[str]) -> tuple[int, int, bytes]:
        self.real.copy_to(directory)
        raise OSError("disk went away")


def test_failed_create_leaves_the_previous_newest(tmp_path: Path, filled: tuple[KVStateMachine, list[Entry]]) -> None:
    sm, _ = filled
    store = SnapshotStore(tmp_path / "snapshots")
    before = store.create(sm, ["n1"], "c")
    with pytest.raises(OSError, match="disk went away"):
        store.create(CrashingCopy(sm), ["n1"], "c")
    assert store.newest() == (before, store.path_for(before))
    assert sorted(p.name for p in store.directory.iterdir()) == [store.path_for(before).name]


def test_leftover_temporary_files_are_removed_on_open(tmp_path: Path, snapshot_file: Path) -> None:
    directory = snapshot_file.parent
    (directory / ".tmp-abc.snap").write_bytes(MAGIC + b"half a snapshot")
    (directory / ".tmp-abc.copy").mkdir()
    (directory / ".tmp-abc.copy" / "data.mdb").write_bytes(b"x")
    store = SnapshotStore(directory)
    assert [p.name for p in directory.iterdir()] == [snapshot_file.name]
    assert store.newest() is not None


def test_adopt_moves_a_verified_file_under_its_final_name(tmp_path: Path, snapshot_file: Path) -> None:
    store = SnapshotStore(tmp_path / "follower")
    incoming = store.directory / "received.snap"
    incoming.write_bytes(snapshot_file.read_bytes())
    manifest, final = store.adopt(incoming)
    assert final == store.path_for(manifest) and final.exists() and not incoming.exists()
    assert store.newest() == (manifest, final)
