"""`raftkv cluster up`: starts a local cluster, prints its endpoints, stops it all on Ctrl-C or SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from kv import Client
from kv.tools.cluster_up import GATEWAY_PORT_OFFSET, MEMBER_PORT_OFFSETS, child_env, free_port_block, port_block, release_ports
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def base() -> Iterator[int]:
    """A base port such that `cluster up --base-port` finds its client, peer and metrics ports
    free, reserved against other suites on this machine until the test ends."""
    base = free_port_block(3, MEMBER_PORT_OFFSETS)
    yield base
    release_ports(port_block(base, 3, MEMBER_PORT_OFFSETS))


@dataclass
class ClusterUp:
    """A running `raftkv cluster up`: its process, what it printed up to its endpoints line, the
    pids of members started again with `cluster restart`."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    restarted: list[int] = field(default_factory=list)

    @property
    def endpoints(self) -> str:
        return self.lines[-1].split(":", 1)[1].strip()


@contextmanager
def cluster_up(tmp_path: Path, base: int, *flags: str, stderr: IO[bytes] | int = subprocess.STDOUT) -> Iterator[ClusterUp]:
    """Run `raftkv cluster up --nodes 3 --base-port BASE FLAGS` until its endpoints line; at the
    end stop it (SIGINT, so that it stops its members) and kill whatever is left of them."""
    up = ClusterUp(subprocess.Popen(
        [sys.executable, "-m", "kv", "cluster", "up", "--nodes", "3", "--base-port", str(base), *flags],
        stdout=subprocess.PIPE, stderr=stderr, text=True, env=child_env(), cwd=tmp_path))
    try:
        for line in up.process.stdout:  # type: ignore[union-attr]
            up.lines.append(line)
            if line.startswith("endpoints:"):
                break
        yield up
    finally:
        if up.process.poll() is None:
            up.process.send_signal(signal.SIGINT)
            try:
                up.process.wait(30)
            except subprocess.TimeoutExpired:
                up.process.kill()
                up.process.wait()
        for pid in [*member_pids(up.lines), *up.restarted]:  # in their own sessions
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cluster_up_serves_and_stops_every_member(tmp_path: Path, stop_signal: signal.Signals, base: int):
    with cluster_up(tmp_path, base, "--data-dir", str(tmp_path / "c")) as up:
        endpoints = up.endpoints
        assert endpoints == ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        with Client(endpoints, timeout=15.0) as client:
            client.put("k", "v")
            assert client.get("k") == b"v"
            roles = wait_until("a leader and two followers",
                               lambda: sorted(s.get("role", "") for s in client.status()) == ["follower", "follower", "leader"])
            assert roles
            # Each member serves etcd's JSON gateway at its client port + 300, and the one key is there.
            gateway = f"http://127.0.0.1:{base + 2 + GATEWAY_PORT_OFFSET}"
            assert any(gateway in line for line in up.lines)
            request = urllib.request.Request(f"{gateway}/v3/kv/range", data=json.dumps({"key": "aw=="}).encode())
            with urllib.request.urlopen(request, timeout=15) as answer:
                assert [kv["value"] for kv in json.load(answer)["kvs"]] == ["dg=="]  # base64 of "v"

        up.process.send_signal(stop_signal)
        assert up.process.wait(30) == 0
        with Client(endpoints, timeout=0.5) as client:
            assert all("error" in s for s in client.status())  # every member stopped


def member_pids(lines: list[str]) -> list[int]:
    """The pids `cluster up` printed, from lines like "n1  127.0.0.1:7001  pid 123  data ..."."""
    return [int(m.group(1)) for line in lines if (m := re.search(r"\bpid (\d+)", line))]


def test_a_killed_member_is_reported_the_others_serve_and_cluster_restart_brings_it_back(tmp_path: Path, base: int):
    data_dir = tmp_path / "c"
    stderr_path = tmp_path / "cluster-up.stderr"
    with open(stderr_path, "wb") as stderr, \
            cluster_up(tmp_path, base, "--no-fsync", "--data-dir", str(data_dir), stderr=stderr) as up:
        addresses = {f"n{i + 1}": f"127.0.0.1:{base + i}" for i in range(3)}
        pids = dict(zip(addresses, member_pids(up.lines)))
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
        assert up.process.poll() is None  # cluster up still runs

        restart = subprocess.run([sys.executable, "-m", "kv", "cluster", "restart", leader, "--data-dir", str(data_dir)],
                                 capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=60, check=False)
        assert restart.returncode == 0, restart.stderr
        restarted_pid = int(re.search(r"\bpid (\d+)", restart.stdout).group(1))  # type: ignore[union-attr]
        up.restarted.append(restarted_pid)
        with Client(addresses[leader], timeout=5.0) as client:
            wait_until(f"{leader} to catch up to index {index}",
                       lambda: client.status()[0].get("applied_index", -1) >= index, timeout=60)
        again = subprocess.run([sys.executable, "-m", "kv", "cluster", "restart", leader, "--data-dir", str(data_dir)],
                               capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=60, check=False)
        assert again.returncode == 1 and f"process {restarted_pid}" in again.stderr  # it runs: refused

        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(30) == 0
        with Client(",".join(addresses.values()), timeout=0.5) as client:
            assert all("error" in s for s in client.status())  # every member stopped, the restarted one too
        assert not (data_dir / "cluster.json").exists()


def test_cluster_up_tls_serves_only_tls_clients_and_prints_their_variables(tmp_path: Path, base: int):
    with cluster_up(tmp_path, base, "--tls", "--data-dir", str(tmp_path / "c")) as up:
        exports = dict(line.strip().removeprefix("export ").split("=", 1) for line in up.lines
                       if line.strip().startswith("export "))
        certs = tmp_path / "c" / "certs"
        assert exports == {"RAFTKV_CACERT": str(certs / "ca.pem"), "RAFTKV_CERT": str(certs / "root.pem"),
                           "RAFTKV_KEY": str(certs / "root-key.pem")}
        env = {**child_env(), **exports, "RAFTKV_ENDPOINTS": up.endpoints}
        put = subprocess.run([sys.executable, "-m", "kv", "put", "k", "v", "--timeout", "15"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert put.returncode == 0, put.stdout + put.stderr
        with Client(up.endpoints, timeout=3.0) as plaintext:
            assert all("TLS: " in s["error"] for s in plaintext.status())
