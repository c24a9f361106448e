"""One simulated node: the real driver (raft.node.node.RaftNode) over a simulated disk
(tests/sim/disk.py), the simulated network (SimTransport) and worker threads that run on the
virtual clock (SimOffload). Each start is a new incarnation of RaftNode over the same disk, as a
restarted process is; a crash halts the incarnation where it stands."""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from raft.core import CoreConfig, Message, RaftCore, Role, SnapshotMeta
from raft.node.config import Limits, NodeConfig, StorageConfig, Tuning
from raft.node.joining import disk_state
from raft.node.node import RaftNode
from raft.node.ports import Chunks, Inbound, SnapshotInfo
from raft.node.recovery import reconcile_state_and_log
from raft.node.workers import Workers

from tests.sim.checkers import SimViolation
from tests.sim.disk import SimDisk, SnapshotFile, State, StateFullError, apply_cost_ms

if TYPE_CHECKING:
    from tests.sim.checkers import SafetyChecker
    from tests.sim.cluster import Cluster
    from tests.sim.virtual_loop import VirtualClockLoop

# How long (ms, drawn per call) the worker threads take for a call: log compaction and resets,
# applies and installs, taking a snapshot, a snapshot stream's chunk.
WORK_MS = {"log": 2, "apply": 2, "snapshot": 20, "snapshot_io": 1}


@dataclass
class SnapshotPolicy:
    every: int | None = None  # take a snapshot every `every` applied entries; None: never
    keep: int = 3  # entries kept in the log below the snapshot index


@dataclass
class ServedRead:
    node: str
    ctx: object
    index: int
    applied: int
    at: int


def node_config(node_id: str, members: Sequence[str], core: CoreConfig, policy: SnapshotPolicy,
                tick_ms: int, join: bool = False) -> NodeConfig:
    """The sim's NodeConfig: the core's timing, snapshots by the policy, no read spin (a loop that
    polls would never let virtual time move), small snapshot chunks so a stream has several.
    `join`: the node joins a running cluster (NodeConfig.join): it knows no configuration until a
    leader sends one; `members` then only names the peers it asks when it starts empty."""
    every = policy.every or 1 << 40
    return NodeConfig(node_id=node_id, listen=f"sim:{node_id}", peers={m: f"sim:{m}" for m in members}, join=join,
                      data_dir=Path("/sim") / node_id, core=core,
                      storage=StorageConfig(snapshot_threshold=every, snapshot_threshold_bytes=1 << 62,
                                            snapshot_trailing_entries=policy.keep),
                      limits=Limits(max_pending_requests=1 << 20),
                      tuning=Tuning(tick_interval_ms=tick_ms, read_spin_us=0, snapshot_chunk_bytes=512,
                                    snapshot_bandwidth_bytes_per_s=1 << 20))


class SimOffload:
    """A worker thread on the virtual clock: each call runs a random few ms after the previous
    one ended, in order. A crash halts it: what was handed over never runs."""

    def __init__(self, loop: VirtualClockLoop, rng: random.Random, max_ms: int,
                 cost_ms: Callable[..., int] | None = None) -> None:
        self._loop, self._rng, self._max_ms, self._cost_ms = loop, rng, max_ms, cost_ms
        self._busy_until = 0.0
        self._pending: set[asyncio.TimerHandle] = set()

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        at = max(loop.time(), self._busy_until) + self._rng.randint(0, self._max_ms) / 1000
        if self._cost_ms is not None:
            at += self._cost_ms(*args) / 1000
        self._busy_until = at

        def call() -> None:
            self._pending.discard(handle)
            if future.done():
                return
            try:
                result = fn(*args)
            except Exception as e:  # noqa: BLE001 - handed to the caller, as a worker thread does
                result, error = None, e
            else:
                error = None
            if future.done():  # the call crashed its node, which cancelled the wait for it
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        handle = loop.call_at(at, call)
        self._pending.add(handle)
        return future

    def halt(self) -> None:
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()

    async def close(self) -> None:
        return None


