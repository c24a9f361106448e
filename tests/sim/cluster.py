"""A cluster of sim nodes, each the real driver, on one virtual-clock event loop: the network,
clients, crashes, restarts and storage faults.

The loop runs every event due at an instant, then (VirtualClockLoop.on_idle) the per-step safety
checks, then moves the clock to the next timer: a message due, a node's tick, a worker thread's
call. `run_until` and `run_for` run the loop; between them a test (or a schedule) acts: proposes,
reads, partitions, crashes."""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence, TypeVar

from raft.core import CoreConfig, FailedRead, MemoryLogStore, Message, NotLeaderError, Role, VoteRequest
from raft.core.membership import ChangeKind, Membership
from raft.node.errors import NodeError

from tests.sim.checkers import SafetyChecker, SimViolation
from tests.sim.disk import POISON, RefusedAtApply
from tests.sim.network import NetConfig, SimNetwork
from tests.sim.node import ServedRead, SimNode, SnapshotPolicy, node_config
from tests.sim.virtual_loop import VirtualClockLoop

T = TypeVar("T")

# Small timings keep schedules cheap in virtual time: T = 200 ms, heartbeat 40 ms, ticks every 10 ms.
SIM_CONFIG = CoreConfig(election_timeout_ms=200, heartbeat_interval_ms=40, push_timeout_ms=200,
                        out_of_order_hold_ms=40, snapshot_timeout_ms=1000, lease_ms=150,
                        max_batch_entries=16, max_inflight_batches=4)
TICK_MS = 10
MAX_MESSAGES_PER_MS = 2000

# The driver logs elections, snapshots and refusals: thousands of schedules would drown in them
# (a driver that stops on an error is a violation the cluster raises).
logging.getLogger("raft").setLevel(logging.CRITICAL)


@dataclass
class Proposal:
    payload: bytes
    node: str
    incarnation: int
    index: int  # 0 while unknown (held by a leader handing its leadership over)
    term: int
    at: int
    # pending -> committed (its future resolved with its own entry) | refused at apply (a poison
    # entry, committed and applied as a refusal) | dropped (NotLeaderError:
    # another leader's entry took the index, or the core dropped it) | refused (the node's
    # refusal: disk full, stopping) | lost (its node crashed before answering: a client timeout).
    status: str = "pending"


@dataclass
class ClientLog:
    proposals: list[Proposal] = field(default_factory=list)
    not_leader: int = 0
    served_reads: list[ServedRead] = field(default_factory=list)
    failed_reads: list[tuple[str, FailedRead]] = field(default_factory=list)


