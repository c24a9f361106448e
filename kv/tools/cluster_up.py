"""`raftkv cluster up`: a local cluster of `python -m kv serve` processes on 127.0.0.1, for trying
raftkv out. The integration tests build on the same NodeSpec / serve_command."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# The directory holding the kv package: a child process must import the same code as its parent,
# installed or not.
SOURCE_ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """How to start one member of a local cluster: `listen` is its client address, `peers` every
    member's peer address as this member reaches it (its own entry is where it listens for peers,
    unless `listen_peer` says otherwise)."""

    node_id: str
    listen: str
    data_dir: Path
    peers: dict[str, str]
    extra_args: tuple[str, ...] = ()
    listen_peer: str | None = None

    def serve_args(self) -> list[str]:
        peers = ",".join(f"{name}={addr}" for name, addr in sorted(self.peers.items()))
        listen_peer = ["--listen-peer", self.listen_peer] if self.listen_peer is not None else []
        return ["--id", self.node_id, "--listen", self.listen, "--data-dir", str(self.data_dir),
                "--peers", peers, *listen_peer, *self.extra_args]


# free_ports picks from FIRST_PICKED_PORT up to the kernel's ephemeral range.
FIRST_PICKED_PORT = 20000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports(n: int) -> list[int]:
    """n loopback ports that were free a moment ago (held open together so that they differ).

    They are picked below the kernel's ephemeral range when it leaves room: a port the kernel
    hands out for a moment (a bind to port 0) can be handed out again at once, as the local end
    of some connection, before the process meant to listen on it
    binds ("Address already in use", seen once in the integration tests)."""
    floor = _ephemeral_floor()
    with ExitStack() as stack:
        ports: list[int] = []
        if floor is not None and floor - FIRST_PICKED_PORT >= 100 * n:
            for port in random.sample(range(FIRST_PICKED_PORT, floor), min(floor - FIRST_PICKED_PORT, 50 * n)):
                s = stack.enter_context(socket.socket())
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                ports.append(port)
                if len(ports) == n:
                    return ports
        while len(ports) < n:  # no room below the range (or no Linux): let the kernel choose
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def _ephemeral_floor() -> int | None:
    """The first port of the kernel's ephemeral range, when the system says."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def serve_command(spec: NodeSpec) -> list[str]:
    return [sys.executable, "-m", "kv", "serve", *spec.serve_args()]


def child_env() -> dict[str, str]:
    """The environment for a node process: ours, with the source tree importable."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{SOURCE_ROOT}{os.pathsep}{path}" if path else str(SOURCE_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def local_specs(nodes: int, base_port: int, data_dir: Path, extra_args: Sequence[str] = (),
                base_peer_port: int | None = None) -> list[NodeSpec]:
    """n1..nN taking clients on 127.0.0.1:base_port.. and peers on 127.0.0.1:base_peer_port..
    (default: base_port + 100..), each with its data in data_dir/nI."""
    if base_peer_port is None:
        base_peer_port = base_port + 100
    clients = range(base_port, base_port + nodes)
    peer_ports = range(base_peer_port, base_peer_port + nodes)
    if set(clients) & set(peer_ports):
        raise ValueError(f"client ports {base_port}..{clients[-1]} and peer ports {base_peer_port}..{peer_ports[-1]} "
                         f"overlap: give another --base-peer-port")
    if max(clients[-1], peer_ports[-1]) > 65535:
        raise ValueError(f"{nodes} members need ports up to {max(clients[-1], peer_ports[-1])}, past 65535")
    peers = {f"n{i + 1}": f"127.0.0.1:{port}" for i, port in enumerate(peer_ports)}
    return [NodeSpec(name, f"127.0.0.1:{port}", data_dir / name, peers, tuple(extra_args))
            for name, port in zip(peers, clients)]


def stop_processes(processes: Sequence[subprocess.Popen[bytes]], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to all (they shut down in parallel), then SIGKILL whichever has not exited within
    `grace_s`. A stopped (SIGSTOPped) process is continued first so that it can exit."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class LocalCluster:
    """Processes started from specs, each logging to data_dir/<id>.log."""

    specs: list[NodeSpec]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def log_path(self, node_id: str) -> Path:
        return self.log_dir / f"{node_id}.log"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for spec in self.specs:
            spec.data_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path(spec.node_id), "ab")
            self._logs.append(log)
            self.processes[spec.node_id] = subprocess.Popen(
                serve_command(spec), stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                # Ctrl-C reaches only us; we stop the members in order.
                start_new_session=True)

    def exited(self) -> dict[str, int]:
        """Members whose process has exited, with their exit codes."""
        return {name: code for name, p in self.processes.items() if (code := p.poll()) is not None}

    def stop(self) -> None:
        stop_processes(list(self.processes.values()))
        for log in self._logs:
            log.close()
        self._logs.clear()


def run(nodes: int, base_port: int, data_dir: Path, extra_args: Sequence[str] = (), out: IO[str] = sys.stdout,
        base_peer_port: int | None = None) -> int:
    """Start the cluster, print how to reach it, wait for Ctrl-C (or a member dying), stop all."""
    if nodes < 1:
        raise ValueError("--nodes must be at least 1")
    specs = local_specs(nodes, base_port, data_dir.resolve(), extra_args, base_peer_port)
    _stop_on_signals()
    cluster = LocalCluster(specs, data_dir.resolve())
    try:
        cluster.start()
        endpoints = ",".join(spec.listen for spec in cluster.specs)
        for spec in cluster.specs:
            pid = cluster.processes[spec.node_id].pid
            print(f"{spec.node_id}  {spec.listen}  peers on {spec.peers[spec.node_id]}  pid {pid}  data {spec.data_dir}  "
                  f"log {cluster.log_path(spec.node_id)}", file=out)
        print(f"endpoints: {endpoints}", file=out)
        print(f"try: raftkv status --endpoints {endpoints}    (Ctrl-C stops the cluster)", file=out, flush=True)
        while not (dead := cluster.exited()):
            time.sleep(0.5)  # polling children: nothing to await across processes without a helper
        for name, code in dead.items():
            print(f"{name} exited with code {code}; see {cluster.log_path(name)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping", file=out)
        return 0
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave members running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM both stop the cluster in order. The members run in their own sessions
    (so Ctrl-C reaches only us), hence a SIGTERM that simply killed us would orphan them; and a
    shell starting us in the background may have set SIGINT to be ignored."""
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