class SimTransport:
    """The PeerTransport port on the simulated network. One per incarnation: a crashed one sends
    nothing more."""

    def __init__(self, node: SimNode) -> None:
        self._node = node
        self.closed = False
        self.inbound: Inbound | None = None
        self.removed: frozenset[str] = frozenset()
        self.addresses: dict[str, str] = {}  # member -> where this node dials it (reconfigure)

    async def start(self, inbound: Inbound) -> None:
        self.inbound = inbound

    def reaches(self, peer: str) -> bool:
        """Whether what this node sends `peer` arrives: the address it dials `peer` at is where
        `peer` listens (its peer_listen_address), or it knows no address for it yet."""
        address, dst = self.addresses.get(peer), self._node.cluster.nodes.get(peer)
        return not address or dst is None or address == dst.config.peer_listen_address

    def send(self, messages: Sequence[Message]) -> None:
        if not self.closed:
            for m in messages:
                if self.reaches(m.dst):
                    self._node.cluster.send(m)

    async def send_snapshot(self, peer: str, term: int, meta: SnapshotMeta, info: SnapshotInfo,
                            chunks: Chunks, timeout_s: float) -> tuple[bool, str]:
        """A stream takes a network delay each way; it fails when the link is cut at its start or
        end, or the receiver crashes meanwhile (its side of the connection resets)."""
        cluster, src = self._node.cluster, self._node.id
        await asyncio.sleep(cluster.net.delay_ms(src, peer) / 1000)
        dst = cluster.nodes.get(peer)
        if self.closed or cluster.net.cut(src, peer) or dst is None or dst.raft is None or not self.reaches(peer):
            return False, "connection refused"
        receiving = asyncio.ensure_future(dst.raft.receive_snapshot(src, term, meta, info.file_size, info.sha256,
                                                                    chunks))
        dst.streams_in.add(receiving)
        try:
            await asyncio.wait({receiving})
        finally:
            dst.streams_in.discard(receiving)
            receiving.cancel()
        if receiving.cancelled():
            return False, "connection reset"
        await asyncio.sleep(cluster.net.delay_ms(peer, src) / 1000)
        if cluster.net.cut(src, peer):
            return False, "connection reset"
        return receiving.result()

    def reconfigure(self, addresses: Mapping[str, str], removed: Collection[str]) -> None:
        """A node is reached where it listens (`reaches`); the removed are refused (the cluster
        drops what they send here, and tells them, as the peer listener refuses a removed member's
        hello with PeerHelloReply.removed: Cluster._deliver)."""
        self.addresses = dict(addresses)
        self.removed = frozenset(removed)

    def client_address(self, member: str) -> str | None:
        return f"client:{member}"

    def client_http_address(self, member: str) -> str | None:
        return None

    async def probe(self) -> dict[str, tuple[int, int, int]]:
        """The peers' answers (their term and the end of their log, from their disks), from those
        up and reachable both ways, after a round trip."""
        cluster, me = self._node.cluster, self._node.id
        await asyncio.sleep(2 * cluster.net.delay_ms(me, me) / 1000)
        return {peer: disk_state(node.disk.log) for peer, node in cluster.nodes.items()
                if peer != me and node.up and not cluster.net.cut(me, peer) and not cluster.net.cut(peer, me)}

    async def close(self) -> None:
        self.closed = True


