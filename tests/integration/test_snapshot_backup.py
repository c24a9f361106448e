"""Operators' snapshots: save from a live cluster, inspect, restore into a new cluster; corrupt and
truncated files are refused with a clear error while nodes keep running."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from kv import Client
from raftkv_proto import raft_pb2
from raft.transport.frames import frame
from raft.transport.peer_protocol import SNAPSHOT
from tests.integration.cluster import Cluster, free_ports, wait_until
from tests.integration.peer_wire import assert_closed, connect, read_frame, say_hello

pytestmark = pytest.mark.integration

KEYS = 100_000


def raftkv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kv", *args], capture_output=True, text=True, timeout=300)


def test_save_100k_keys_then_restore_into_a_new_single_node_cluster(make_cluster: Callable[..., Cluster],
                                                                      tmp_path: Path) -> None:
    cluster = make_cluster(3)
    cluster.wait_for_leader()
    client = cluster.client(timeout=60.0)
    for lo in range(0, KEYS, 1000):
        client.batch(puts={f"user/{i:06d}": f"value-{i}" for i in range(lo, lo + 1000)})
    backup = tmp_path / "backup.snap"
    saved = raftkv("snapshot", "save", str(backup), "--endpoints", ",".join(cluster.endpoints))
    assert saved.returncode == 0, saved.stderr
    assert f"{KEYS} keys" in saved.stdout and "sha256" in saved.stdout
    client.put("user/after-backup", "not in the snapshot")

    inspected = raftkv("snapshot", "inspect", str(backup))
    assert inspected.returncode == 0 and '"checksum_ok": true' in inspected.stdout, inspected.stdout

    port, peer_port = free_ports(2)
    data_dir = tmp_path / "restored"
    restored = raftkv("snapshot", "restore", str(backup), "--data-dir", str(data_dir),
                      "--id", "r1", "--peers", f"r1=127.0.0.1:{peer_port}")
    assert restored.returncode == 0, restored.stderr
    new_cluster_id = restored.stdout.split("new cluster id ")[1].split(")")[0]
    assert new_cluster_id != cluster.status("n1")["cluster_id"]

    node = subprocess.Popen([sys.executable, "-m", "kv", "serve", "--id", "r1", "--data-dir", str(data_dir),
                             "--listen", f"127.0.0.1:{port}", "--peers", f"r1=127.0.0.1:{peer_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Client([f"127.0.0.1:{port}"], timeout=30.0) as fresh:
            wait_until("the restored node leads", lambda: fresh.status()[0].get("role") == "leader")
            items = fresh.scan(prefix="user/", limit=KEYS + 10)
            assert len(items) == KEYS
            assert all(k == f"user/{i:06d}".encode() and v == f"value-{i}".encode()
                       for i, (k, v) in enumerate(items))
            assert fresh.get("user/after-backup") is None
            fresh.put("user/new", "writable")  # a working cluster, not a read-only copy
            assert fresh.get("user/new") == b"writable"
    finally:
        node.kill()
        node.wait()


def test_corrupt_and_truncated_snapshots_are_refused_and_nodes_keep_running(cluster: Cluster, tmp_path: Path) -> None:
    client = cluster.client()
    client.put("k", "v")
    good = tmp_path / "good.snap"
    client.save_snapshot(good)
    raw = good.read_bytes()
    corrupt, truncated = tmp_path / "corrupt.snap", tmp_path / "truncated.snap"
    corrupt.write_bytes(raw[:-10] + bytes(b ^ 0xFF for b in raw[-10:]))
    truncated.write_bytes(raw[: len(raw) // 2])
    for bad, word in ((corrupt, "checksum"), (truncated, "truncated")):
        inspected = raftkv("snapshot", "inspect", str(bad))
        assert inspected.returncode == 1
        restored = raftkv("snapshot", "restore", str(bad), "--data-dir", str(tmp_path / f"from-{bad.stem}"))
        assert restored.returncode == 1 and word in restored.stderr.lower(), restored.stderr
        assert "Traceback" not in restored.stderr
        assert not (tmp_path / f"from-{bad.stem}").exists() or not any((tmp_path / f"from-{bad.stem}").iterdir())

    # A follower offered a corrupt stream by a "leader" refuses it and keeps serving.
    follower = next(n for n, s in cluster.statuses().items() if s.get("role") == "follower")
    cluster_id = cluster.status(follower)["cluster_id"]
    header = raft_pb2.SnapshotHeader(term=1, total_size=len(raw), sha256="0" * 64)
    chunk = raft_pb2.SnapshotChunk(offset=0, data=corrupt.read_bytes(), done=True)
    with connect(cluster, follower) as sock:
        sender = "n1" if follower != "n1" else "n2"
        assert not say_hello(sock, cluster_id, sender, follower, SNAPSHOT).refusal
        sock.sendall(frame(header.SerializeToString()) + frame(chunk.SerializeToString()))
        ack = raft_pb2.SnapshotAck.FromString(read_frame(sock))
        assert_closed(sock)
    assert not ack.success and ack.message
    assert Client([cluster.nodes[follower].address]).get("k", consistency="stale") == b"v"
    client.put("k2", "still replicating")
    assert client.get("k2") == b"still replicating"
