"""RaftNode: the asyncio driver around one RaftCore.

The core (raft/core) is a pure state machine; this is everything around it that touches the
world, through narrow interfaces (raft/node/ports.py): the log store, the state machine, the
snapshots, the peer transport, a clock and worker threads. Production passes the real ones
(kv/server/server.py); the simulator (tests/sim) passes in-memory ones and runs this same driver on
a virtual clock, under network and storage faults.

Two tasks run on the event loop: the tick task (the core learns the time) and the ready loop,
which hands each Ready to the ReadyHandler (ready_handler.py). Messages from peers, proposals and
reads step the core from whatever called them, and poke the ready loop; messages and proposals
arriving while a Ready is handled go into the next one, which is where group commit comes from
(one fsync for everything that arrived during the previous one). By concern:

    ready_handler.py    a Ready, in ready.py's order (persist, send, apply, advance)
    proposal_gate.py    what a write meets first: the space check, the pending limit, the hold
                        while leadership is handed over
    proposals.py        proposals waiting for their entry to be applied
    disk_space.py       a full disk or store: writes refused, a leader gives way
    reads.py            read barriers: ReadIndex rounds, read hold, read spin, lease and stale reads
    snapshot_driver.py  taking, compacting, streaming, receiving and installing snapshots
    recovery.py         bringing the state machine and the log into agreement at start
"""
from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Sequence

from raft.core.errors import TransferringError
from raft.core.membership import ChangeKind, Membership
from raft.core.messages import Message
from raft.core.raft import RaftCore
from raft.core.ready import SoftState
from raft.core.types import Role, SnapshotMeta
from raft.node.config import NodeConfig
from raft.node.errors import NodeStoppedError
from raft.core.log_store import LogStore
from raft.node.disk_space import DiskSpacePolicy
from raft.node.joining import Joining, starts_empty
from raft.node.ports import (Chunks, Clock, DiskSpace, PeerTransport, RejoinRecord, SnapshotHost, StateMachine,
                             monotonic_ms)
from raft.node.proposal_gate import ProposalGate
from raft.node.proposals import Proposals
from raft.node.reads import Reads
from raft.node.ready_handler import ReadyHandler
from raft.node.snapshot_driver import SnapshotDriver
from raft.node.stats import NodeStats
from raft.node.workers import Workers

log = logging.getLogger(__name__)

# A follower this far behind its commit index is "catching up"; it logs once when it has caught up.
CATCH_UP_LAG = 1000


def _role_name(role: Role) -> str:
    # status() speaks the contract's three roles; a pre-candidate is a candidate that has not yet
    # raised its term.
    return "candidate" if role is Role.PRE_CANDIDATE else role.value


