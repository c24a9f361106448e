"""RaftNode: the asyncio driver around one RaftCore.

Three things run on the event loop: a tick task (the core learns the time), the peer service
(stepping incoming messages into the core) and the ready loop, which handles each Ready in the
order raft/core/ready.py prescribes. The two slow steps, the fsynced log write and applying to
the state machine, run in their own worker threads (raft/node/worker_thread.py), except a
leader's own log write and small applies, which are cheaper on the loop than the hop; messages
and proposals arriving meanwhile go into the next Ready, which is where group commit comes from
(one fsync for everything that arrived during the previous one). A Ready that only sends
messages and serves reads may instead be handled inside the step or read that made it
(`_ready_soon`).

Client requests wait on futures: a proposal on its log index (resolved when that index is applied
with the proposal's term), a linearizable read on its ReadIndex context."""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

from raft.core.errors import NotLeaderError
from raft.core.log_store import LogStore
from raft.core.messages import InstallSnapshotRequest, InstallSnapshotResponse, Message
from raft.core.raft import RaftCore
from raft.core.ready import DroppedProposals, Ready, SoftState
from raft.core.types import Entry, Role, SnapshotMeta
from raft.log.errors import LogFullError
from raft.node.cluster_id import resolve_cluster_id
from raft.node.config import NodeConfig
from raft.node.errors import DiskFullError, NodeStoppedError, QueueFullError
from raft.node.fsm import StateMachine
from raft.node.giving_way import apply_in_slices, gives_way, yield_cpu
from raft.node.loop_spin import LoneReadSpin
from raft.node.read_hold import ReadHold
from raft.node.snapshots import SnapshotHost, SnapshotInfo, SnapshotReceiving
from raft.node.worker_thread import WorkerThread
from raft.transport.address import split_address
from raft.transport.message_listener import MessageListener
from raft.transport.peer_client import PeerClient
from raft.transport.peer_transport import PeerService

log = logging.getLogger(__name__)

CONSISTENCIES = ("linearizable", "lease", "stale")
# A follower this far behind its commit index is "catching up"; it logs once when it has caught up.
CATCH_UP_LAG = 1000
# Committed batches this small are applied on the loop: an LMDB write without fsync costs less
# than the hop to the apply thread and back, which sits on every write's path (one client's puts:
# 298 -> 352/s). Larger batches (or a few bulk commands) go to the apply thread so the loop keeps
# serving meanwhile.
INLINE_APPLY_ENTRIES = 4
INLINE_APPLY_BYTES = 16 << 10


def _needs_driver(rd: Ready) -> bool:
    """Whether a Ready writes the disk, applies, installs or streams a snapshot, or changes the
    role: work for the driver's loop, not for a call handling a message or a read."""
    return bool(rd.must_persist() or rd.snapshot is not None or rd.committed_entries or rd.snapshot_sends
                or rd.soft_state is not None)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def _role_name(role: Role) -> str:
    # status() speaks the contract's three roles; a pre-candidate is a candidate that has not yet
    # raised its term.
    return "candidate" if role is Role.PRE_CANDIDATE else role.value


@dataclass(slots=True)
class _Proposal:
    term: int
    future: asyncio.Future[Any]


