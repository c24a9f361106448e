"""Reads: the barrier a read waits on before it may read the local state machine, as fresh as its
consistency promises.

- "stale": at once, at the applied index.
- "lease": at once on a leader whose lease holds (raft/core), once the commit index is applied.
- "linearizable": ReadIndex. The core notes its commit index, confirms it still leads with one
  heartbeat round shared by every read waiting, and hands back a ReadState; the read is served
  once the state machine has applied that index. On a busy leader a read may first be held for a
  moment so one round serves more reads (read_hold.py); for a lone read the leader's loop polls
  instead of sleeping while its round is out (loop_spin.py).

Every read is a future keyed by a context the core hands back; a caller that gives up leaves its
entry until the core serves or fails the read (it always does one or the other)."""
from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import TYPE_CHECKING, Callable

from raft.core.errors import NotLeaderError
from raft.core.ready import FailedRead, ReadState
from raft.core.types import Role
from raft.node.loop_spin import LoneReadSpin
from raft.node.read_hold import ReadHold

if TYPE_CHECKING:
    from raft.node.node import RaftNode

CONSISTENCIES = ("linearizable", "lease", "stale")


class Reads:
    def __init__(self, node: RaftNode) -> None:
        self._node = node
        config = node.config
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._ctx = itertools.count(1)
        self._hold = ReadHold(config.tuning.read_hold_ms / 1000, config.tuning.read_hold_siblings)
        self._release: asyncio.TimerHandle | None = None
        self._spin: LoneReadSpin | None = None  # made on the loop, at start()
        self._applied_waiters: list[tuple[int, int, asyncio.Future[int]]] = []  # heap on index
        self._waiter_seq = itertools.count()

    def start(self) -> None:
        if self._node.config.tuning.read_spin_us > 0:
            self._spin = LoneReadSpin(asyncio.get_running_loop(), self._node.config.tuning.read_spin_us / 1e6)

    def stop(self) -> None:
        if self._release is not None:
            self._release.cancel()
        if self._spin is not None:
            self._spin.stop()

    @property
    def pending(self) -> int:
        return len(self._waiting) + len(self._applied_waiters)

    @property
    def spinning(self) -> bool:
        return self._spin is not None and self._spin.awake

    def barrier(self, consistency: str) -> asyncio.Future[int]:
        """The future of the index at which a read is as fresh as `consistency` promises."""
        if consistency not in CONSISTENCIES:
            raise ValueError(f"consistency must be one of {CONSISTENCIES}, not {consistency!r}")
        node, core = self._node, self._node.core
        loop = asyncio.get_running_loop()
        node.stats.reads[consistency] += 1  # a lease read that finds no lease counts as one still
        if consistency == "stale":
            done = loop.create_future()
            done.set_result(node.applied_index)
            return done
        if consistency == "lease" and core.lease_valid():
            return self.wait_applied(core.commit_index)
        ctx = next(self._ctx)
        held = core.role == Role.LEADER and self._hold.hold(ctx, others_waiting=len(self._waiting))
        if not held:
            core.read_index(ctx)
        elif self._hold.first_held:
            self._release = loop.call_later(self._hold.delay_s, self._release_held)
        future: asyncio.Future[int] = loop.create_future()
        self._waiting[ctx] = future
        if not held:  # a held read wakes the driver when the hold ends (_release_held)
            lone = len(self._waiting) == 1
            if lone and self._spin is not None and core.role is Role.LEADER:
                self._spin.started(ctx)
            node.ready_soon(at_once=lone)  # a lone reader's round leaves at once
        return future

    @property
    def many_waiting(self) -> bool:
        """More than one read waits: a leader then leaves its rounds to the driver's turn, where
        the next round gathers more reads."""
        return len(self._waiting) > 1

    def _release_held(self) -> None:
        """Hand the reads ReadHold kept to the core: they ride its next round."""
        self._release = None
        for ctx in self._hold.release():
            if ctx not in self._waiting:
                continue  # already failed (the node stopped, or its store filled up)
            try:
                self._node.core.read_index(ctx)
            except NotLeaderError as e:  # leadership was lost while the read was held
                self._fail(ctx, e)
        self._node.poke()

    def served(self, rs: ReadState) -> None:
        if self._spin is not None:
            self._spin.served(rs.ctx)
        future = self._waiting.pop(rs.ctx, None)  # type: ignore[call-overload]
        if future is None or future.done():
            return
        if self._node.applied_index >= rs.index:
            future.set_result(rs.index)
        else:  # the core promises applied >= index; wait rather than serve a stale read if not
            self._resolve_once_applied(rs.index, future)

    def failed(self, fr: FailedRead) -> None:
        self._fail(fr.ctx, NotLeaderError(fr.leader, self._node.core.term))

    def _fail(self, ctx: object, error: Exception) -> None:
        future = self._waiting.pop(ctx, None)  # type: ignore[call-overload]
        if future is not None and not future.done():
            future.set_exception(error)

    def wait_applied(self, index: int) -> asyncio.Future[int]:
        """A future that resolves once the state machine has applied `index`, to the applied
        index then."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._node.applied_index >= index:
            future.set_result(self._node.applied_index)
        else:
            self._resolve_once_applied(index, future)
        return future

    def _resolve_once_applied(self, index: int, future: asyncio.Future[int]) -> None:
        heapq.heappush(self._applied_waiters, (index, next(self._waiter_seq), future))

    def applied(self, applied: int) -> None:
        """The state machine has applied up to `applied`: wake whoever waited for it."""
        while self._applied_waiters and self._applied_waiters[0][0] <= applied:
            _, _, future = heapq.heappop(self._applied_waiters)
            if not future.done():
                future.set_result(applied)

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Fail every waiting read with a fresh error()."""
        futures = list(self._waiting.values()) + [f for _, _, f in self._applied_waiters]
        self._waiting.clear()
        self._applied_waiters.clear()
        for future in futures:
            if not future.done():
                future.set_exception(error())
