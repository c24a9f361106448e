"""A cluster of real `python -m kv serve` processes on 127.0.0.1 for the integration tests: free
ports, a temporary data directory per node, SIGKILL / restart / SIGSTOP / SIGCONT, and a teardown
that always kills everything it started."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import grpc

from kv import TLS, Client
from kv.tools.cluster_up import NodeSpec, child_env, free_ports, release_ports, serve_command
from kv.client.client import CHANNEL_OPTIONS
from kv.client.tls import open_channel
from raftkv_proto import etcd_rpc_pb2, etcd_rpc_pb2_grpc, kv_pb2_grpc

T = TypeVar("T")

# Fast elections keep the tests short; the heartbeat stays well below the timeout so that a
# loaded machine does not see spurious elections.
FAST_TIMING = ("--election-timeout-ms", "500", "--heartbeat-interval-ms", "50")
# For tests that assert the term did not change (nothing they sent disturbed the leader): twice the
# margin against an election that a stalled process on a busy machine would cause.
STEADY_TIMING = ("--election-timeout-ms", "1000", "--heartbeat-interval-ms", "100")
POLL_S = 0.05
# How long Cluster.status asks a running member again that did not answer.
STATUS_ANSWER_S = 20.0
LOG_TAIL_LINES = 40

# Runs a node so that the kernel SIGKILLs it when the test process dies, however it dies (even
# SIGKILLed itself, when no teardown runs): prctl(PR_SET_PDEATHSIG), kept across exec; the ppid
# check covers a parent that died before the prctl.
_ORPHAN_GUARD = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def guarded_command(spec: NodeSpec) -> list[str]:
    command = serve_command(spec)
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *command[1:]]


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL when it has not stopped within 15 s (a teardown that must not hang)."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 20.0) -> T:
    """Poll `probe` until it returns something truthy. Processes give no events to await, so the
    tests poll status, briefly, with a deadline and a message saying what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except AssertionError:
            raise
        except Exception as error:  # a probe may fail while nodes come and go
            last = error
        else:
            if last:
                return last
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last probe: {last!r}")


