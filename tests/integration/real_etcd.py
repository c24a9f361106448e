"""Real etcd 3.4 members on 127.0.0.1, for the tests that compare raftkv with etcd or run an etcd
client program against both: one member (start_etcd) or a cluster of them (EtcdCluster), on free
loopback ports, data and output under a directory of the test's, killed with SIGKILL, and killed
by the kernel too when the test process dies, however it dies."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kv.tools.cluster_up import free_ports, release_ports

ETCD = shutil.which("etcd")
ETCDCTL = shutil.which("etcdctl")
NEEDS_ETCD = "needs etcd and etcdctl 3.4 on PATH (Debian: apt-get install etcd-server etcd-client)"
# The mark of a test module that runs etcd and etcdctl beside raftkv.
needs_etcd = pytest.mark.skipif(ETCD is None or ETCDCTL is None, reason=NEEDS_ETCD)

# Elections as quick as the raftkv harness's (tests/integration/cluster.py FAST_TIMING), so that a
# test that kills etcd's leader waits about as long as one that kills raftkv's.
FAST_TIMING = ("--heartbeat-interval", "50", "--election-timeout", "500")

# As the harness's nodes: prctl(PR_SET_PDEATHSIG) kept across exec, and the ppid check for a
# parent that died before the prctl.
_ORPHAN_GUARD = """
import ctypes, os, signal, sys

import pytest
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def guarded(command: list[str]) -> list[str]:
    """`command` (its first word an absolute path) run so that it dies with this process."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *command]


def _etcd_env() -> dict[str, str]:
    # No ETCD_* variable of the caller's may configure it (etcd reads its flags from them too).
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}


@dataclass
class Etcd:
    """One etcd member: its client address, and while it runs, its process."""

    name: str
    endpoint: str  # host:port of its client URL
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Etcd:
        assert not self.running, f"etcd {self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(guarded(self.command), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=_etcd_env())
        return self

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"etcd {self.name} exited with code {self.process.returncode}:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL (a crash); stopped on purpose, so check_alive no longer reports it."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self.process = None


def _member_command(name: str, data_dir: Path, client_port: int, peer: str,
                    initial_cluster: str, extra_args: tuple[str, ...]) -> list[str]:
    assert ETCD is not None, NEEDS_ETCD
    client = f"http://127.0.0.1:{client_port}"
    return [ETCD, "--data-dir", str(data_dir), "--name", name,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", initial_cluster, *extra_args]


def start_etcd(base: Path, name: str = "default", peer_url: str | None = None, initial_cluster: str | None = None,
               existing: bool = False) -> Etcd:
    """One etcd member on free loopback ports, data in `base`/data, output in `base`/etcd.log: a
    cluster of its own, or (`existing`) the member `name` at `peer_url` joining `initial_cluster`."""
    client_port, peer_port = free_ports(2)
    peer = peer_url or f"http://127.0.0.1:{peer_port}"
    command = _member_command(name, base / "data", client_port, peer, initial_cluster or f"{name}={peer}",
                              ("--initial-cluster-state", "existing") if existing else ())
    return Etcd(name, f"127.0.0.1:{client_port}", command, base / "etcd.log").start()


@dataclass
class EtcdCluster:
    """Members e1..eN, started together as one new cluster, each with `extra_args`."""

    base_dir: Path
    size: int = 3
    extra_args: tuple[str, ...] = FAST_TIMING
    members: list[Etcd] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = free_ports(2 * self.size)
        client_ports, peer_ports = self.ports[:self.size], self.ports[self.size:]
        names = [f"e{i + 1}" for i in range(self.size)]
        initial = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in zip(names, peer_ports))
        for name, client_port, peer_port in zip(names, client_ports, peer_ports):
            command = _member_command(name, self.base_dir / name, client_port, f"http://127.0.0.1:{peer_port}",
                                      initial, self.extra_args)
            self.members.append(Etcd(name, f"127.0.0.1:{client_port}", command, self.base_dir / f"{name}.log"))

    def start(self) -> EtcdCluster:
        for member in self.members:
            member.start()
        return self

    @property
    def client_urls(self) -> list[str]:
        return [member.client_url for member in self.members]

    def close(self) -> None:
        """Kill every member. Never raises."""
        for member in self.members:
            try:
                member.kill()
            except Exception:  # noqa: BLE001 - teardown must reach every member
                pass
        release_ports(self.ports)

    def log_tails(self) -> str:
        return "\n".join(f"==== etcd {m.name} ({m.log_path})\n{m.log_tail()}" for m in self.members)
