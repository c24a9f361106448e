"""A cluster of sim nodes on a virtual clock: the event loop, clients, crashes and restarts.

One `step()` advances the clock to the next event (a message due or a node's tick), handles every
event at that instant, drains the Readies they caused and runs the per-step safety checks."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from raft.core import (
    CoreConfig,
    DroppedProposals,
    FailedRead,
    MemoryLogStore,
    Message,
    NotLeaderError,
    Role,
)
from tests.sim.checkers import SafetyChecker, SimViolation
from tests.sim.network import NetConfig, SimNetwork
from tests.sim.node import CrashNow, ServedRead, SimNode, SnapshotPolicy

# Small timings keep schedules cheap in virtual time: T = 200 ms, heartbeat 40 ms, ticks every 10 ms.
SIM_CONFIG = CoreConfig(election_timeout_ms=200, heartbeat_interval_ms=40, push_timeout_ms=200,
                        out_of_order_hold_ms=40, snapshot_timeout_ms=1000, lease_ms=150,
                        max_batch_entries=16, max_inflight_batches=4)
TICK_MS = 10
MAX_MESSAGES_PER_MS = 2000


@dataclass
class Proposal:
    payload: bytes
    node: str
    incarnation: int
    index: int
    term: int
    at: int
    # pending -> committed | overwritten (another entry committed at its index) | dropped
    # (DroppedProposals) | lost (its leader crashed before answering: the client saw a timeout).
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
        self.now = 0
        self.steps = 0
        self.net = SimNetwork(random.Random(f"{seed}/net"), net, record)
        self.checker = SafetyChecker()
        self.clients = ClientLog()
        self.nodes: dict[str, SimNode] = {}
        self._next_tick: dict[str, int] = {}
        self._pending: list[Proposal] = []
        self.after_step_hooks: list[Callable[["Cluster"], None]] = []
        logs = logs or {}
        for k, nid in enumerate(members):
            log = logs.get(nid) or MemoryLogStore()
            self.checker.register_log(nid, log)
            self.nodes[nid] = SimNode(nid, members, config, log, seed, policy or SnapshotPolicy())
            self._next_tick[nid] = 1 + k * 3  # staggered so nodes do not tick in lock step
        for nid in members:
            if nid in paused:
                self.nodes[nid].pause(0)
            self.restart(nid)

    # --- queries ---

    @property
    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    def leaders(self) -> list[SimNode]:
        """Nodes that believe they lead (a stale one may too)."""
        return [n for n in self.up_nodes if n.role() == Role.LEADER]

    def leader(self) -> SimNode | None:
        """The leader of the highest term, if any node leads it."""
        ls = self.leaders()
        if not ls:
            return None
        top = max(n.core.term for n in ls)  # type: ignore[union-attr]
        if max(n.core.term for n in self.up_nodes) > top:  # type: ignore[union-attr]
            return None
        return next(n for n in ls if n.core.term == top)  # type: ignore[union-attr]

    # --- the event loop ---

    def _next_event(self) -> int:
        times = list(self._next_tick.values())
        nt = self.net.next_time()
        if nt is not None:
            times.append(nt)
        return min(times)

    def step(self) -> None:
        self.now = max(self.now, self._next_event())
        now = self.now
        due = self.net.pop_due(now)
        if len(due) > MAX_MESSAGES_PER_MS:
            # Traffic that multiplies faster than time passes would hang the run: fail the schedule.
            raise SimViolation("runaway", f"message storm: {len(due)} messages due at {now} ms, e.g. {due[-1]}")
        for msg in due:
            self._deliver(msg)
        for nid, node in self.nodes.items():
            if self._next_tick[nid] > now:
                continue
            self._next_tick[nid] += TICK_MS
            if node.core is not None and node.paused_at is None:
                node.core.tick(node.local_time(now))
                self._drain(node)
        self.steps += 1
        self.checker.after_step(self.nodes.values())
        self._resolve_proposals()
        for hook in self.after_step_hooks:
            hook(self)

    def _deliver(self, msg: Message) -> None:
        node = self.nodes.get(msg.dst)
        if node is None or node.core is None:
            return
        self.net.note_delivered(self.now, msg)
        node.core.clock(node.local_time(self.now))  # as the node's driver passes its time with inputs
        node.core.step(msg)
        self._drain(node)

    def _drain(self, node: SimNode) -> None:
        try:
            node.drain(self.now, self, self.checker)
        except CrashNow:
            self.crash(node.id)

    def run_until(self, pred: Callable[[], bool], timeout_ms: int) -> bool:
        deadline = self.now + timeout_ms
        while not pred():
            if self.now >= deadline:
                return False
            self.step()
        return True

    def run_for(self, ms: int) -> None:
        end = self.now + ms
        while self._next_event() <= end:
            self.step()
        self.now = end

    # --- DriverHooks ---

    def send(self, msg: Message) -> None:
        self.net.send(self.now, msg)

    def read_served(self, r: ServedRead) -> None:
        self.checker.on_read_served(r)
        self.clients.served_reads.append(r)

    def read_failed(self, node: SimNode, fr: FailedRead) -> None:
        self.clients.failed_reads.append((node.id, fr))

    def proposals_dropped(self, node: SimNode, dp: DroppedProposals) -> None:
        for p in self._pending:
            if (p.node == node.id and p.incarnation == node.incarnation and p.term == dp.term
                    and dp.first <= p.index <= dp.last):
                p.status = "dropped"

    # --- clients ---

    def propose(self, node_id: str, payloads: Sequence[bytes]) -> list[Proposal]:
        """Propose on `node_id`; [] if it is down or not the leader."""
        node = self.nodes[node_id]
        if node.core is None:
            return []
        node.core.clock(node.local_time(self.now))
        try:
            first, term = node.core.propose(list(payloads))
        except NotLeaderError:
            self.clients.not_leader += 1
            return []
        ps = [Proposal(p, node_id, node.incarnation, first + k, term, self.now) for k, p in enumerate(payloads)]
        self.clients.proposals.extend(ps)
        self._pending.extend(ps)
        self._drain(node)
        return ps

    def read(self, node_id: str, ctx: object) -> bool:
        """Ask `node_id` for a linearizable read; False if it refused at once (not leader)."""
        node = self.nodes[node_id]
        if node.core is None:
            return False
        self.checker.on_read_registered(ctx, self.nodes.values())
        node.core.clock(node.local_time(self.now))
        try:
            node.core.read_index(ctx)
        except NotLeaderError:
            return False
        self._drain(node)
        return True

    def _resolve_proposals(self) -> None:
        committed = self.checker.committed
        still: list[Proposal] = []
        for p in self._pending:
            c = committed.get(p.index)
            if c is not None:
                p.status = "committed" if (c.term, c.payload) == (p.term, p.payload) else "overwritten"
            else:
                still.append(p)  # pending, or dropped / lost but it may still commit: keep watching
        self._pending = still

    def pending(self) -> list[Proposal]:
        return [p for p in self._pending if p.status == "pending"]

    # --- faults ---

    def crash(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.core is None:
            return
        node.crash()
        for p in self._pending:
            if p.node == node_id and p.status == "pending":
                p.status = "lost"
        self.checker.check_durability(list(self.nodes.values()))

    def restart(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.core is not None:
            return
        node.start(self.now)
        self.checker.on_start(node)
        self._drain(node)

    def pause(self, node_id: str) -> None:
        """Stop ticking this node (its clock stops); it still receives messages."""
        self.nodes[node_id].pause(self.now)

    def resume(self, node_id: str) -> None:
        self.nodes[node_id].resume(self.now)

    def inject(self, msg: Message) -> None:
        """Deliver a message now, bypassing the network (a scenario's delayed duplicate or stale RPC)."""
        self._deliver(msg)

    # --- end-of-run checks ---

    def check_all(self) -> None:
        nodes = list(self.nodes.values())
        self.checker.check_durability(nodes)
        self.checker.check_logs_match(nodes)