class SimNode:
    def __init__(self, cluster: Cluster, node_id: str, config: NodeConfig, seed: int) -> None:
        self.cluster = cluster
        self.id = node_id
        self.config = config
        self.seed = seed
        self.members = tuple(config.members)
        self.disk = SimDisk(self, self.members)
        self.incarnation = 0
        self.raft: RaftNode | None = None
        self._transport: SimTransport | None = None
        self._workers: list[SimOffload] = []
        self.streams_in: set[asyncio.Future[Any]] = set()  # snapshot streams this node receives
        # Local clock = cluster time - clock_offset; a paused node's clock stops.
        self.clock_offset = 0
        self.paused_at: int | None = None
        self.held: list[Message] | None = None  # what arrived while its loop is held (Cluster.stall)

    # ---- what checkers and tests look at -----------------------------------------------------

    @property
    def checker(self) -> SafetyChecker:
        return self.cluster.checker

    @property
    def up(self) -> bool:
        return self.raft is not None

    def refuses(self, member: str) -> bool:
        """Whether this incarnation's transport refuses `member` as removed from the cluster."""
        return self._transport is not None and member in self._transport.removed

    @property
    def core(self) -> RaftCore | None:
        return self.raft.core if self.raft is not None else None

    @property
    def log(self) -> Any:
        return self.disk.log

    @property
    def applied(self) -> int:
        return self.disk.fsm.applied_index

    @property
    def state(self) -> State:
        return self.disk.fsm.state

    @property
    def snapshot(self) -> SnapshotFile | None:
        return self.disk.snapshots.newest_file

    def role(self) -> Role | None:
        return self.core.role if self.core is not None else None

    def local_time(self, now: int) -> int:
        return (self.paused_at if self.paused_at is not None else now) - self.clock_offset

    def violation(self, violation: SimViolation) -> None:
        self.cluster.violations.append(violation)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """A new incarnation on the same disk: recovery at start, then the driver."""
        loop = self.cluster.loop
        self.incarnation += 1
        reconcile_state_and_log(self.disk.log, self.disk.fsm, self.disk.snapshots)
        name = f"{self.seed}/{self.id}/{self.incarnation}"
        self._workers = [SimOffload(loop, random.Random(f"{name}/{job}"), ms, apply_cost_ms if job == "apply" else None)
                         for job, ms in WORK_MS.items()]
        self._transport = SimTransport(self)
        disk = self.disk
        self.raft = RaftNode(self.config, disk.log, disk.fsm, self._transport, cluster_id="sim",
                             snapshots=disk.snapshots, workers=Workers(*self._workers),
                             clock=lambda: self.local_time(loop.now_ms), rng=random.Random(name),
                             fsm_full_errors=(StateFullError,), rejoin_record=disk, disk_space=disk)
        self.cluster.inside_loop(lambda: _start_now(self.raft))

    def crash_now(self, power_loss: bool = False) -> None:
        """Halt this incarnation where it stands: its tasks, worker threads and connections end;
        the disk keeps what was written (on a power loss the state machine only what was synced)."""
        if self.raft is None:
            return
        for task in self.raft.halt("crashed"):
            task.add_done_callback(_retrieve)
        for worker in self._workers:
            worker.halt()
        for stream in list(self.streams_in):
            stream.cancel()
        assert self._transport is not None
        self._transport.closed = True
        self.raft = None
        if power_loss:
            self.disk.fsm.lose_unsynced()

    def lose_disk(self) -> None:
        """(Down) The disk is lost: the node gets an empty one, and at its next start asks its
        peers what its cluster holds (raft/node/joining.py), as a real node does."""
        assert self.raft is None, "lose the disk of a node that is down"
        self.disk = SimDisk(self, self.members, batch_ends_every=self.disk.batch_ends_every)
        self.disk.replaced = True

    def pause(self, now: int) -> None:
        if self.paused_at is None:
            self.paused_at = now

    def resume(self, now: int) -> None:
        if self.paused_at is not None:
            self.clock_offset += now - self.paused_at
            self.paused_at = None


def _start_now(raft: RaftNode | None) -> None:
    """RaftNode.start, which suspends nowhere on the simulated transport, run to its end now."""
    assert raft is not None
    starting = raft.start()
    try:
        starting.send(None)
    except StopIteration:
        return
    starting.close()
    raise RuntimeError("RaftNode.start suspended on the simulated transport")


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A crashed incarnation's task ends as it ends (cancelled, or with the crash): nobody waits."""
    if not task.cancelled():
        task.exception()
