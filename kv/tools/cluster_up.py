"""`raftkv cluster up`: a local cluster of `python -m kv serve` processes on 127.0.0.1, for trying
raftkv out, and `raftkv cluster restart`, which starts one of its members again. The integration
tests build on the same NodeSpec / serve_command.

`cluster up` supervises: a member that dies is reported once on stderr and the others keep
serving (killing the leader is how one tries failover). `cluster restart` starts the member again,
detached, from the state file `cluster up` keeps in its directory (cluster_state.py); `cluster up`
takes the new process's pid from that file, reports it, and stops it with the others.

`cluster up --tls` makes a CA and certificates in DATA_DIR/certs (kv/tools/certs.py: one per member,
and a client certificate "root") and starts every member with TLS on its client port and its peer
port; a restart reuses the same command, hence the same TLS."""
from __future__ import annotations

import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from kv.tools.certs import DEFAULT_HOSTS, ensure_ca, issue
from kv.tools.cluster_state import (
    ClusterState,
    MemberRecord,
    data_dir_holder,
    holds_data_dir,
    pid_running,
    read_state,
    remove_state,
    state_lock,
    write_state,
)

# The directory holding the kv package: a child process must import the same code as its parent,
# installed or not.
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # kv/tools/cluster_up.py -> the tree holding kv/
STOP_GRACE_S = 10.0
SUPERVISE_POLL_S = 0.5  # how often `cluster up` looks at its members
RESTART_WAIT_S = 30.0  # how long `cluster restart` waits for the member to take its data directory


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
    metrics_url: str | None = None  # --listen-metrics-urls: /metrics, /health, /readyz, /livez
    gateway_url: str | None = None  # --listen-client-http-urls: etcd's JSON gateway (and the above)

    def serve_args(self) -> list[str]:
        peers = ",".join(f"{name}={addr}" for name, addr in sorted(self.peers.items()))
        listen_peer = ["--listen-peer", self.listen_peer] if self.listen_peer is not None else []
        metrics = ["--listen-metrics-urls", self.metrics_url] if self.metrics_url is not None else []
        gateway = ["--listen-client-http-urls", self.gateway_url] if self.gateway_url is not None else []
        return ["--id", self.node_id, "--listen", self.listen, "--data-dir", str(self.data_dir),
                "--peers", peers, *listen_peer, *metrics, *gateway, *self.extra_args]


# From one base port, a member's peer port is its client port + this (7001 -> 7101), its metrics
# listener its client port + METRICS_PORT_OFFSET (7001 -> 7201), its etcd JSON gateway its client
# port + GATEWAY_PORT_OFFSET (7001 -> 7301).
PEER_PORT_OFFSET = 100
METRICS_PORT_OFFSET = 200
GATEWAY_PORT_OFFSET = 300
MEMBER_PORT_OFFSETS = (0, PEER_PORT_OFFSET, METRICS_PORT_OFFSET, GATEWAY_PORT_OFFSET)

# free_ports picks from FIRST_PICKED_PORT up to the kernel's ephemeral range.
FIRST_PICKED_PORT = 20000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


# Where free_ports reserves the ports it hands out, for every process on this machine that uses it:
# PORT_LOCK_DIR/<port> is flock()ed by the process holding the port's reservation.
PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "raftkv-ports"
# This process's reservations: port -> the descriptor of its locked file.
_reserved: dict[int, int] = {}
_reserved_guard = threading.Lock()


def free_ports(n: int) -> list[int]:
    """n loopback ports that were free a moment ago (held open together so that they differ), each
    reserved for this process until release_ports() (Cluster.close) or its exit.

    They are picked below the kernel's ephemeral range when it leaves room: a port the kernel
    hands out for a moment (a bind to port 0) can be handed out again at once, as the local end
    of some connection, before the process meant to listen on it
    binds ("Address already in use", seen once in the integration tests).

    A port is only free until a member binds it, seconds later on a busy machine, and again
    whenever that member is stopped for a restart. Another test run on the same machine, picking
    from the same range, could hand it out meanwhile and one of the two members would fail to bind
    ("address already in use" on a peer port, seen with two suites side by side): the reservation,
    an flock on PORT_LOCK_DIR/<port> that every free_ports respects and the kernel drops when its
    holder dies, keeps a port out of everybody else's picks while its picker may use it."""
    floor = _ephemeral_floor()
    with ExitStack() as stack, _reserved_guard:
        ports: list[int] = []
        if floor is not None and floor - FIRST_PICKED_PORT >= 100 * n:
            for port in random.sample(range(FIRST_PICKED_PORT, floor), min(floor - FIRST_PICKED_PORT, 50 * n)):
                if not _take(port, stack):
                    continue
                ports.append(port)
                if len(ports) == n:
                    return ports
        while len(ports) < n:  # no room below the range (or no Linux): let the kernel choose
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in _reserved:
                _reserve(port)  # held by nobody else: the kernel gave it to us alone
            ports.append(port)
        return ports


