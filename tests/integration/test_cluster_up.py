"""`raftkv cluster up`: starts a local cluster, prints its endpoints, stops it all on Ctrl-C or SIGTERM."""
from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest

from kv import Client
from kv.tools.cluster_up import child_env
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.integration


def consecutive_free_ports(n: int, attempts: int = 50) -> int:
    """A base port such that base .. base+n-1 (client ports) and base+100 .. base+100+n-1 (peer
    ports) were all free a moment ago."""
    for _ in range(attempts):
        base = random.randrange(20000, 60000)
        try:
            with ExitStack() as stack:
                for port in [*range(base, base + n), *range(base + 100, base + 100 + n)]:
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports found")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cluster_up_serves_and_stops_every_member(tmp_path: Path, stop_signal: signal.Signals):
    base = consecutive_free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "kv", "cluster", "up", "--nodes", "3", "--base-port", str(base),
         "--data-dir", str(tmp_path / "c")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=tmp_path)
    lines: list[str] = []
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("endpoints:"):
                break
        endpoints = lines[-1].split(":", 1)[1].strip()
        assert endpoints == ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        with Client(endpoints, timeout=15.0) as client:
            client.put("k", "v")
            assert client.get("k") == b"v"
            roles = wait_until("a leader and two followers",
                               lambda: sorted(s.get("role", "") for s in client.status()) == ["follower", "follower", "leader"])
            assert roles

        process.send_signal(stop_signal)
        assert process.wait(30) == 0
        with Client(endpoints, timeout=0.5) as client:
            assert all("error" in s for s in client.status())  # every member stopped
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # lets it stop its members
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in member_pids(lines):  # whatever is left of them, in their own sessions
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def member_pids(lines: list[str]) -> list[int]:
    """The pids `cluster up` printed, from lines like "n1  127.0.0.1:7001  pid 123  data ..."."""
    return [int(m.group(1)) for line in lines if (m := re.search(r"\bpid (\d+)", line))]


def test_a_killed_member_is_reported_the_others_serve_and_cluster_restart_brings_it_back(tmp_path: Path):
    base = consecutive_free_ports(3)
    data_dir = tmp_path / "c"
    stderr_path = tmp_path / "cluster-up.stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "kv", "cluster", "up", "--nodes", "3", "--base-port", str(base), "--no-fsync",
             "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=child_env(), cwd=tmp_path)
    lines: list[str] = []
    restarted_pid: int | None = None
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("endpoints:"):
                break
        addresses = {f"n{i + 1}": f"127.0.0.1:{base + i}" for i in range(3)}
        pids = dict(zip(addresses, member_pids(lines)))
        with Client(",".join(addresses.values()), timeout=15.0) as client:
            leader = wait_until("a leader", lambda: next((s["id"] for s in client.status() if s.get("role") == "leader"), None))

        os.kill(pids[leader], signal.SIGKILL)
        others = [address for name, address in addresses.items() if name != leader]
        with Client(",".join(others), timeout=15.0) as client:
            wait_until("a new leader among the others",
                       lambda: any(s.get("role") == "leader" for s in client.status()))
            index = client.put("after", "failover")
        report = wait_until("cluster up to report the death",
                            lambda: leader in (text := stderr_path.read_text()) and "SIGKILL" in text and text)
        assert str(data_dir / f"{leader}.log") in report and f"raftkv cluster restart {leader}" in report
        assert process.poll() is None  # cluster up still runs

        restart = subprocess.run([sys.executable, "-m", "kv", "cluster", "restart", leader, "--data-dir", str(data_dir)],
                                 capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=60, check=False)
        assert restart.returncode == 0, restart.stderr
        restarted_pid = int(re.search(r"\bpid (\d+)", restart.stdout).group(1))  # type: ignore[union-attr]
        with Client(addresses[leader], timeout=5.0) as client:
            wait_until(f"{leader} to catch up to index {index}",
                       lambda: client.status()[0].get("applied_index", -1) >= index, timeout=60)
        again = subprocess.run([sys.executable, "-m", "kv", "cluster", "restart", leader, "--data-dir", str(data_dir)],
                               capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=60, check=False)
        assert again.returncode == 1 and f"process {restarted_pid}" in again.stderr  # it runs: refused

        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        with Client(",".join(addresses.values()), timeout=0.5) as client:
            assert all("error" in s for s in client.status())  # every member stopped, the restarted one too
        assert not (data_dir / "cluster.json").exists()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in [*member_pids(lines), *([restarted_pid] if restarted_pid else [])]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_cluster_up_tls_serves_only_tls_clients_and_prints_their_variables(tmp_path: Path):
    base = consecutive_free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "kv", "cluster", "up", "--tls", "--nodes", "3", "--base-port", str(base),
         "--data-dir", str(tmp_path / "c")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=tmp_path)
    lines: list[str] = []
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("endpoints:"):
                break
        exports = dict(line.strip().removeprefix("export ").split("=", 1) for line in lines
                       if line.strip().startswith("export "))
        certs = tmp_path / "c" / "certs"
        assert exports == {"RAFTKV_CACERT": str(certs / "ca.pem"), "RAFTKV_CERT": str(certs / "root.pem"),
                           "RAFTKV_KEY": str(certs / "root-key.pem")}
        endpoints = lines[-1].split(":", 1)[1].strip()
        env = {**child_env(), **exports, "RAFTKV_ENDPOINTS": endpoints}
        put = subprocess.run([sys.executable, "-m", "kv", "put", "k", "v", "--timeout", "15"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert put.returncode == 0, put.stdout + put.stderr
        with Client(endpoints, timeout=0.5) as plaintext:
            assert all("TLS: " in s["error"] for s in plaintext.status())
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in member_pids(lines):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