def node_ids(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


class Cluster:
    def __init__(self, ids: Sequence[str] | int, seed: int = 0, config: CoreConfig = SIM_CONFIG,
                 net: NetConfig | None = None, policy: SnapshotPolicy | None = None,
                 logs: dict[str, MemoryLogStore] | None = None, record: bool = False,
                 paused: Sequence[str] = ()) -> None:
        members = tuple(node_ids(ids) if isinstance(ids, int) else ids)
        self.seed = seed
        self.config = config
        self.policy = policy or SnapshotPolicy()
        self.steps = 0
        self.loop = VirtualClockLoop()
        self.loop.on_idle = self._after_step
        self.loop.set_exception_handler(self._loop_error)
        self.net = SimNetwork(random.Random(f"{seed}/net"), self._deliver_at, net, record)
        self.checker = SafetyChecker()
        self.clients = ClientLog()
        self.violations: list[BaseException] = []
        self.after_step_hooks: list[Callable[[Cluster], None]] = []
        self._goal: tuple[Callable[[], bool], int, asyncio.Future[bool]] | None = None
        self._delivered_this_ms = (0, 0)  # (ms, messages delivered in it)
        self.nodes: dict[str, SimNode] = {}
        # Nodes that stopped as removed (RaftNode.stop_serving: they applied the configuration
        # that removed them, or a peer that knows it committed refused them): down for good, as
        # a removed server's process exits.
        self.removed: set[str] = set()
        self.checker.initial_voters = frozenset(members)
        for nid in members:
            node = SimNode(self, nid, node_config(nid, members, config, policy or SnapshotPolicy(), TICK_MS), seed)
            if logs and nid in logs:
                node.disk.log.adopt(logs[nid])
            self.checker.register_log(nid, node.disk.log)
            self.nodes[nid] = node
        self.checker.nodes = list(self.nodes.values())
        self._keep_time_moving()
        for nid in members:
            if nid in paused:
                self.nodes[nid].pause(0)
            self.restart(nid)

    @property
    def now(self) -> int:
        return self.loop.now_ms

    # --- queries ---

    @property
    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    def leaders(self) -> list[SimNode]:
        """Nodes that believe they lead (a stale one may too)."""
        return [n for n in self.up_nodes if n.role() == Role.LEADER]

    def leader(self) -> SimNode | None:
        """The leader of the highest term, if any node leads it and no member of its configuration
        is in a higher term (a node it no longer counts, removed but not yet told, may be: it
        stood in vain, and nobody follows it)."""
        ls = self.leaders()
        if not ls:
            return None
        top = max(n.core.term for n in ls)  # type: ignore[union-attr]
        lead = next(n for n in ls if n.core.term == top)  # type: ignore[union-attr]
        members = lead.core.membership  # type: ignore[union-attr]
        if any(n.core.term > top for n in self.up_nodes if n.id in members):  # type: ignore[union-attr]
            return None
        return lead

    def members(self) -> Membership | None:
        """The configuration of the current leader (None without one)."""
        lead = self.leader()
        return lead.core.membership if lead is not None and lead.core is not None else None

    # --- running ---

    def run_until(self, pred: Callable[[], bool], timeout_ms: int) -> bool:
        if pred():
            return True
        goal: asyncio.Future[bool] = self.loop.create_future()
        self._goal = (pred, self.now + timeout_ms, goal)
        self.loop.call_at((self.now + timeout_ms) / 1000, lambda: None)  # an instant to give up at
        try:
            return self.loop.run_until_complete(goal)
        finally:
            self._goal = None

    def run_for(self, ms: int) -> None:
        self.loop.run_for(ms)

    def _keep_time_moving(self) -> None:
        """A timer every tick, so the clock moves on even when every node is down."""
        self.loop.call_later(TICK_MS / 1000, self._keep_time_moving)

    def _after_step(self, loop: VirtualClockLoop) -> None:
        """Everything due at this instant is handled: check, then see whether a run is over."""
        self.steps += 1
        if self.violations:
            raise self.violations[0]
        for node in self.nodes.values():
            if node.raft is not None and node.raft.stopped not in (None, "not started"):
                if node.raft.removed.is_set():
                    self._removed(node)
                    continue
                raise SimViolation("driver", f"{node.id} stopped on its own: {node.raft.stopped}")
        self.checker.after_step(self.nodes.values())
        for hook in self.after_step_hooks:
            hook(self)
        if self._goal is not None:
            pred, deadline, goal = self._goal
            if pred() or self.now >= deadline:
                goal.set_result(pred())
                loop.stop()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        self.violations.append(SimViolation("driver", f"{context.get('message')}: {error!r}"))

    def inside_loop(self, call: Callable[[], T]) -> T:
        """Run `call` as a callback of the loop (the driver's futures belong to it), now."""
        if self.loop.is_running():
            return call()
        done: asyncio.Future[T] = self.loop.create_future()

        def run() -> None:
            try:
                done.set_result(call())
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                done.set_exception(e)

        self.loop.call_soon(run)
        return self.loop.run_until_complete(done)

    # --- the network ---

    def send(self, msg: Message) -> None:
        self.net.send(self.now, msg)

    def _deliver_at(self, at: int, msg: Message) -> None:
        self.loop.call_at(at / 1000, self._deliver, msg)

    def _deliver(self, msg: Message) -> None:
        if (msg.src, msg.dst) in self.net.blocked:
            return
        node = self.nodes.get(msg.dst)
        if node is None or node.raft is None:
            return
        if node.held is not None:
            node.held.append(msg)
            return
        if isinstance(msg, VoteRequest) and node.refuses(msg.src):
            # A real peer listener refuses a removed member's hello (PeerHelloReply.removed), and
            # the member stops. The simulated links never break, so the refusal comes when a
            # removed member that hears from no leader any more stands (asks for votes); its other
            # messages (a leader's hand-over TimeoutNow, answers) go as on a link already open.
            sender = self.nodes.get(msg.src)
            if sender is not None and sender.raft is not None:
                sender.raft.removed_from_cluster(f"{msg.dst} refuses it as a removed member")
            return
        ms, count = self._delivered_this_ms
        count = count + 1 if ms == self.now else 1
        self._delivered_this_ms = (self.now, count)
        if count > MAX_MESSAGES_PER_MS:
            # Traffic that multiplies faster than time passes would hang the run: fail the schedule.
            self.violations.append(SimViolation("runaway", f"message storm: {count} messages at {self.now} ms"))
            return
        self.net.note_delivered(self.now, msg)
        node.raft.step([msg])

    def inject(self, msg: Message) -> None:
        """Deliver a message now, bypassing the network (a scenario's delayed duplicate or stale RPC)."""
        self.inside_loop(lambda: self._deliver(msg))

    # --- clients ---

    def propose(self, node_id: str, payloads: Sequence[bytes]) -> list[Proposal]:
        """Propose on `node_id` through its driver; [] if it is down or refuses (not the leader)."""
        return self.inside_loop(lambda: self._propose(node_id, payloads))

    def _propose(self, node_id: str, payloads: Sequence[bytes]) -> list[Proposal]:
        node = self.nodes[node_id]
        raft = node.raft
        if raft is None:
            return []
        made: list[Proposal] = []
        for payload in payloads:
            before = raft.core.log.last_index()
            try:
                future = raft.propose(payload)
            except NotLeaderError:
                self.clients.not_leader += 1
                break
            except NodeError:
                break
            # A proposal a leader takes while it hands its leadership over is held, and proposed
            # at an index not known yet (0 here), here or nowhere, once the transfer ends.
            index = raft.core.log.last_index()
            p = Proposal(payload, node_id, node.incarnation, index if index > before else 0, raft.core.term, self.now)
            future.add_done_callback(lambda f, p=p: self._answered(p, f))
            made.append(p)
        self.clients.proposals.extend(made)
        return made

    def _answered(self, p: Proposal, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if p.status != "pending":
            return
        if error is None and isinstance(future.result(), RefusedAtApply):
            refused = future.result()
            if refused.payload != p.payload or not p.payload.startswith(POISON):
                self.violations.append(SimViolation("proposal", f"{p} refused at apply as entry {refused}"))
            p.index = refused.index
            p.status = "refused at apply"
        elif error is None:
            index, payload = future.result()
            if payload.startswith(POISON):
                self.violations.append(SimViolation("proposal", f"{p}: a poison entry was applied"))
            if (index, payload) != (p.index or index, p.payload):
                self.violations.append(SimViolation("proposal", f"{p} answered with entry {index} {payload!r}"))
            p.index = index
            p.status = "committed"
        else:
            p.status = "dropped" if isinstance(error, NotLeaderError) else "refused"

    def read(self, node_id: str, ctx: object) -> bool:
        """Ask `node_id` for a linearizable read; False if it refused at once (not leader)."""
        return self.inside_loop(lambda: self._read(node_id, ctx))

    def _read(self, node_id: str, ctx: object) -> bool:
        node = self.nodes[node_id]
        raft = node.raft
        if raft is None:
            return False
        self.checker.on_read_registered(ctx, self.nodes.values())
        try:
            future = raft.read_barrier("linearizable")
        except (NotLeaderError, NodeError):
            return False
        incarnation = node.incarnation
        future.add_done_callback(lambda f: self._read_done(node, incarnation, ctx, f))
        return True

    def _read_done(self, node: SimNode, incarnation: int, ctx: object, future: asyncio.Future[int]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if node.incarnation != incarnation or node.raft is None:
            return
        if error is not None:
            self.clients.failed_reads.append((node.id, FailedRead(ctx, getattr(error, "leader", None))))
            return
        served = ServedRead(node.id, ctx, future.result(), node.raft.applied_index, self.now)
        try:
            self.checker.on_read_served(served)
        except SimViolation as violation:
            self.violations.append(violation)
        self.clients.served_reads.append(served)

    def pending(self) -> list[Proposal]:
        return [p for p in self.clients.proposals if p.status == "pending"]

    # --- faults ---

    def crash(self, node_id: str, power_loss: bool = False) -> None:
        node = self.nodes[node_id]
        if node.raft is None:
            return
        node.crash_now(power_loss)
        self.crashed(node)

    def crashed(self, node: SimNode) -> None:
        """Bookkeeping after `node` crashed (by a fault here, or inside a write it crashed in)."""
        for p in self.clients.proposals:
            if p.node == node.id and p.incarnation == node.incarnation and p.status == "pending":
                p.status = "lost"
        try:
            self.checker.check_durability(list(self.nodes.values()))
        except SimViolation as violation:  # also when the crash came from inside the driver
            self.violations.append(violation)

    def lose_disk(self, node_id: str) -> None:
        """The node's disk is lost: it crashes (if up) and gets an empty one; restarted, it asks
        its peers whether to found or rejoin the cluster (raft/node/joining.py)."""
        node = self.nodes[node_id]
        self.crash(node_id)
        node.lose_disk()
        self.checker.register_log(node_id, node.disk.log)

    def restart(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.raft is not None or node_id in self.removed:
            return
        node.start()
        self.checker.on_start(node)

    def _removed(self, node: SimNode) -> None:
        """`node` stopped serving because it was removed from the cluster: its process ends."""
        self.removed.add(node.id)
        node.crash_now()
        self.crashed(node)

    # --- membership ---

    def add_node(self, node_id: str, start: bool = True) -> SimNode:
        """A new server for the cluster to add: its own empty disk, NodeConfig.join (it knows no
        configuration until a leader sends it one), its peers the nodes the cluster has now (whom
        it asks, should it start empty, what the cluster holds: raft/node/joining.py)."""
        if node_id in self.nodes:
            raise ValueError(f"{node_id} already exists")
        peers = [*self.nodes, node_id]
        node = SimNode(self, node_id, node_config(node_id, peers, self.config, self.policy, TICK_MS, join=True),
                       self.seed)
        some = next(iter(self.nodes.values()), None)
        if some is not None:
            node.disk.batch_ends_every = some.disk.batch_ends_every
        self.nodes[node_id] = node
        self.checker.register_log(node_id, node.disk.log)
        self.checker.nodes.append(node)
        if start:
            self.restart(node_id)
        return node

    def change_membership(self, node_id: str, kind: ChangeKind, member: str,
                          address: str | None = None) -> asyncio.Future[Any]:
        """Propose one membership change on `node_id` (RaftNode.propose_membership), the member
        at `address` (default: its simulated address). Raises at once what the driver raises
        (NotLeaderError, MembershipChangeError, NodeError); the future resolves once the change
        is applied."""
        return self.inside_loop(lambda: self._change_membership(node_id, kind, member, address or f"sim:{member}"))

    def move(self, node_id: str, address: str) -> None:
        """Restart `node_id` taking peers at `address` (serve --listen-peer), as an operator does
        after an update moved it there: its peers reach it again."""
        node = self.nodes[node_id]
        self.crash(node_id)
        node.config = replace(node.config, listen_peer=address)
        self.restart(node_id)

    def _change_membership(self, node_id: str, kind: ChangeKind, member: str, address: str) -> asyncio.Future[Any]:
        raft = self.nodes[node_id].raft
        if raft is None:
            raise NodeError(f"{node_id} is down")
        future = raft.propose_membership(kind, member, address)
        future.add_done_callback(_retrieve)
        return future

    def transfer(self, node_id: str, target: str | None) -> asyncio.Future[Any]:
        """Ask `node_id` to hand leadership to `target` (RaftNode.transfer_leadership): a task,
        done with the new leader's id, or with the refusal (NotLeaderError, ValueError) or a
        TimeoutError when no other leader came in time."""
        return self.inside_loop(lambda: self._transfer(node_id, target))

    def _transfer(self, node_id: str, target: str | None) -> asyncio.Future[Any]:
        raft = self.nodes[node_id].raft
        if raft is None:
            raise NodeError(f"{node_id} is down")
        task = asyncio.ensure_future(raft.transfer_leadership(target))
        task.add_done_callback(_retrieve)
        return task

    def pause(self, node_id: str) -> None:
        """Stop this node's clock (it still receives messages; its timers do not fire)."""
        self.nodes[node_id].pause(self.now)

    def resume(self, node_id: str) -> None:
        self.nodes[node_id].resume(self.now)

    def stall(self, node_ids: Sequence[str], ms: int) -> None:
        """Hold these nodes' event loops for `ms` (a slow fsync or GC pass on the loop, a busy
        host): their clocks run on but nothing of theirs runs; what arrives meanwhile waits in the
        socket, and when the hold ends each node's timers run before it reads its socket, as an
        event loop's do after a callback that held it. (Modelled: the clock stops, then jumps by
        `ms`; what arrived is delivered just after the node's next tick.)"""
        for node_id in node_ids:
            node = self.nodes[node_id]
            node.pause(self.now)
            node.held = []
        self.loop.call_later(ms / 1000, lambda: [self._end_stall(self.nodes[n]) for n in node_ids])

    def _end_stall(self, node: SimNode) -> None:
        node.paused_at = None  # no offset added: its clock jumps by the hold

        def read_socket() -> None:
            held, node.held = node.held or [], None
            for msg in held:
                self._deliver(msg)
        self.loop.call_later((TICK_MS + 1) / 1000, read_socket)

    # --- end-of-run checks ---

    def check_all(self) -> None:
        nodes = list(self.nodes.values())
        self.checker.check_durability(nodes)
        self.checker.check_logs_match(nodes)

    def close(self) -> None:
        """End every node and the loop (their tasks end cancelled)."""
        for node in self.nodes.values():
            node.crash_now()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Nobody need wait on a membership change or a transfer: their failure is an outcome."""
    if not future.cancelled():
        future.exception()