def free_port_block(n: int, offsets: Sequence[int]) -> int:
    """A base port such that the n ports from base + offset, for each offset, were free a moment
    ago; each reserved as free_ports reserves them (`port_block` names them for release_ports).
    For `raftkv cluster up --base-port`, which numbers a member's ports from one base. Picked
    below the kernel's ephemeral range; RuntimeError when no such block is found there."""
    floor = _ephemeral_floor() or 32768
    top = floor - max(offsets) - n
    if top <= FIRST_PICKED_PORT:
        raise RuntimeError(f"no room for {n} ports at offsets {list(offsets)} below port {floor}")
    with _reserved_guard:
        for base in random.sample(range(FIRST_PICKED_PORT, top), min(top - FIRST_PICKED_PORT, 200)):
            with ExitStack() as stack:
                taken: list[int] = []
                for port in port_block(base, n, offsets):
                    if not _take(port, stack):
                        break
                    taken.append(port)
                else:
                    return base
                for port in taken:
                    _release(port)
    raise RuntimeError(f"no block of {n} free ports at offsets {list(offsets)} found below port {floor}")


def port_block(base: int, n: int, offsets: Sequence[int]) -> list[int]:
    return [base + offset + i for offset in offsets for i in range(n)]


def _take(port: int, stack: ExitStack) -> bool:
    """Reserve `port` and bind it (the socket stays open in `stack`): False, and nothing held,
    when another process has reserved it or something is bound to it."""
    if port in _reserved or not _reserve(port):
        return False
    s = stack.enter_context(socket.socket())
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        _release(port)
        return False
    return True


def release_ports(ports: Iterable[int]) -> None:
    """End this process's reservation of `ports` (their members stopped for good)."""
    with _reserved_guard:
        for port in ports:
            _release(port)


