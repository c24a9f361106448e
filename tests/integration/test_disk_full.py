"""A full disk on a real node: a small tmpfs holds the data directory, and a ballast file takes
the rest of its space. Writes are refused as DISK_FULL, reads go on. Below the reserve the leader
raises a NOSPACE alarm, and writes resume once the ballast is removed and the alarm disarmed; a
state that fills with no reserve left resumes by itself (no alarm could be written), in the same
process."""
from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kv.errors import DiskFullError, TimeoutError
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until

pytestmark = pytest.mark.integration

# Room for the log's first 64 MiB segment, the state and a few megabytes of writes.
DISK_MIB = 160
VALUE = "v" * 50_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """A ballast file that takes every free byte of the disk."""
    ballast = disk / f"ballast-{uuid.uuid4().hex}"
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb", buffering=0) as f:
        for size in (len(chunk), 4096):  # then the last pages, one at a time
            try:
                while True:
                    f.write(chunk[:size])
            except OSError:
                pass
    return ballast


def single_node(disk: Path, *flags: str) -> Cluster:
    cluster = Cluster(disk / "cluster", 1, (*FAST_TIMING, *flags)).start()
    cluster.wait_for_leader()
    return cluster


def test_writes_are_refused_below_the_reserve_reads_go_on_and_writes_resume(small_disk: Path) -> None:
    cluster = single_node(small_disk)
    try:
        client = cluster.client(timeout=5.0)
        for i in range(10):
            client.put(f"before/{i}", VALUE)
        pid = cluster.nodes["n1"].process.pid  # type: ignore[union-attr]
        ballast = fill(small_disk)
        # Refused for the reserve, or already for the NOSPACE alarm the leader raised meanwhile.
        with pytest.raises(DiskFullError, match="reserve|database space exceeded"):
            client.put("refused", "x")
        assert client.get("before/3") == VALUE.encode()  # linearizable: nothing is left unapplied
        assert client.get("before/4", consistency="stale") == VALUE.encode()
        status = cluster.status("n1")
        assert status["disk_full"] is True and status["applied_index"] == status["commit_index"]
        assert client.get("refused") is None

        # The leader raises NOSPACE through the log (an entry the reserve has room for), as etcd.
        log = cluster.nodes["n1"].log_path
        wait_until("NOSPACE proposed", lambda: "raising alarm NOSPACE for member n1" in log.read_text(errors="replace"))

        ballast.unlink()
        assert wait_until("NOSPACE listed", lambda: client.alarm_list()) == [{"member_id": "n1", "alarm": "NOSPACE"}]
        assert cluster.status("n1")["disk_full"] is False
        with pytest.raises(DiskFullError, match="database space exceeded"):  # until an operator disarms it
            client.put("after", "1")
        assert client.alarm_disarm() == []
        client.put("after", "1")
        assert client.get("after") == b"1"
        assert cluster.nodes["n1"].process.pid == pid  # type: ignore[union-attr]  # no restart needed
    finally:
        cluster.close()


def test_a_state_that_cannot_grow_keeps_its_committed_writes_and_applies_them_when_space_returns(
        small_disk: Path) -> None:
    # No reserve: the disk fills under a write the log already took (its segment is preallocated),
    # so the state machine meets ENOSPC applying it.
    cluster = single_node(small_disk, "--reserve-free-bytes", "0")
    try:
        client = cluster.client(timeout=2.0)
        client.put("before", "1")
        pid = cluster.nodes["n1"].process.pid  # type: ignore[union-attr]
        ballast = fill(small_disk)
        # Committed, not applied: the outcome is unknown to the writer, never "refused".
        with pytest.raises(TimeoutError):
            for i in range(50):
                client.put(f"stuck/{i}", VALUE)
        status = wait_until("the node reports its full disk", lambda: (s := cluster.status("n1"))["disk_full"] and s)
        assert status["applied_index"] < status["commit_index"], status
        with pytest.raises(DiskFullError):
            client.put("refused", "x")
        assert client.get("before", consistency="stale") == b"1"  # stale reads go on

        ballast.unlink()
        wait_until("the held entries are applied",
                   lambda: (s := cluster.status("n1"))["applied_index"] >= status["commit_index"] and not s["disk_full"])
        assert client.get(f"stuck/{i}") == VALUE.encode()  # the write that timed out was committed
        client.put("after", "1")
        assert client.get("after") == b"1"
        assert cluster.nodes["n1"].process.pid == pid  # type: ignore[union-attr]
        log = cluster.nodes["n1"].log_path.read_text(errors="replace")
        assert "state machine accepts writes again" in log and "stopped" not in log
    finally:
        cluster.close()
