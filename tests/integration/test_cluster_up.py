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