def _reserve(port: int) -> bool:
    """Take the machine-wide reservation of `port`: False when another process holds it. Where the
    lock files cannot be made at all, every port counts as unreserved, as before reservations."""
    try:
        if not PORT_LOCK_DIR.is_dir():
            PORT_LOCK_DIR.mkdir(exist_ok=True)
            PORT_LOCK_DIR.chmod(0o1777)  # every user's reservations, as in /tmp
        fd = os.open(PORT_LOCK_DIR / str(port), os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write access
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process
        os.close(fd)
        return False
    _reserved[port] = fd
    return True


def _release(port: int) -> None:
    """The lock file stays: removing it could let two processes lock two different files."""
    fd = _reserved.pop(port, None)
    if fd is not None:
        os.close(fd)


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
    """n1..nN on 127.0.0.1: clients at base_port.., peers at base_peer_port.. (base_port + 100..),
    metrics at base_port + 200.., etcd's JSON gateway at base_port + 300..; data in data_dir/nI."""
    if base_peer_port is None:
        base_peer_port = base_port + PEER_PORT_OFFSET
    clients = range(base_port, base_port + nodes)
    peer_ports = range(base_peer_port, base_peer_port + nodes)
    metrics_ports = range(base_port + METRICS_PORT_OFFSET, base_port + METRICS_PORT_OFFSET + nodes)
    gateway_ports = range(base_port + GATEWAY_PORT_OFFSET, base_port + GATEWAY_PORT_OFFSET + nodes)
    every = [*clients, *peer_ports, *metrics_ports, *gateway_ports]
    if len(set(every)) < len(every):
        raise ValueError(f"client ports {base_port}.., peer ports {base_peer_port}.., metrics and gateway ports (client "
                         f"+ 200.., + 300..) overlap for {nodes} members: give another --base-peer-port")
    if max(every) > 65535:
        raise ValueError(f"{nodes} members need ports up to {max(every)}, past 65535")
    peers = {f"n{i + 1}": f"127.0.0.1:{port}" for i, port in enumerate(peer_ports)}
    return [NodeSpec(name, f"127.0.0.1:{port}", data_dir / name, peers, tuple(extra_args),
                     metrics_url=f"http://127.0.0.1:{metrics}", gateway_url=f"http://127.0.0.1:{gateway}")
            for name, port, metrics, gateway in zip(peers, clients, metrics_ports, gateway_ports)]


CERTS_DIR = "certs"
CLIENT_CERT_NAME = "root"  # the client certificate `cluster up --tls` makes (CN root, etcd's root user)


@dataclass(frozen=True, slots=True)
class ClientFiles:
    """What a client of a `cluster up --tls` cluster needs: --cacert, --cert, --key."""

    ca: Path
    cert: Path
    key: Path

    def export_lines(self) -> list[str]:
        return [f"export RAFTKV_CACERT={self.ca}", f"export RAFTKV_CERT={self.cert}", f"export RAFTKV_KEY={self.key}"]


def with_tls(specs: Sequence[NodeSpec], certs_dir: Path) -> tuple[list[NodeSpec], ClientFiles]:
    """`specs` started with TLS on both ports, from certificates made in `certs_dir` (the CA once,
    kept across runs; each member's and the client's again on each run, under the same CA). The
    client port does not ask clients for a certificate (gRPC requests none without
    --client-cert-auth), so RAFTKV_CACERT alone reaches it; the peer port requires one
    (--peer-client-cert-auth). The client certificate is for members started with
    --client-cert-auth, and for being known as a user by it later."""
    ca = ensure_ca(certs_dir)
    secured = []
    for spec in specs:
        member = issue(certs_dir, spec.node_id, DEFAULT_HOSTS, server=True)
        flags = ("--cert-file", str(member.cert), "--key-file", str(member.key), "--trusted-ca-file", str(ca.cert),
                 "--peer-cert-file", str(member.cert), "--peer-key-file", str(member.key),
                 "--peer-trusted-ca-file", str(ca.cert), "--peer-client-cert-auth")
        # The gateway speaks TLS where the client port does, with its certificate.
        gateway = spec.gateway_url.replace("http://", "https://", 1) if spec.gateway_url else None
        secured.append(replace(spec, extra_args=(*spec.extra_args, *flags), gateway_url=gateway))
    client = issue(certs_dir, CLIENT_CERT_NAME, server=False)
    return secured, ClientFiles(ca.cert, client.cert, client.key)


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


class ClusterError(Exception):
    """`cluster up` cannot start, or `cluster restart` cannot restart: one line for the user."""


def run(nodes: int, base_port: int, data_dir: Path, extra_args: Sequence[str] = (), out: IO[str] = sys.stdout,
        base_peer_port: int | None = None, err: IO[str] = sys.stderr, tls: bool = False) -> int:
    """Start the cluster (with `tls`: TLS on every port, see `with_tls`), print how to reach it,
    supervise it until Ctrl-C or SIGTERM (exit 0) or until no member is left running (exit 1);
    stop every member, restarted ones included."""
    if nodes < 1:
        raise ValueError("--nodes must be at least 1")
    cluster_dir = data_dir.resolve()
    specs = local_specs(nodes, base_port, cluster_dir, extra_args, base_peer_port)
    _refuse_a_second_supervisor(cluster_dir)
    client_files = None
    if tls:
        specs, client_files = with_tls(specs, cluster_dir / CERTS_DIR)
    _stop_on_signals()
    cluster = LocalCluster(specs, cluster_dir)
    try:
        cluster.start()
        write_state(cluster_dir, _initial_state(cluster, client_files))
        _print_members(cluster, out, client_files)
        return _supervise(cluster, cluster_dir, out, err)
    except KeyboardInterrupt:
        print("stopping", file=out, flush=True)
        return 0
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave members running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_all(cluster, cluster_dir)


def _refuse_a_second_supervisor(cluster_dir: Path) -> None:
    """Two `cluster up` on one directory would overwrite each other's state file (the second's
    members would be refused their data directories anyway)."""
    state = read_state(cluster_dir)
    if state is not None and state.supervisor_pid != os.getpid() and pid_running(state.supervisor_pid):
        raise ClusterError(f"a cluster is already running in {cluster_dir} (`raftkv cluster up`, pid "
                           f"{state.supervisor_pid}): stop it, or give another --data-dir")


def _initial_state(cluster: LocalCluster, client_files: ClientFiles | None) -> ClusterState:
    members = {spec.node_id: MemberRecord(serve_command(spec), cluster.processes[spec.node_id].pid,
                                          str(cluster.log_path(spec.node_id)), str(spec.data_dir))
               for spec in cluster.specs}
    tls_env = client_files.export_lines() if client_files is not None else []
    return ClusterState(os.getpid(), child_env()["PYTHONPATH"], members, tls_env)


def _print_members(cluster: LocalCluster, out: IO[str], client_files: ClientFiles | None) -> None:
    endpoints = ",".join(spec.listen for spec in cluster.specs)
    for spec in cluster.specs:
        pid = cluster.processes[spec.node_id].pid
        metrics = f"  metrics {spec.metrics_url}/metrics" if spec.metrics_url else ""
        gateway = f"  etcd JSON {spec.gateway_url}" if spec.gateway_url else ""
        print(f"{spec.node_id}  {spec.listen}  peers on {spec.peers[spec.node_id]}{metrics}{gateway}  pid {pid}  "
              f"data {spec.data_dir}  log {cluster.log_path(spec.node_id)}", file=out)
    if client_files is not None:
        print(f"TLS on every port; certificates in {client_files.ca.parent}. For the CLI (or Client(tls=...)):",
              file=out)
        for line in client_files.export_lines():
            print(f"  {line}", file=out)
    print(f"endpoints: {endpoints}", file=out)
    print(f"try: raftkv status --endpoints {endpoints}    (Ctrl-C stops the cluster)", file=out, flush=True)


@dataclass
class Member:
    """A member as the supervisor sees it: its latest pid (its child's, or the process
    `cluster restart` started), and whether its death has been reported."""

    node_id: str
    pid: int
    child: subprocess.Popen[bytes] | None
    down: bool = False

    def running(self) -> bool:
        if self.child is not None and self.child.pid == self.pid:
            return self.child.poll() is None
        return pid_running(self.pid)

    def how_it_ended(self) -> str:
        code = self.child.returncode if self.child is not None and self.child.pid == self.pid else None
        if code is None:
            return "exited"  # not our child: its exit status went to its own parent
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


def _supervise(cluster: LocalCluster, cluster_dir: Path, out: IO[str], err: IO[str]) -> int:
    """Report each death once and each restart; return 1 when no member is left running."""
    members = {name: Member(name, p.pid, p) for name, p in cluster.processes.items()}
    while True:
        state = read_state(cluster_dir)
        for member in members.values():
            _notice_restart(member, state, out)
            if not member.down and not member.running():
                member.down = True
                _report_death(member, cluster, cluster_dir, err)
        if all(member.down for member in members.values()):
            print("raftkv cluster up: no member is left running; stopping", file=err, flush=True)
            return 1
        time.sleep(SUPERVISE_POLL_S)  # processes we did not start give no event to wait on


def _notice_restart(member: Member, state: ClusterState | None, out: IO[str]) -> None:
    record = state.members.get(member.node_id) if state is not None else None
    if record is not None and record.pid != member.pid:
        member.pid, member.down = record.pid, False
        print(f"{member.node_id} restarted: pid {record.pid}", file=out, flush=True)


def _report_death(member: Member, cluster: LocalCluster, cluster_dir: Path, err: IO[str]) -> None:
    print(f"raftkv cluster up: {member.node_id} (pid {member.pid}) {member.how_it_ended()}; the other members keep "
          f"running. Its log: {cluster.log_path(member.node_id)}. Start it again with: "
          f"raftkv cluster restart {member.node_id} --data-dir {cluster_dir}", file=err, flush=True)


def _stop_all(cluster: LocalCluster, cluster_dir: Path) -> None:
    """Stop our children and the members `cluster restart` started, in parallel, under the state
    lock (so that no restart slips in), then remove the state file."""
    with state_lock(cluster_dir):
        restarted = _restarted_pids(cluster, read_state(cluster_dir))
        for pid in restarted:
            _signal(pid, signal.SIGTERM)
        cluster.stop()
        deadline = time.monotonic() + STOP_GRACE_S
        for pid in restarted:
            while pid_running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)  # not our child: nothing to wait on but its pid
            if pid_running(pid):
                _signal(pid, signal.SIGKILL)
        remove_state(cluster_dir)


