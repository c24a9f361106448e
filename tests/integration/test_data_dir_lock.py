"""One process per data directory: a second `raftkv serve`, a second embedded node (in another
process) or a restore into a directory a node is using is refused with an error naming the
directory and the holder's pid, the first keeps serving with its data intact, and a holder killed
with SIGKILL leaves no lock behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kv import Client
from kv.server.data_dir import DataDirInUseError
from kv.server.restore import restore
from kv.tools.cluster_up import child_env
from tests.integration.cluster import free_ports, wait_until

pytestmark = pytest.mark.integration


def start_serve(data_dir: Path, port: int, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "kv", "serve", "--listen", f"127.0.0.1:{port}",
                             "--data-dir", str(data_dir)], cwd=cwd, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def serving(address: str) -> Client:
    client = Client(address, timeout=10.0)
    wait_until("the node to lead", lambda: client.status()[0].get("role") == "leader")
    return client


def test_a_second_serve_on_a_data_directory_in_use_is_refused_and_the_first_keeps_its_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first_port, second_port = free_ports(2)
    first = start_serve(data_dir, first_port, tmp_path, tmp_path / "first.log")
    try:
        with serving(f"127.0.0.1:{first_port}") as client:
            client.put("k", "before")
            second = subprocess.run([sys.executable, "-m", "kv", "serve", "--listen", f"127.0.0.1:{second_port}",
                                     "--data-dir", str(data_dir)], cwd=tmp_path, capture_output=True, text=True,
                                    env=child_env(), timeout=60)
            assert second.returncode == 1, second.stderr
            assert f"data directory {data_dir} is in use by process {first.pid}" in second.stderr
            assert "Traceback" not in second.stderr
            client.put("k", "after")  # the first still serves, and its log is not corrupt
            assert client.get("k") == b"after"
        # Killed with SIGKILL, the first leaves no lock: the same directory starts again, data intact.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        again = start_serve(data_dir, second_port, tmp_path, tmp_path / "again.log")
        try:
            with serving(f"127.0.0.1:{second_port}") as client:
                assert client.get("k") == b"after"
        finally:
            stop(again)
    finally:
        stop(first)


HOLD_EMBEDDED = """
import sys, time
import kv.embedded
node = kv.embedded.open(sys.argv[1], listen=sys.argv[2])
print("open", flush=True)
time.sleep(600)
"""


def test_a_second_embedded_node_on_a_directory_another_process_uses_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "meta"
    first_port, second_port = free_ports(2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_EMBEDDED, str(data_dir), f"127.0.0.1:{first_port}"],
                              cwd=tmp_path, stdout=subprocess.PIPE, env=child_env(), start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        import kv.embedded

        with pytest.raises(DataDirInUseError, match=f"in use by process {holder.pid}"):
            kv.embedded.open(data_dir, listen=f"127.0.0.1:{second_port}")
        # Nothing was left bound: the port is free for a node on another directory.
        with kv.embedded.open(tmp_path / "other", listen=f"127.0.0.1:{second_port}") as node:
            node.put("k", "v")
    finally:
        stop(holder)


def test_a_restore_into_a_directory_a_node_uses_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (port,) = free_ports(1)
    node = start_serve(data_dir, port, tmp_path, tmp_path / "node.log")
    try:
        with serving(f"127.0.0.1:{port}") as client:
            client.put("k", "v")
            client.save_snapshot(tmp_path / "backup.snap")
        before = sorted(p.name for p in data_dir.iterdir())
        with pytest.raises(DataDirInUseError, match=f"in use by process {node.pid}"):
            restore(tmp_path / "backup.snap", data_dir, "n1", {"n1": "127.0.0.1:7101"})
        assert sorted(p.name for p in data_dir.iterdir()) == before
    finally:
        stop(node)
