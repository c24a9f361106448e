"""Chunked snapshot transfer: chunk_file -> SnapshotReceiver, and the throttle."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshot import SnapshotCorruptError, SnapshotReceiver, SnapshotStore, SnapshotTransferError, TokenBucket, chunk_file
from snapshot.file_format import read_manifest, verify
from statemachine import KVStateMachine
from tests.unit.test_snapshot import MAP_SIZE, apply_in_batches, make_entries


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Iterator[Path]:
    with KVStateMachine(tmp_path / "state", map_size=MAP_SIZE) as sm:
        apply_in_batches(sm, make_entries(2000))
        store = SnapshotStore(tmp_path / "leader")
        yield store.path_for(store.create(sm, ["n1", "n2"], "c-1"))


def send(path: Path, receiver: SnapshotReceiver, chunk_size: int = 16 << 10) -> None:
    for offset, data, _ in chunk_file(path, chunk_size):
        receiver.feed(offset, data)


def test_chunks_cover_the_file_once_with_done_on_the_last(snapshot_file: Path) -> None:
    chunks = list(chunk_file(snapshot_file, chunk_size=10_000))
    assert b"".join(c.data for c in chunks) == snapshot_file.read_bytes()
    assert [c.offset for c in chunks] == [i * 10_000 for i in range(len(chunks))]
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_empty_file_is_one_done_chunk(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert list(chunk_file(empty)) == [(0, b"", True)]


def test_round_trip_through_the_receiver(tmp_path: Path, snapshot_file: Path) -> None:
    manifest, _ = read_manifest(snapshot_file)
    follower = SnapshotStore(tmp_path / "follower")
    with SnapshotReceiver(follower.directory, source="snapshot from n1") as receiver:
        send(snapshot_file, receiver)
        assert receiver.manifest == manifest
        received = receiver.finish(snapshot_file.stat().st_size, manifest.sha256)
    assert received.read_bytes() == snapshot_file.read_bytes()
    assert verify(received) == manifest
    adopted, final = follower.adopt(received)
    assert adopted == manifest and follower.newest() == (manifest, final)


def test_wrong_announced_sha_is_refused_and_the_file_removed(tmp_path: Path, snapshot_file: Path) -> None:
    receiver = SnapshotReceiver(tmp_path / "in", source="snapshot from n1")
    send(snapshot_file, receiver)
    with pytest.raises(SnapshotCorruptError, match="snapshot from n1 .*checksum mismatch .*announced sha256 0000"):
        receiver.finish(snapshot_file.stat().st_size, "0" * 64)
    assert not receiver.path.exists()
    assert list((tmp_path / "in").iterdir()) == []


def test_payload_damaged_in_flight_is_a_checksum_mismatch(tmp_path: Path, snapshot_file: Path) -> None:
    manifest, _ = read_manifest(snapshot_file)
    receiver = SnapshotReceiver(tmp_path / "in")
    for offset, data, done in chunk_file(snapshot_file, 16 << 10):
        if done:  # the last byte of the file changes on the way
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        receiver.feed(offset, data)
    with pytest.raises(SnapshotCorruptError, match=r"checksum mismatch \(payload sha256"):
        receiver.finish(snapshot_file.stat().st_size, manifest.sha256)
    assert not receiver.path.exists()


def test_offset_other_than_the_next_is_refused(tmp_path: Path, snapshot_file: Path) -> None:
    manifest, _ = read_manifest(snapshot_file)
    chunks = list(chunk_file(snapshot_file, 16 << 10))
    with SnapshotReceiver(tmp_path / "in") as receiver:
        receiver.feed(chunks[0].offset, chunks[0].data)
        with pytest.raises(SnapshotTransferError, match=f"offset {chunks[2].offset} refused, the next expected offset is {chunks[1].offset}"):
            receiver.feed(chunks[2].offset, chunks[2].data)
        with pytest.raises(SnapshotTransferError, match="offset 0 refused"):
            receiver.feed(0, chunks[0].data)  # a duplicate is refused too
        for chunk in chunks[1:]:  # still usable: the stream goes on from the right offset
            receiver.feed(chunk.offset, chunk.data)
        assert receiver.finish(snapshot_file.stat().st_size, manifest.sha256).exists()


def test_stream_cut_short_is_truncated(tmp_path: Path, snapshot_file: Path) -> None:
    manifest, _ = read_manifest(snapshot_file)
    receiver = SnapshotReceiver(tmp_path / "in")
    for offset, data, done in chunk_file(snapshot_file, 16 << 10):
        if not done:
            receiver.feed(offset, data)
    with pytest.raises(SnapshotCorruptError, match="truncated"):
        receiver.finish(snapshot_file.stat().st_size, manifest.sha256)
    assert not receiver.path.exists()


def test_bytes_that_are_not_a_snapshot_are_refused_at_once(tmp_path: Path) -> None:
    receiver = SnapshotReceiver(tmp_path / "in")
    with pytest.raises(SnapshotCorruptError, match="not a raftkv snapshot"):
        receiver.feed(0, b"GET / HTTP/1.1\r\n")
    assert not receiver.path.exists()
    with pytest.raises(SnapshotTransferError, match="aborted"):
        receiver.feed(16, b"more")


def test_header_split_over_tiny_chunks_is_parsed(tmp_path: Path, snapshot_file: Path) -> None:
    manifest, _ = read_manifest(snapshot_file)
    with SnapshotReceiver(tmp_path / "in") as receiver:
        send(snapshot_file, receiver, chunk_size=7)
        assert receiver.finish(snapshot_file.stat().st_size, manifest.sha256).read_bytes() == snapshot_file.read_bytes()


def test_leaving_the_receiver_without_finish_removes_the_file(tmp_path: Path, snapshot_file: Path) -> None:
    with SnapshotReceiver(tmp_path / "in") as receiver:
        receiver.feed(0, snapshot_file.read_bytes()[:1000])
        assert receiver.path.exists()
    assert not receiver.path.exists()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_token_bucket_keeps_the_rate(tmp_path: Path) -> None:
    clock = FakeClock()
    data = tmp_path / "data"
    data.write_bytes(bytes(10_000))
    bucket = TokenBucket(2000, capacity=1000, clock=clock, sleep=clock.sleep)
    chunks = list(chunk_file(data, chunk_size=1000, throttle=bucket))
    assert len(chunks) == 10
    # The first 1000 bytes are the initial burst; the other 9000 take 4.5 s at 2000 B/s.
    assert clock.now == pytest.approx(4.5)
    assert len(clock.slept) == 9


def test_token_bucket_refills_while_idle() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000, capacity=500, clock=clock, sleep=clock.sleep)
    bucket.take(500)
    assert clock.slept == []
    clock.now += 10  # idle long enough to refill, but only up to capacity
    bucket.take(500)
    bucket.take(500)
    assert clock.slept == [pytest.approx(0.5)]


def test_bytes_per_second_slows_a_real_transfer(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(bytes(64 << 10))
    started = time.monotonic()
    assert sum(len(c.data) for c in chunk_file(data, chunk_size=16 << 10, bytes_per_second=256 << 10)) == 64 << 10
    # 16 KiB go at once, the other 48 KiB at 256 KiB/s: at least 0.1875 s.
    assert time.monotonic() - started >= 0.18