def _restarted_pids(cluster: LocalCluster, state: ClusterState | None) -> list[int]:
    """The pids of running members that `cluster restart` started. A pid counts only while it
    holds its member's data directory, so that a reused pid is never signalled."""
    if state is None or state.supervisor_pid != os.getpid():
        return []  # no file yet, or one left by an earlier `cluster up` that did not stop cleanly
    children = {p.pid for p in cluster.processes.values()}
    return [record.pid for record in state.members.values()
            if record.pid not in children and pid_running(record.pid)
            and holds_data_dir(record.pid, Path(record.data_dir)) and data_dir_holder(Path(record.data_dir))]


def _signal(pid: int, signum: signal.Signals) -> None:
    try:
        os.kill(pid, signum)
        if signum == signal.SIGTERM:
            os.kill(pid, signal.SIGCONT)  # a stopped (SIGSTOPped) member must run to exit
    except ProcessLookupError:
        pass


def restart(node_id: str, data_dir: Path, out: IO[str] = sys.stdout) -> int:
    """Start member `node_id` of the `cluster up` running in `data_dir` again, detached, with the
    command it was first started with, appending to the same log. Refused while `cluster up` is
    not running (nothing would stop the member) or while the member's data directory is held."""
    cluster_dir = data_dir.resolve()
    with state_lock(cluster_dir):
        state = read_state(cluster_dir)
        if state is None or not pid_running(state.supervisor_pid):
            raise ClusterError(f"no `raftkv cluster up` is running with --data-dir {cluster_dir}")
        record = state.members.get(node_id)
        if record is None:
            raise ClusterError(f"no member {node_id!r} in {cluster_dir}; its members are {', '.join(state.members)}")
        holder = data_dir_holder(Path(record.data_dir))
        if holder is not None:
            raise ClusterError(f"{node_id} is running: its data directory {record.data_dir} is held by {holder}")
        process = _start_detached(record, state.pythonpath)
        _wait_started(node_id, process, record)
        write_state(cluster_dir, state.with_pid(node_id, process.pid))
    print(f"{node_id} restarted: pid {process.pid}, log {record.log}", file=out, flush=True)
    if state.tls_env:  # its command carries its TLS flags; remind how clients reach it
        print("TLS: clients need " + "; ".join(state.tls_env), file=out, flush=True)
    return 0


def _start_detached(record: MemberRecord, pythonpath: str) -> subprocess.Popen[bytes]:
    env = {**child_env(), "PYTHONPATH": pythonpath}
    with open(record.log, "ab") as log:
        # Its own session: it outlives this command, and the terminal's Ctrl-C does not reach it.
        return subprocess.Popen(record.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _wait_started(node_id: str, process: subprocess.Popen[bytes], record: MemberRecord) -> None:
    """Until the member holds its data directory (it started; it catches up on its own), or exits."""
    deadline = time.monotonic() + RESTART_WAIT_S
    while not holds_data_dir(process.pid, Path(record.data_dir)):
        if process.poll() is not None:
            raise ClusterError(f"{node_id} exited with code {process.returncode} as it started; see {record.log}")
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise ClusterError(f"{node_id} did not take its data directory within {RESTART_WAIT_S:.0f} s; "
                               f"see {record.log}")
        time.sleep(0.05)  # the serve process gives no event to wait on


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM both stop the cluster in order. The members run in their own sessions
    (so Ctrl-C reaches only us), hence a SIGTERM that simply killed us would orphan them; and a
    shell starting us in the background may have set SIGINT to be ignored."""
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