class RaftNode:
    """Create, `await start()` on the loop that will run it, `await stop()` when done. The caller
    owns (opens and closes) the log store and the state machine; the node closes the transport
    and its worker threads."""

    def __init__(self, config: NodeConfig, log_store: LogStore, fsm: StateMachine, transport: PeerTransport, *,
                 cluster_id: str, snapshots: SnapshotHost | None = None, workers: Workers | None = None,
                 clock: Clock = monotonic_ms, rng: random.Random | None = None,
                 fsm_full_errors: tuple[type[Exception], ...] = (), rejoin_record: RejoinRecord | None = None,
                 disk_space: DiskSpace | None = None) -> None:
        """`fsm_full_errors`: what the state machine raises when it is out of space (raft may not
        import statemachine, so the server names its StateFullError here). `cluster_id`: resolved
        by the caller from the data directory (raft/node/cluster_id.py). `rejoin_record`: where a
        node that starts empty, or lost its data, keeps its rejoin floor (raft/node/joining.py);
        without one the node never asks its peers what the cluster holds. `disk_space`: where new
        writes are checked against StorageConfig.reserve_free_bytes (none: never)."""
        self.config = config
        self.id = config.node_id
        self.cluster_id = cluster_id
        self.log = log_store
        self.fsm = fsm
        self.transport = transport
        self.workers = workers or Workers.threads(self.id)
        self.disk_space = DiskSpacePolicy(self, disk_space, fsm_full_errors)
        self._clock = clock
        self._rng = rng or random.Random()
        self.applied_index = fsm.applied_index
        # A node that joins an existing cluster (config.join) was added as a new member: it has
        # nothing of the cluster's to have lost, and asks nothing.
        self._joining = None if rejoin_record is None or config.join else Joining(
            self, rejoin_record, starts_empty(log_store, self.applied_index, snapshots is not None and
                                              snapshots.newest() is not None))
        self.core = self._new_core()
        self._membership: Membership | None = None  # the configuration the transport was last told
        self._removed_told: frozenset[str] = frozenset()  # the removed members it was last told
        self.stats = NodeStats()  # read by kv/server/metrics.py at scrape time
        # The node's clock (ms) when a message from the leader it knows last arrived.
        self.leader_heard_ms = -(1 << 62)
        self.proposals = Proposals()
        self.proposal_gate = ProposalGate(self, clock)
        self.reads = Reads(self)
        self.snapshots = SnapshotDriver(self, snapshots)
        self._ready = ReadyHandler(self)
        self._stopped: str | None = "not started"
        # Set when this node learns it was removed from the cluster: it has stopped serving for good,
        # and whatever runs it should end (kv/server/server.py ends the process).
        self.removed = asyncio.Event()
        self._catching_up = True
        self._soft: SoftState | None = None
        self._wake: asyncio.Event | None = None
        self._driving = False  # the ready loop is inside a Ready
        # Set (and replaced by a fresh one) on every new SoftState: a broadcast to waiters.
        self._soft_changed: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _new_core(self) -> RaftCore:
        """A core from what is durable (the log store, the state machine's applied index)."""
        recorded = self.fsm.membership
        return RaftCore(self.id, self._base_membership(recorded), self.log, self.config.core, self._rng, self._clock(),
                        applied_index=self.applied_index, membership_logged=bool(recorded),
                        rejoin_floor=self._joining.floor if self._joining is not None else None)

    def _base_membership(self, recorded: bytes) -> Membership | None:
        """The configuration at the state machine's applied index: the one it recorded, else the
        bootstrap one of --peers, else (joining an existing cluster) none yet."""
        if recorded:
            return Membership.decode(recorded)
        if self.config.join:
            return None
        return Membership.of_voters(self.config.peers or {self.id: ""})

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._stopped is None

    @property
    def stopped(self) -> str | None:
        """Why the node does not run ("not started", "node stopped", an error), or None."""
        return self._stopped

    async def start(self) -> None:
        """Start the loops and the transport (OSError when its port cannot be bound)."""
        self._wake = asyncio.Event()
        self._soft_changed = asyncio.Event()
        self.reads.start()
        await self.transport.start(self)
        self._stopped = None
        self._tasks = [asyncio.create_task(self._tick_loop(), name=f"raft-tick-{self.id}"),
                       asyncio.create_task(self._ready_loop(), name=f"raft-ready-{self.id}")]
        if self._joining is not None and self._joining.needed:
            self._tasks.append(asyncio.create_task(self._joining.run(), name=f"raft-join-{self.id}"))
        self._wake.set()

    async def stop(self) -> None:
        """Stop ticking and handling Readies, fail what waits, close the transport and wait for
        the worker threads, so the caller may close the stores right after."""
        background = self.halt("node stopped")
        await asyncio.gather(*background, return_exceptions=True)
        self._fail_all(lambda: NodeStoppedError("node is shutting down"))
        await self.transport.close()
        await self.workers.close()

    def halt(self, why: str) -> list[asyncio.Task[Any]]:
        """Stop at once, as a crash would: nothing more is stepped, handled or sent; the
        background tasks are cancelled (and returned, for a clean stop to wait on)."""
        if self._stopped is None:
            self._stopped = why
        background = [*self._tasks, *self.snapshots.tasks()]
        for task in background:
            task.cancel()
        self._tasks = []
        self.reads.stop()
        return background

    # ---- inputs ------------------------------------------------------------------------------

    def step(self, messages: Sequence[Message]) -> None:
        """Messages from peers (called by the transport on the loop)."""
        if self._stopped is not None or (self._joining is not None and self._joining.holding):
            return  # stopped, or not yet knowing whether it founds or rejoins its cluster
        now = self._clock()
        self.core.clock(now)
        for m in messages:
            try:
                self.core.step(m)
            except Exception:  # a message the core chokes on must not take the node down
                log.exception("core refused message %r", m)
        # A link carries one peer's messages, so the last one says who spoke (health.py's rule).
        if messages and messages[-1].src == self.core.leader:
            self.leader_heard_ms = now
        # A follower answers a heartbeat at once; a leader serves its reads at once only when no
        # other read waits: with many, the driver's turn lets the next round gather more reads.
        self.ready_soon(at_once=self.core.role is not Role.LEADER or not self.reads.many_waiting)

    def peer_unreachable(self, peer: str) -> None:
        """The transport's word that `peer`'s process is gone (connection refused or reset)."""
        if self._stopped is None:
            self.core.peer_unreachable(peer)
            self.poke()

    def removed_from_cluster(self, why: str) -> None:
        self._stop_as_removed(f"removed from the cluster: {why}")

    def _stop_as_removed(self, why: str) -> None:
        self.stop_serving(why)
        self.removed.set()

    async def receive_snapshot(self, leader: str, term: int, meta: SnapshotMeta, total_size: int,
                               sha256: str, chunks: Chunks) -> tuple[bool, str]:
        return await self.snapshots.receive(leader, term, meta, total_size, sha256, chunks)

    def propose(self, payload: bytes, *, within_reserve: bool = False) -> asyncio.Future[Any]:
        """Replicate one command; the future resolves to the state machine's result for it once
        applied. Raises (at once) NotLeaderError, QueueFullError, DiskFullError, NodeStoppedError;
        the future may fail with NotLeaderError or NodeStoppedError. `within_reserve`: a small
        command that may use the disk's reserve (an alarm saying the disk is short: the reserve
        is kept for what must still be written then)."""
        self._check_running()
        self.proposal_gate.admit(payload, within_reserve=within_reserve)
        self.core.clock(self._clock())
        try:
            index, term = self.core.propose([payload])
        except TransferringError:
            return self.proposal_gate.hold(payload)
        future = self.proposals.add(index, term)
        self.poke()
        return future

    def propose_membership(self, kind: ChangeKind, member: str, address: str = "") -> asyncio.Future[Any]:
        """Propose one membership change (raft/core/membership.py); the future resolves once its
        configuration is applied. Raises at once NotLeaderError or MembershipChangeError."""
        self._check_running()
        self.core.clock(self._clock())
        index, term = self.core.propose_membership(kind, member, address)
        future = self.proposals.add(index, term)
        self.poke()
        return future

    async def transfer_leadership(self, target: str | None = None) -> str:
        """Hand leadership to `target` (None: the voter furthest along) and wait until a leader
        other than this node is known; returns it. NotLeaderError when this node does not lead,
        ValueError for a target that cannot lead, TimeoutError when no other leader came within
        twice the election timeout (the transfer failed; this node may lead on)."""
        self._check_running()
        self.core.clock(self._clock())
        if target is None:
            target = self._transfer_target()
        self.core.transfer_leadership(target)
        self.poke()
        timeout = 2 * self.config.core.election_timeout_ms / 1000
        return await asyncio.wait_for(self.wait_for_leader(other_than=self.id), timeout)

    def _transfer_target(self) -> str:
        status = self.core.status()
        voters = [v for v in status.voters if v != self.id]
        if not voters:
            raise ValueError("no other voter to hand leadership to")
        return max(voters, key=lambda v: (status.peers.get(v, 0), v))

    @property
    def membership(self) -> Membership:
        """The latest configuration in this node's log (committed or not)."""
        return self.core.membership

    def read_barrier(self, consistency: str = "linearizable") -> asyncio.Future[int]:
        """A future that resolves once a read of the local state machine is as fresh as
        `consistency` promises, to the index it is safe to read at. Raises NotLeaderError (not
        for "stale"), at once or through the future."""
        self._check_running()
        if consistency != "stale":
            self.proposal_gate.check_queue()
            self.core.clock(self._clock())
        return self.reads.barrier(consistency)

    def wait_applied(self, index: int) -> asyncio.Future[int]:
        """A future that resolves once the state machine has applied `index`."""
        return self.reads.wait_applied(index)

    async def take_snapshot(self, at_least: int = 0) -> Any:
        """A snapshot (ports.SnapshotInfo) that includes at least index `at_least`."""
        return await self.snapshots.take(at_least)

    async def wait_for_leader(self, other_than: str | None = None) -> str:
        """Wait until a leader (other than `other_than`) is known; returns its id. Wrap in
        asyncio.wait_for for a deadline."""
        while (leader := self.core.leader) in (None, other_than):
            assert self._soft_changed is not None, "start() the node first"
            await self._soft_changed.wait()
        assert leader is not None
        return leader

    def _check_running(self) -> None:
        if self._stopped is not None:
            raise NodeStoppedError(self._stopped)

    # ---- the driver --------------------------------------------------------------------------

    def poke(self) -> None:
        """Have the ready loop look at the core again."""
        if self._wake is not None:
            self._wake.set()

    def ready_soon(self, *, at_once: bool) -> None:
        """Have the core's next Ready handled. With `at_once`, while the ready loop is idle, a
        Ready that needs no await is handled right here, inside the call that made it; anything
        else is left to the ready loop (one client's linearizable gets: docs/performance.md)."""
        if at_once and not self._driving and self.core.has_ready() and self.core.ready_is_light():
            try:
                self._ready.handle_now(self.core.ready())
            except Exception as e:  # as in the ready loop: stop rather than serve wrong data
                self._stop_on_error(e)
            return
        self.poke()

    async def _tick_loop(self) -> None:
        """The core's timers, every tick_interval_ms (a stall between two ticks counts as a
        heartbeat interval: raft/core/stall.py). While the ready loop awaits a Ready's
        apply or install, the messages that need not wait for it leave at each tick."""
        interval = self.config.tuning.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.core.tick(self._clock())
            if self._driving:  # see RaftCore.take_early_messages
                self._send_early()
            self.proposal_gate.release()
            self.poke()

    def _send_early(self) -> None:
        early = self.core.take_early_messages()
        if early:
            self.membership_changed()  # as before any Ready's messages
            self.transport.send(early)

    async def _ready_loop(self) -> None:
        assert self._wake is not None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                self._driving = True
                try:
                    while self.core.has_ready():
                        await self._ready.handle(self.core.ready())
                finally:
                    self._driving = False
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken store (corruption): stop serving rather than serve wrong data
            self._stop_on_error(e)

    def stop_serving(self, why: str) -> None:
        """Stop for good, as a crash would, on what the node must not serve past (its state is
        corrupt): it no longer votes, leads or answers its peers, and every waiting call fails
        with NodeStoppedError(why)."""
        if self._stopped is not None:
            return
        log.error("node %s stops serving: %s", self.id, why)
        self.halt(why)
        self._fail_all(lambda: NodeStoppedError(why))

    def _stop_on_error(self, e: Exception) -> None:
        log.exception("node %s stopped: %s", self.id, e)
        self._stopped = f"node stopped on an error: {e}"
        self._fail_all(lambda: NodeStoppedError(self._stopped or "stopped"))

    def _fail_all(self, write_error: Any, read_error: Any = None) -> None:
        self.proposal_gate.fail_held(write_error)
        self.proposals.fail_all(write_error)
        self.reads.fail_all(read_error or write_error)

    # ---- what the Ready handler reports --------------------------------------------------------

    def applied(self, index: int) -> None:
        """The state machine has applied through `index`."""
        self.applied_index = index
        self.reads.applied(index)

    def restart_core(self) -> None:
        """Replace the core with a fresh one from what is durable, as a crash would (how a node
        short of space gives way: DiskSpacePolicy); the Ready in hand belongs to the old core and
        is dropped (ReadyHandler.handle)."""
        self.core = self._new_core()
        self.poke()

    def membership_changed(self) -> None:
        """Tell the transport of a new configuration (before a Ready's messages go out): links to
        its members, and the members a committed configuration removed (refused from then on;
        not those of an uncommitted one, which a new leader may still truncate away)."""
        core = self.core
        latest = core.membership
        removed = core.committed_membership.removed if latest.removed else frozenset()
        if latest is not self._membership or removed != self._removed_told:
            old, self._membership, self._removed_told = self._membership, latest, removed
            if old is not None and old is not latest:
                log.info("node %s: members now voters %s, learners %s", self.id,
                         ", ".join(sorted(latest.voters)) or "-", ", ".join(sorted(latest.learners)) or "-")
            self.transport.reconfigure(self.peer_addresses(latest), sorted(removed))

    def peer_addresses(self, membership: Membership) -> dict[str, str]:
        """Where this node reaches each member of `membership`: its --peers entry, else the
        configuration's address; the configuration's for a member an update moved (its --peers
        entry names where it was)."""
        peers = self.config.peers
        return {m: (membership.address(m) if m in membership.moved else peers.get(m) or membership.address(m)) or ""
                for m in membership.members}

    def stop_if_removed(self) -> None:
        """Stop once the configuration that removed this node is applied (its proposer, if this
        node, has had its answer)."""
        removed_at = self.core.removed_at
        if removed_at is not None and self.applied_index >= removed_at and self._stopped is None:
            latest = self.core.membership
            self._stop_as_removed(f"removed from the cluster (by the configuration at index {removed_at}; members now: "
                              f"voters {', '.join(sorted(latest.voters))}"
                              f"{', learners ' + ', '.join(sorted(latest.learners)) if latest.learners else ''})")

    def soft_state_changed(self, ss: SoftState) -> None:
        old = self._soft
        was_leader = old is not None and old.role is Role.LEADER
        if ss.role is Role.LEADER and not was_leader:
            log.info("node %s elected leader in term %d", self.id, ss.term)
        elif was_leader and ss.role is not Role.LEADER:
            log.info("node %s stepped down in term %d (leader now %s)", self.id, ss.term, ss.leader or "unknown")
        if ss.leader is not None and (old is None or old.leader != ss.leader):
            self.stats.leader_changes += 1  # as etcd counts: the first leader seen too
        if ss.leader is not None and ss.leader != self.id and (old is None or old.leader != ss.leader):
            log.info("node %s sees new leader %s in term %d", self.id, ss.leader, ss.term)
        if self._joining is not None and self._joining.floor is not None and not self._joining.holding \
                and not ss.rejoining:
            log.info("node %s caught up after rejoining: it votes again", self.id)
            self._joining.caught_up()
        self._soft = ss
        if ss.role is not Role.LEADER and ss.leader is not None:
            self.proposal_gate.release()
        if self._soft_changed is not None:
            changed, self._soft_changed = self._soft_changed, asyncio.Event()
            changed.set()

    def note_caught_up(self) -> None:
        commit = self.core.commit_index
        if self._catching_up and self.applied_index >= commit and self.core.leader is not None:
            log.info("node %s caught up: applied through %d", self.id, self.applied_index)
            self._catching_up = False
        elif not self._catching_up and commit - self.applied_index > CATCH_UP_LAG:
            self._catching_up = True

    # ---- status ------------------------------------------------------------------------------

    @property
    def leader(self) -> str | None:
        return self.core.leader

    def leader_is_recent(self) -> bool:
        """Leader (which steps down after an election timeout without a live quorum), or a
        member that heard from its leader within the election timeout."""
        if self.core.role is Role.LEADER:
            return True
        return self.core.leader is not None and \
            self._clock() - self.leader_heard_ms < self.config.core.election_timeout_ms

    @property
    def spinning(self) -> bool:
        """Whether the event loop is being kept awake for a lone read (raft/node/loop_spin.py)."""
        return self.reads.spinning

    def status(self) -> dict[str, Any]:
        s = self.core.status()
        size_bytes = getattr(self.log, "size_bytes", None)
        newest = self.snapshots.newest
        return {
            "id": s.id,
            "role": _role_name(s.role),
            "term": s.term,
            "leader": s.leader,
            "commit_index": s.commit_index,
            "applied_index": self.applied_index,
            "snapshot_index": newest.index if newest else s.snapshot_index,
            "log_begin_index": s.snapshot_index,
            "log_begin_term": self.log.before_begin()[1],
            "peers": s.peers,  # the core's own copy, empty unless leader
            "cluster_id": self.cluster_id,
            "last_index": s.last_index,
            "leader_address": self.transport.client_address(s.leader) if s.leader else None,
            "log_size_bytes": size_bytes() if callable(size_bytes) else 0,
            "disk_full": self.disk_space.short_of_space() is not None,
            # Rejoining after losing its data (or still asking whether its cluster is new): it
            # votes for no one until it has caught up.
            "rejoining": self.core.rejoining,
            "voters": list(s.voters),
            "learners": list(s.learners),
        }