async def eventually(what: str, done: Callable[[], object], timeout: float = 30.0) -> None:
    """wait_until inside an event loop: poll `done()`, the loop running meanwhile, until it holds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        await asyncio.sleep(0.01)


@dataclass
class NodeProcess:
    """One member: its spec and, while it runs, its process (output appended to its log)."""

    spec: NodeSpec
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    _log: IO[bytes] | None = None

    @property
    def id(self) -> str:
        return self.spec.node_id

    @property
    def address(self) -> str:
        """Where clients reach it (--listen)."""
        return self.spec.listen

    @property
    def peer_address(self) -> str:
        """Where it takes its peers' connections (its own --peers entry)."""
        return self.spec.listen_peer or self.spec.peers[self.spec.node_id]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        """Fail at once, with its log, if the process exited although nobody stopped it."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.id} exited with code {self.process.returncode}:\n{self.log_tail()}")

    def start(self) -> None:
        assert not self.running, f"{self.id} is already running"
        self.spec.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"---- start: {' '.join(serve_command(self.spec))}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(guarded_command(self.spec), stdout=self._log, stderr=subprocess.STDOUT,
                                        env=child_env(), start_new_session=True)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed or closed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self._reap()

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        assert self.process is not None
        self.resume()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        self._reap()
        return code

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait for the process to end on its own (nothing is sent to it); returns its exit code."""
        assert self.process is not None, f"{self.id} was not started"
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.id} still runs after {timeout:.0f}s:\n{self.log_tail()}") from None
        self._reap()
        return code

    def pause(self) -> None:
        assert self.running
        self.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        self.paused = True

    def resume(self) -> None:
        if self.paused and self.running:
            self.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        self.paused = False

    def _reap(self) -> None:
        if self.process is not None:
            self.process.wait()
            self.process = None  # stopped on purpose: not a death check_alive should report
        if self._log is not None:
            self._log.close()
            self._log = None
        self.paused = False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Cluster:
    """N members n1..nN, each taking clients on a port of its own (--listen) and peers on another
    (its --peers entry); every member is started with --peers naming all of them, `extra_args`,
    and `node_args(its id)` (flags that differ per member, as its TLS certificate). With a
    `client_tls`, the cluster's clients (client(), status()) use it."""

    base_dir: Path
    size: int = 3
    extra_args: tuple[str, ...] = FAST_TIMING
    node_args: Callable[[str], tuple[str, ...]] | None = None
    client_tls: TLS | None = None
    nodes: dict[str, NodeProcess] = field(default_factory=dict)
    _clients: list[Client] = field(default_factory=list)
    _channels: list[grpc.Channel] = field(default_factory=list)
    metrics: bool = False  # each member serves /metrics and /health (--listen-metrics-urls)
    ports: list[int] = field(default_factory=list)  # reserved by free_ports until close()

    def __post_init__(self) -> None:
        ports = self.ports = free_ports(3 * self.size)  # one call, so that no port is handed out twice
        names = [f"n{i + 1}" for i in range(self.size)]
        peers = {name: f"127.0.0.1:{port}" for name, port in zip(names, ports[self.size:])}
        metrics_ports = ports[2 * self.size:]
        for i, (name, port) in enumerate(zip(names, ports)):
            args = (*self.extra_args, *(self.node_args(name) if self.node_args is not None else ()))
            spec = NodeSpec(name, f"127.0.0.1:{port}", self.base_dir / name, peers, args,
                            metrics_url=f"http://127.0.0.1:{metrics_ports[i]}" if self.metrics else None)
            self.nodes[name] = NodeProcess(spec, self.base_dir / f"{name}.log")

    def joining_member(self, node_id: str, join: Iterable[str] | None = None) -> NodeProcess:
        """A new member's process, not started: an empty data directory, its own client and peer
        ports, `serve --join` with the client addresses of `join` (default: every member so far).
        Add it to the cluster first (member add), then start it."""
        client_port, peer_port = ports = free_ports(2)
        self.ports.extend(ports)  # released with the others' at close()
        endpoints = ",".join(self.nodes[n].address for n in (join if join is not None else self.nodes))
        args = (*self.extra_args, *(self.node_args(node_id) if self.node_args is not None else ()),
                "--join", endpoints)
        spec = NodeSpec(node_id, f"127.0.0.1:{client_port}", self.base_dir / node_id,
                        {node_id: f"127.0.0.1:{peer_port}"}, args)
        node = self.nodes[node_id] = NodeProcess(spec, self.base_dir / f"{node_id}.log")
        return node

    def metrics_url(self, node_id: str) -> str:
        url = self.nodes[node_id].spec.metrics_url
        assert url is not None, "start the Cluster with metrics=True"
        return url

    # ---- processes ---------------------------------------------------------------------------

    def start(self) -> Cluster:
        for node in self.nodes.values():
            node.start()
        return self

    def kill(self, node_id: str) -> None:
        self.nodes[node_id].kill()

    def terminate(self, node_id: str) -> int:
        """A clean stop (SIGTERM); returns the exit code."""
        return self.nodes[node_id].terminate()

    def start_node(self, node_id: str) -> None:
        """Start a stopped member again, on its data directory."""
        self.nodes[node_id].start()

    def restart(self, node_id: str) -> None:
        """Kill (if running) and start again on the same data directory."""
        node = self.nodes[node_id]
        node.kill()
        node.start()

    def pause(self, node_id: str) -> None:
        self.nodes[node_id].pause()

    def resume(self, node_id: str) -> None:
        self.nodes[node_id].resume()

    def close(self) -> None:
        """Kill everything, whatever state it is in. Never raises."""
        for client in self._clients:
            client.close()
        for channel in self._channels:
            channel.close()
        for node in self.nodes.values():
            try:
                node.resume()
                node.kill()
            except Exception:  # noqa: BLE001 - teardown must reach every node
                pass
        release_ports(self.ports)  # no member of ours will bind them again

    def log_tails(self) -> str:
        return "\n".join(f"==== {node.id} ({node.log_path})\n{node.log_tail()}" for node in self.nodes.values())

    # ---- talking to it -----------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        return [node.address for node in self.nodes.values()]

    def client(self, node_ids: Iterable[str] | None = None, timeout: float = 10.0, **kwargs: Any) -> Client:
        """A Client of the given members (default: all), closed at teardown."""
        ids = list(node_ids) if node_ids is not None else list(self.nodes)
        kwargs.setdefault("tls", self.client_tls)
        client = Client([self.nodes[i].address for i in ids], timeout=timeout, **kwargs)
        self._clients.append(client)
        return client

    def _channel(self, node_id: str) -> grpc.Channel:
        credentials = self.client_tls.credentials() if self.client_tls is not None else None
        channel = open_channel(self.nodes[node_id].address, credentials, CHANNEL_OPTIONS)
        self._channels.append(channel)
        return channel

    def kv_stub(self, node_id: str) -> kv_pb2_grpc.KVStub:
        """A raw stub of one member: no leader following, no retries."""
        return kv_pb2_grpc.KVStub(self._channel(node_id))

    def status(self, node_id: str, timeout: float = 1.0, answer_within: float = STATUS_ANSWER_S) -> dict[str, Any]:
        """The member's status. One that runs (not stopped, not paused) but does not answer within
        `timeout` (a busy machine, a process still starting) is asked again until `answer_within`;
        then, or at once for a stopped or paused member, the dict with "error" comes back."""
        node = self.nodes[node_id]
        deadline = time.monotonic() + answer_within
        while True:
            with Client([node.address], timeout=timeout, tls=self.client_tls) as client:
                (status,) = client.status()
            if "error" not in status or not node.running or node.paused or time.monotonic() >= deadline:
                return status
            time.sleep(POLL_S)

    def statuses(self, node_ids: Iterable[str] | None = None, timeout: float = 1.0) -> dict[str, dict[str, Any]]:
        """Status of the given running, unpaused members (default: all of them), by member id."""
        ids = [i for i in (node_ids if node_ids is not None else self.nodes)
               if self.nodes[i].running and not self.nodes[i].paused]
        if not ids:
            return {}
        with Client([self.nodes[i].address for i in ids], timeout=timeout, tls=self.client_tls) as client:
            return dict(zip(ids, client.status()))

    def wait_for_leader(self, among: Iterable[str] | None = None, not_in_term: int | None = None,
                        timeout: float = 30.0) -> str:
        """The id of a leader that the members in `among` (default: all running ones) agree on,
        in a term above `not_in_term` when given."""
        # A member outside `among` may end meanwhile (one removed from the cluster exits).
        watched = list(among) if among is not None else list(self.nodes)

        def agreed_leader() -> str | None:
            for node_id in watched:
                self.nodes[node_id].check_alive()
            statuses = self.statuses(watched)
            if not statuses or any("error" in s for s in statuses.values()):
                return None
            leaders = {s["leader"] for s in statuses.values()}
            leader = leaders.pop() if len(leaders) == 1 else None
            if leader is None or leader not in statuses or statuses[leader]["role"] != "leader":
                return None
            if not_in_term is not None and statuses[leader]["term"] <= not_in_term:
                return None
            return leader

        return wait_until("an agreed leader", agreed_leader, timeout)

    def wait_applied(self, node_id: str, index: int, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until `node_id` has applied `index`; returns its status."""
        def applied() -> dict[str, Any] | None:
            status = self.status(node_id)
            return status if status.get("applied_index", -1) >= index else None
        return wait_until(f"{node_id} to apply index {index}", applied, timeout)


def hashes_agree(addresses: list[str]) -> None:
    """Every member's HashKV at the first member's revision, once each has applied it, is one."""
    channels = [grpc.insecure_channel(address) for address in addresses]
    try:
        stubs = [etcd_rpc_pb2_grpc.MaintenanceStub(channel) for channel in channels]
        revision = stubs[0].Status(etcd_rpc_pb2.StatusRequest(), timeout=10).header.revision

        def hash_of(stub: etcd_rpc_pb2_grpc.MaintenanceStub) -> tuple[int] | None:
            try:
                return (stub.HashKV(etcd_rpc_pb2.HashKVRequest(revision=revision), timeout=5).hash,)
            except grpc.RpcError:  # a member that has not applied `revision` yet
                return None
        hashes = [wait_until("the member's hash", lambda stub=stub: hash_of(stub))[0] for stub in stubs]
        assert len(set(hashes)) == 1, hashes
    finally:
        for channel in channels:
            channel.close()


def module_cluster(base: Path, **options: Any) -> Iterator[Cluster]:
    """Three members with a leader (Cluster's `options`), shared by a module's tests (each uses
    keys of its own): for a fixture to `yield from`; the members' logs are printed when a test fails."""
    cluster = Cluster(base, **options).start()
    try:
        cluster.wait_for_leader()
        yield cluster
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.close()