class RaftNode:
    """Create, `await start()` on the loop that will run it, `await stop()` when done. The caller
    owns (opens and closes) the log store and the state machine."""

    def __init__(self, config: NodeConfig, log_store: LogStore, fsm: StateMachine,
                 rng: random.Random | None = None,
                 fsm_full_errors: tuple[type[Exception], ...] = (),
                 snapshots: SnapshotHost | None = None, cluster_id: str | None = None) -> None:
        """`fsm_full_errors`: what the state machine raises when it is out of space (raft may
        not import statemachine, so the server names its StateFullError here). `cluster_id`: the
        id already resolved from the data directory, if the caller did (else it is resolved here)."""
        self.config = config
        self._fsm_full_errors = fsm_full_errors
        self.id = config.node_id
        self.cluster_id = cluster_id or resolve_cluster_id(config.data_dir, config.cluster_id, config.peers)
        self._log = log_store
        self._fsm = fsm
        self._rng = rng or random.Random()
        self._applied = fsm.applied_index
        self._core = self._new_core()
        self._soft: SoftState | None = None
        self._proposals: dict[int, _Proposal] = {}
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._read_ctx = itertools.count(1)
        self._read_hold = ReadHold(config.read_hold_ms / 1000, config.read_hold_siblings)
        self._read_release: asyncio.TimerHandle | None = None
        self._read_spin: LoneReadSpin | None = None  # made on the loop, at start()
        self._applied_waiters: list[tuple[int, int, asyncio.Future[int]]] = []  # heap on index
        self._waiter_seq = itertools.count()
        self._disk_full: str | None = None  # why writes are refused, while the store is full
        self._stopped: str | None = "not started"
        self._catching_up = True
        self._log_thread = WorkerThread(f"raft-log-{self.id}")
        self._apply_thread = WorkerThread(f"raft-apply-{self.id}")
        self._wake: asyncio.Event | None = None
        self._driving = False  # the driver is inside a Ready (between ready() and advance())
        self._taken: Ready | None = None  # a Ready _ready_soon took but left to the driver
        # Set (and replaced by a fresh one) on every new SoftState: a broadcast to waiters.
        self._soft_changed: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._transport: PeerClient | None = None
        self._listener: MessageListener | None = None
        # Snapshots: the newest on disk, the one being taken, streams to followers, files received.
        self._snapshots = snapshots
        self._snapshot_info: SnapshotInfo | None = snapshots.newest() if snapshots else None
        self._snapshot_task: asyncio.Task[SnapshotInfo] | None = None
        self._snapshot_streams: dict[str, asyncio.Task[None]] = {}
        self._snapshot_wanted: dict[str, int] = {}  # peer -> term of a send asked for mid-stream
        self._received_snapshot: tuple[SnapshotMeta, Path] | None = None
        self._bytes_since_snapshot = 0
        self._peer_service = PeerService(self.id, self.cluster_id, self.config.members, self.step,
                                         snapshots=self if self._snapshots is not None else None,
                                         message_port=lambda: self.message_port)

    def _new_core(self) -> RaftCore:
        return RaftCore(self.id, self.config.members, self._log, self.config.core, self._rng, now_ms(),
                        applied_index=self._applied)

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def message_port(self) -> int:
        """Where this node takes peers' message connections (0: none, on the gRPC transport or alone)."""
        return self._listener.port if self._listener is not None else 0

    def peer_service(self) -> PeerService:
        """The RaftPeer servicer to add to this node's gRPC server."""
        return self._peer_service

    async def start(self) -> None:
        """Start the loops and, in a cluster on the TCP peer transport, the message listener
        (OSError when --peer-port cannot be bound)."""
        if self.config.peer_transport == "tcp" and len(self.config.members) > 1:
            self._listener = MessageListener(self._peer_service.check, self.step)
            await self._listener.start(split_address(self.config.listen)[0], self.config.peer_port)
        self._wake = asyncio.Event()
        self._soft_changed = asyncio.Event()
        self._read_spin = LoneReadSpin(asyncio.get_running_loop(), self.config.read_spin_us / 1e6)
        self._transport = PeerClient(self.id, self.cluster_id, self.config.peers, self.config.rpc_timeout_ms,
                                     on_gone=self._peer_gone, peer_transport=self.config.peer_transport,
                                     message_addresses=self.config.peer_message_addresses)
        self._stopped = None
        self._tasks = [asyncio.create_task(self._tick_loop(), name=f"raft-tick-{self.id}"),
                       asyncio.create_task(self._ready_loop(), name=f"raft-ready-{self.id}")]
        self._wake.set()

    async def stop(self) -> None:
        """Stop ticking and handling Readies, fail what waits, and wait for the executor threads
        so the caller may close the stores right after."""
        if self._stopped is None:
            self._stopped = "node stopped"
        background = [*self._tasks, *self._snapshot_streams.values()]
        if self._snapshot_task is not None:
            background.append(self._snapshot_task)
        for t in background:
            t.cancel()
        if self._read_release is not None:
            self._read_release.cancel()
        if self._read_spin is not None:
            self._read_spin.stop()
        await asyncio.gather(*background, return_exceptions=True)
        self._tasks = []
        self._fail_all(lambda: NodeStoppedError("node is shutting down"))
        if self._transport is not None:
            await self._transport.close()
        if self._listener is not None:
            await self._listener.close()
        await asyncio.to_thread(self._log_thread.close)
        await asyncio.to_thread(self._apply_thread.close)

    # ---- inputs ------------------------------------------------------------------------------

    def step(self, messages: Sequence[Message]) -> None:
        """Messages from peers (called by the peer service on the loop)."""
        if self._stopped is not None:
            return
        self._core.clock(now_ms())
        for m in messages:
            try:
                self._core.step(m)
            except Exception:  # a message the core chokes on must not take the node down
                log.exception("core refused message %r", m)
        # A follower answers a heartbeat at once; a leader serves its reads at once only when no
        # other read waits: with many, the driver's turn lets the next round gather more reads.
        self._ready_soon(at_once=self._core.role is not Role.LEADER or len(self._reads) <= 1)

    def propose(self, payload: bytes) -> asyncio.Future[Any]:
        """Replicate one command; the future resolves to the state machine's result for it once
        applied. Raises (at once) NotLeaderError, QueueFullError, DiskFullError, NodeStoppedError;
        the future may fail with NotLeaderError or NodeStoppedError. A plain future rather than a
        coroutine: awaiting it under a timeout then costs no task (this is the hot path)."""
        self._check_running()
        if self._disk_full is not None:
            raise DiskFullError(self._disk_full)
        self._check_queue()
        self._core.clock(now_ms())
        index, term = self._core.propose([payload])
        # A caller that gives up (cancels) leaves the entry here until it is applied or dropped;
        # _settle and _fail_dropped skip futures that are done.
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._proposals[index] = _Proposal(term, future)
        self._poke()
        return future

    def read_barrier(self, consistency: str = "linearizable") -> asyncio.Future[int]:
        """A future that resolves once a read of the local state machine is as fresh as
        `consistency` promises, to the index it is safe to read at. Raises NotLeaderError (not
        for "stale"), at once or through the future."""
        if consistency not in CONSISTENCIES:
            raise ValueError(f"consistency must be one of {CONSISTENCIES}, not {consistency!r}")
        self._check_running()
        loop = asyncio.get_running_loop()
        if consistency == "stale":
            done = loop.create_future()
            done.set_result(self._applied)
            return done
        self._check_queue()
        self._core.clock(now_ms())
        if consistency == "lease" and self._core.lease_valid():
            return self.wait_applied(self._core.commit_index)
        ctx = next(self._read_ctx)
        held = self._core.role == Role.LEADER and self._read_hold.hold(ctx, others_waiting=len(self._reads))
        if not held:
            self._core.read_index(ctx)
        elif self._read_hold.first_held:
            self._read_release = loop.call_later(self._read_hold.delay_s, self._release_reads)
        future: asyncio.Future[int] = loop.create_future()
        # A caller that gives up leaves its entry until the core serves or fails the read (it
        # always does one or the other); _serve_read and _fail_read skip futures that are done.
        self._reads[ctx] = future
        if not held:  # a held read wakes the driver when the hold ends (_release_reads)
            lone = len(self._reads) == 1
            if lone and self._read_spin is not None and self._core.role is Role.LEADER:
                # Poll through the round and, when the next lone read is likely close, a moment
                # after it (raft/node/loop_spin.py: one client's linearizable gets about +35%).
                self._read_spin.started(ctx)
            self._ready_soon(at_once=lone)  # a lone reader's round leaves at once
        return future

    def _release_reads(self) -> None:
        """Hand the reads ReadHold kept to the core: they ride its next round."""
        self._read_release = None
        for ctx in self._read_hold.release():
            if ctx not in self._reads:
                continue  # already failed (the node stopped, or its store filled up)
            try:
                self._core.read_index(ctx)
            except NotLeaderError as e:  # leadership was lost while the read was held
                self._fail_read(ctx, e)
        self._poke()

    def _peer_gone(self, peer: str) -> None:
        """The transport's word that `peer`'s process is gone (connection refused or reset)."""
        if self._stopped is None:
            self._core.peer_unreachable(peer)
            self._poke()

    async def wait_for_leader(self, other_than: str | None = None) -> str:
        """Wait until a leader (other than `other_than`) is known; returns its id. Wrap in
        asyncio.wait_for for a deadline."""
        while (leader := self._core.leader) in (None, other_than):
            assert self._soft_changed is not None, "start() the node first"
            await self._soft_changed.wait()
        assert leader is not None
        return leader

    def _check_running(self) -> None:
        if self._stopped is not None:
            raise NodeStoppedError(self._stopped)

    def _check_queue(self) -> None:
        pending = len(self._proposals) + len(self._reads) + len(self._applied_waiters)
        if pending >= self.config.max_pending_requests:
            raise QueueFullError(
                f"{pending} requests are already waiting on node {self.id} "
                f"(max_pending_requests={self.config.max_pending_requests}); back off and retry")

    def wait_applied(self, index: int) -> asyncio.Future[int]:
        """A future that resolves once the state machine has applied `index`, to the applied
        index then."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._applied >= index:
            future.set_result(self._applied)
        else:
            self._resolve_once_applied(index, future)
        return future

    def _resolve_once_applied(self, index: int, future: asyncio.Future[int]) -> None:
        """Resolve `future` (with the applied index then) once the state machine has applied `index`."""
        heapq.heappush(self._applied_waiters, (index, next(self._waiter_seq), future))

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _ready_soon(self, *, at_once: bool) -> None:
        """Have the core's next Ready handled. With `at_once`, while the driver is idle, a Ready
        that only sends messages and serves or fails reads is handled right here, inside the call
        that made it: a heartbeat's answer or a lone reader's round then leaves without waiting
        for the driver's next loop turn (one client's linearizable gets: README). Anything else
        is handed to the driver."""
        if at_once and not self._driving and self._taken is None and self._core.has_ready():
            rd = self._core.ready()
            if not _needs_driver(rd):
                try:
                    self._send(rd)
                    self._finish(rd)
                except Exception as e:  # as in the driver: stop rather than serve wrong data
                    self._stop_on_error(e)
                return
            self._taken = rd
        self._poke()

    # ---- the loops ---------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        interval = self.config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._core.tick(now_ms())
            self._poke()

    async def _ready_loop(self) -> None:
        assert self._wake is not None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                self._driving = True
                try:
                    while self._taken is not None or self._core.has_ready():
                        rd, self._taken = self._taken or self._core.ready(), None
                        await self._handle(rd)
                finally:
                    self._driving = False
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken store (corruption): stop serving rather than serve wrong data
            self._stop_on_error(e)

    def _stop_on_error(self, e: Exception) -> None:
        log.exception("node %s stopped: %s", self.id, e)
        self._stopped = f"node stopped on an error: {e}"
        self._fail_all(lambda: NodeStoppedError(self._stopped or "stopped"))

    async def _handle(self, rd: Ready) -> None:
        """One Ready, in ready.py's order. Returns without advancing only when the core was
        rebuilt after a full store (the Ready then belongs to a core that no longer exists)."""
        assert self._transport is not None
        if rd.soft_state is not None:
            self._log_soft_state(rd.soft_state)
        if rd.leader_messages:
            self._transport.send(rd.leader_messages)
        if rd.snapshot is not None:
            await self._install_snapshot(rd.snapshot)
        if rd.must_persist():
            try:
                # On the loop itself, by leader and followers alike: the hop to the log thread and
                # back cost more than the sync (pwrite and fdatasync let go of the GIL meanwhile).
                # The leader's own write is on the commit path as soon as a follower answers first
                # (one client's puts +8-12%, the leader's CPU per put -12%); a follower gained
                # nothing from it until thrifty replication left one follower on a write's path
                # (then one client's puts +2%, 8 of 10 windows; README, Performance).
                if self._gives_way(len(rd.entries)):
                    yield_cpu()
                self._log.save(rd.hard_state, rd.truncate_from, rd.entries)
            except LogFullError as e:
                self._on_store_full(e)
                return
            if rd.entries and self._disk_full is not None:
                log.info("log store accepts writes again")
                self._disk_full = None
        if rd.messages:
            self._transport.send(rd.messages)
            if rd.committed_entries:
                # One loop step lets the links write these replies before the apply below holds
                # the loop: a follower's acknowledgement is on the leader's commit path, its
                # apply is not (one client's puts: 414 -> 459/s, median of 5 interleaved runs).
                # A TCP link has written them in send() already; skipping the step for it
                # measured the same (three interleaved pairs), so it stays for both transports.
                await asyncio.sleep(0)
        applied_before = self._applied
        if rd.committed_entries and not await self._apply(rd.committed_entries):
            return
        for send in rd.snapshot_sends:
            self._start_snapshot_stream(send.peer, send.term)
        self._finish(rd)
        if self._applied != applied_before:
            self._core.applied_to(self._applied)
            self._note_caught_up()
            self._maybe_snapshot()

    def _send(self, rd: Ready) -> None:
        """(a Ready that needs no disk write: both lists go out together)"""
        assert self._transport is not None
        if rd.leader_messages:
            self._transport.send(rd.leader_messages)
        if rd.messages:
            self._transport.send(rd.messages)

    def _finish(self, rd: Ready) -> None:
        """The end of every Ready: serve and fail reads, fail dropped proposals, advance."""
        for rs in rd.reads:
            self._serve_read(rs.ctx, rs.index)
        for fr in rd.failed_reads:
            self._fail_read(fr.ctx, NotLeaderError(fr.leader, self._core.term))
        for dp in rd.failed_proposals:
            self._fail_dropped(dp)
        self._core.advance(rd)

    # ---- apply -------------------------------------------------------------------------------

    async def _apply(self, entries: list[Entry]) -> bool:
        """Apply (small batches on the loop, others in the apply thread), then settle each entry's
        proposal. False when the state machine is full (the rest of the batch not applied; the
        core was rebuilt to hand those entries out again)."""
        payload_bytes = sum(len(e.payload) for e in entries)
        try:
            if len(entries) <= INLINE_APPLY_ENTRIES and payload_bytes <= INLINE_APPLY_BYTES:
                results = self._fsm.apply(entries)
            elif self._gives_way(len(entries)):
                results = await self._apply_thread.run(apply_in_slices, self._fsm.apply, entries,
                                                       self.config.follower_yield_entries)
            else:
                results = await self._apply_thread.run(self._fsm.apply, entries)
        except self._fsm_full_errors as e:
            # A sliced apply may have committed its first slices: the rebuilt core starts after
            # what the state machine holds.
            self._applied = self._fsm.applied_index
            self._on_store_full(e)
            return False
        self._applied = self._fsm.applied_index
        self._bytes_since_snapshot += payload_bytes
        for entry, result in zip(entries, results):
            self._settle(entry, result)
        self._wake_applied_waiters()
        return True

    def _gives_way(self, entries: int) -> bool:
        return gives_way(self._core.role, entries, self.config.follower_yield_entries)

    def _settle(self, entry: Entry, result: Any) -> None:
        proposal = self._proposals.pop(entry.index, None)
        if proposal is None or proposal.future.done():
            return
        if proposal.term == entry.term:
            proposal.future.set_result(result)
        else:  # another leader's entry took this index: ours was lost with our leadership
            proposal.future.set_exception(NotLeaderError(self._core.leader, self._core.term))

    def _wake_applied_waiters(self) -> None:
        while self._applied_waiters and self._applied_waiters[0][0] <= self._applied:
            _, _, future = heapq.heappop(self._applied_waiters)
            if not future.done():
                future.set_result(self._applied)

    # ---- snapshots ---------------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        """Start a snapshot (in the background: applying goes on) once enough was applied."""
        if self._snapshots is None or self._snapshot_task is not None:
            return
        base = self._snapshot_info.index if self._snapshot_info else 0
        if (self._applied - base >= self.config.snapshot_threshold
                or self._bytes_since_snapshot >= self.config.snapshot_threshold_bytes):
            self._snapshot_task = asyncio.create_task(self._take_snapshot(), name=f"raft-snapshot-{self.id}")

    async def take_snapshot(self, at_least: int = 0) -> SnapshotInfo:
        """A snapshot that includes at least index `at_least` (taken now if the newest does not)."""
        if self._snapshots is None:
            raise RuntimeError("this node keeps no snapshots")
        while True:
            if self._snapshot_info is not None and self._snapshot_info.index >= max(at_least, 1):
                return self._snapshot_info
            if self._snapshot_task is None:
                self._snapshot_task = asyncio.create_task(self._take_snapshot(), name=f"raft-snapshot-{self.id}")
            info = await asyncio.shield(self._snapshot_task)
            if info.index >= at_least:
                return info

    async def _take_snapshot(self) -> SnapshotInfo:
        assert self._snapshots is not None
        try:
            info = await asyncio.to_thread(self._snapshots.take)
            self._snapshot_info, self._bytes_since_snapshot = info, 0
            # Keep a tail behind the snapshot so a slightly slow follower needs no install, and
            # (up to as much again) what live followers still lack: a lazy follower trails by up
            # to lazy_push_ms, which under a fast writer can be more than a short tail.
            trailing = self.config.trailing_entries
            upto = info.index - trailing
            floor = self._core.replicating_floor()
            if floor is not None:
                upto = max(min(upto, floor), info.index - 2 * trailing)
            await self._log_thread.run(self._compact_log, upto)
            if not self._snapshot_streams:  # never delete a file that is being streamed
                await asyncio.to_thread(self._snapshots.prune)
            log.info("node %s took a snapshot at index %d; log now begins after %d", self.id, info.index,
                     self._log.before_begin()[0])
            return info
        except Exception:
            log.exception("node %s failed to take a snapshot", self.id)
            raise
        finally:
            self._snapshot_task = None

    def _compact_log(self, upto: int) -> None:
        """(persist thread) Drop log entries through `upto`, if the log still holds them."""
        if upto > self._log.before_begin()[0] and self._log.term(upto) is not None:
            self._log.compact(upto)

    def _start_snapshot_stream(self, peer: str, term: int) -> None:
        if self._snapshots is None:
            log.error("peer %s needs a snapshot, but this node keeps none", peer)
            return
        if peer in self._snapshot_streams:
            # The follower may already have answered the running stream (its reply travels on
            # its own link) and need a newer snapshot: send again as soon as this one ends.
            self._snapshot_wanted[peer] = term
            return
        self._snapshot_streams[peer] = asyncio.create_task(self._stream_snapshot(peer, term),
                                                           name=f"raft-snapshot-to-{peer}")

    async def _stream_snapshot(self, peer: str, term: int) -> None:
        """Stream the newest snapshot to `peer`. The follower's core answers through the normal
        messages once it installed it; a failed stream is reported to our core right away."""
        assert self._transport is not None
        ok, why = False, ""
        try:
            info = await self.take_snapshot()
            meta = SnapshotMeta(info.index, info.term, tuple(self.config.members))
            rate = self.config.snapshot_bandwidth_bytes_per_s
            timeout = 60.0 + (info.file_size / rate if rate else 0.0)
            log.info("node %s sending snapshot at index %d (%d bytes) to %s", self.id, info.index, info.file_size, peer)
            ok, why = await self._transport.send_snapshot(peer, term, meta, info.file_size, info.sha256,
                                                          self._throttled_chunks(info), timeout)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            why = str(e)
        finally:
            self._snapshot_streams.pop(peer, None)
            wanted = self._snapshot_wanted.pop(peer, None)
            if wanted is not None and self._stopped is None:
                self._start_snapshot_stream(peer, wanted)
        if not ok:
            log.warning("node %s could not send a snapshot to %s: %s", self.id, peer, why)
            self.step([InstallSnapshotResponse(peer, self.id, term, success=False)])

    async def _throttled_chunks(self, info: SnapshotInfo) -> AsyncIterator[tuple[int, bytes, bool]]:
        """The file in chunks, read off the loop, paced to the configured bandwidth so a large
        install neither starves heartbeats nor floods the link."""
        assert self._snapshots is not None
        chunks = self._snapshots.chunks(info, self.config.snapshot_chunk_bytes)
        rate = self.config.snapshot_bandwidth_bytes_per_s
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
            sent += len(chunk[1])
            if rate and (ahead := sent / rate - (loop.time() - start)) > 0:
                await asyncio.sleep(ahead)

    def snapshot_receiver(self, source: str) -> SnapshotReceiving:
        assert self._snapshots is not None
        return self._snapshots.receiver(source)

    def snapshot_received(self, leader: str, term: int, meta: SnapshotMeta, path: Path) -> None:
        """A verified snapshot file from the leader: offer it to the core, which decides (by term
        and commit index) whether to install it."""
        if self._received_snapshot is not None:
            self._received_snapshot[1].unlink(missing_ok=True)
        self._received_snapshot = (meta, path)
        self.step([InstallSnapshotRequest(leader, self.id, term, meta=meta)])

    async def _install_snapshot(self, meta: SnapshotMeta) -> None:
        """Ready.snapshot: swap the state machine to the received snapshot, then reset the log to
        begin after it (a crash between the two is repaired at start: see kv/server/server.py)."""
        assert self._snapshots is not None
        received = self._received_snapshot
        if received is None or (received[0].index, received[0].term) != (meta.index, meta.term):
            raise RuntimeError(f"the core installs snapshot {meta} but no such file was received")
        self._received_snapshot = None
        info = await self._apply_thread.run(self._snapshots.install, received[1])
        await self._log_thread.run(self._log.reset_to_snapshot, info.index, info.term)
        self._snapshot_info, self._bytes_since_snapshot = info, 0
        self._applied = self._fsm.applied_index
        self._wake_applied_waiters()
        log.info("node %s installed a snapshot at index %d (term %d)", self.id, info.index, info.term)

    # ---- reads and failures ------------------------------------------------------------------

    def _serve_read(self, ctx: object, index: int) -> None:
        if self._read_spin is not None:
            self._read_spin.served(ctx)
        future = self._reads.pop(ctx, None)  # type: ignore[call-overload]
        if future is None or future.done():
            return
        if self._applied >= index:
            future.set_result(index)
        else:  # the core promises applied >= index; wait rather than serve a stale read if not
            self._resolve_once_applied(index, future)

    def _fail_read(self, ctx: object, error: Exception) -> None:
        future = self._reads.pop(ctx, None)  # type: ignore[call-overload]
        if future is not None and not future.done():
            future.set_exception(error)

    def _fail_dropped(self, dp: DroppedProposals) -> None:
        for index in range(dp.first, dp.last + 1):
            proposal = self._proposals.get(index)
            if proposal is not None and proposal.term == dp.term:
                del self._proposals[index]
                if not proposal.future.done():
                    proposal.future.set_exception(NotLeaderError(dp.leader, self._core.term))

    def _fail_all(self, write_error: Callable[[], Exception],
                  read_error: Callable[[], Exception] | None = None) -> None:
        """Fail every waiting proposal with write_error() and every waiting read with
        read_error() (default: write_error()), a fresh exception each."""
        read_error = read_error or write_error
        writes = [p.future for p in self._proposals.values()]
        reads = list(self._reads.values()) + [f for _, _, f in self._applied_waiters]
        self._proposals.clear()
        self._reads.clear()
        self._applied_waiters.clear()
        for futures, error in ((writes, write_error), (reads, read_error)):
            for future in futures:
                if not future.done():
                    future.set_exception(error())

    def _on_store_full(self, e: Exception) -> None:
        """A write to the log or state store failed for space. The Ready cannot be completed, so
        the core restarts from what is durable - exactly what a crash here would do, which Raft
        tolerates - and writes are refused until a write of entries succeeds again."""
        if self._disk_full is None:  # once per episode: a full leader re-elects and fails again
            log.error("node %s refuses writes: %s", self.id, e)
        self._disk_full = f"node {self.id} is out of space: {e}"
        # Reads are not refused for space: they failed only because this core is going away.
        self._fail_all(lambda: DiskFullError(self._disk_full or "disk full"),
                       lambda: NotLeaderError(None, self._core.term))
        self._core = self._new_core()
        self._poke()

    # ---- logging -----------------------------------------------------------------------------

    def _log_soft_state(self, ss: SoftState) -> None:
        old = self._soft
        was_leader = old is not None and old.role is Role.LEADER
        if ss.role is Role.LEADER and not was_leader:
            log.info("node %s elected leader in term %d", self.id, ss.term)
        elif was_leader and ss.role is not Role.LEADER:
            log.info("node %s stepped down in term %d (leader now %s)", self.id, ss.term, ss.leader or "unknown")
        if ss.leader is not None and ss.leader != self.id and (old is None or old.leader != ss.leader):
            log.info("node %s sees new leader %s in term %d", self.id, ss.leader, ss.term)
        self._soft = ss
        self._notify_soft_change()

    def _notify_soft_change(self) -> None:
        if self._soft_changed is not None:
            changed, self._soft_changed = self._soft_changed, asyncio.Event()
            changed.set()

    def _note_caught_up(self) -> None:
        commit = self._core.commit_index
        if self._catching_up and self._applied >= commit and self._core.leader is not None:
            log.info("node %s caught up: applied through %d", self.id, self._applied)
            self._catching_up = False
        elif not self._catching_up and commit - self._applied > CATCH_UP_LAG:
            self._catching_up = True

    # ---- status ------------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def leader(self) -> str | None:
        return self._core.leader

    @property
    def spinning(self) -> bool:
        """Whether the event loop is being kept awake for a lone read (raft/node/loop_spin.py)."""
        return self._read_spin is not None and self._read_spin.awake

    def status(self) -> dict[str, Any]:
        s = self._core.status()
        size_bytes = getattr(self._log, "size_bytes", None)
        return {
            "id": s.id,
            "role": _role_name(s.role),
            "term": s.term,
            "leader": s.leader,
            "commit_index": s.commit_index,
            "applied_index": self._applied,
            "snapshot_index": self._snapshot_info.index if self._snapshot_info else s.snapshot_index,
            "log_begin_index": s.snapshot_index,
            "log_begin_term": self._log.before_begin()[1],
            "peers": s.peers,  # the core's own copy, empty unless leader
            "cluster_id": self.cluster_id,
            "last_index": s.last_index,
            "leader_address": self.config.peers.get(s.leader) if s.leader else None,
            "log_size_bytes": size_bytes() if callable(size_bytes) else 0,
            "disk_full": self._disk_full is not None,
        }
