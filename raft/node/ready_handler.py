"""The one place a Ready is handled, in the order raft/core/ready.py prescribes:

1. the leader's messages leave (they may go before its own write: Raft thesis §10.2.1);
2. a received snapshot is installed;
3. hard state, truncation and entries are saved in one fsynced write, on the event loop itself
   (pwrite and fdatasync let go of the GIL; the hop to a thread and back cost more than the sync);
4. the messages that depend on that write leave (votes, acknowledgements);
5. committed entries are applied, snapshot streams started, reads served or failed, dropped
   proposals failed;
6. the core is told the Ready is done (advance) and how far the state machine applied.

The driver's loop awaits `handle` for every Ready. A Ready that only sends messages and serves or
fails reads (RaftCore.ready_is_light) needs no await at all: `handle_now` runs the same coroutine
to its end inside the call that made it (a step or a read), so a heartbeat's answer or a lone reader's round leaves
without waiting for the driver's next turn."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from raft.core.ready import Ready
from raft.core.types import Entry
from raft.log.errors import LogFullError
from raft.node.giving_way import apply_in_slices, gives_way, yield_cpu

if TYPE_CHECKING:
    from raft.node.node import RaftNode

log = logging.getLogger(__name__)

# Committed batches this small are applied on the loop: an LMDB write without fsync costs less
# than the hop to the apply thread and back, which sits on every write's path (one client's puts:
# 298 -> 352/s). Larger batches, and any command whose cost its size does not bound (a range
# deletion: StateMachine.in_proportion), go to the apply thread so the loop keeps serving and
# heartbeating meanwhile.
INLINE_APPLY_ENTRIES = 4
INLINE_APPLY_BYTES = 16 << 10


class ReadyHandler:
    def __init__(self, node: RaftNode) -> None:
        self._node = node

    def handle_now(self, rd: Ready) -> None:
        """Handle a light Ready (RaftCore.ready_is_light) to its end, right here."""
        _run_without_suspending(self.handle(rd))

    async def handle(self, rd: Ready) -> None:
        """Handle one Ready. Returns without advancing the core when the core was rebuilt meanwhile
        (a node out of space gave way: DiskSpacePolicy._give_way); the Ready then belongs to a core that
        no longer exists."""
        node, core = self._node, self._node.core
        if rd.soft_state is not None:
            node.soft_state_changed(rd.soft_state)
        node.membership_changed()  # links to new members before anything is sent to them
        if rd.leader_messages:
            node.transport.send(rd.leader_messages)
        if rd.snapshot is not None:
            await node.snapshots.install(rd.snapshot)
            node.applied(node.fsm.applied_index)
            node.proposals.overtaken(node.applied_index, core.leader, core.term)
        if rd.must_persist():
            self._persist(rd)
        if node.core is not core:
            return
        if rd.messages:
            node.transport.send(rd.messages)
            if rd.committed_entries:
                # One loop step lets the links write these replies before the apply below holds
                # the loop: a follower's acknowledgement is on the leader's commit path, its apply
                # is not (one client's puts: 414 -> 459/s, median of 5 interleaved runs).
                await asyncio.sleep(0)
        applied_before = node.applied_index
        if rd.committed_entries:
            await self._apply(rd.committed_entries)
        if node.core is not core:
            return
        for send in rd.snapshot_sends:
            node.snapshots.send(send.peer, send.term)
        if rd.reads:
            node.stats.read_index_rounds += 1  # one round's reads come out in one Ready
        for rs in rd.reads:
            node.reads.served(rs)
        for fr in rd.failed_reads:
            node.reads.failed(fr)
        for dp in rd.failed_proposals:
            node.proposals.dropped(dp, core.term)
        core.advance(rd)
        if core.removed_at is not None:
            node.stop_if_removed()
            if not node.running:
                return
        if node.applied_index != applied_before:
            core.applied_to(node.applied_index)
            node.note_caught_up()
            node.snapshots.maybe_take()

    def _persist(self, rd: Ready) -> None:
        """Step 3. A full log makes the node give way (its core is rebuilt: drop this Ready)."""
        node = self._node
        if self._gives_way(len(rd.entries)):
            yield_cpu()
        started = time.perf_counter()
        try:
            node.log.save(rd.hard_state, rd.truncate_from, rd.entries)
        except LogFullError as e:
            node.disk_space.on_log_full(e)
            return
        node.stats.wal_fsync_seconds.observe(time.perf_counter() - started)  # one per write batch
        if rd.entries:
            node.disk_space.store_accepts_writes("log")

    async def _apply(self, entries: list[Entry]) -> None:
        """Apply (small batches on the loop, others on the apply thread), then settle each entry's
        proposal. When the state machine is full, the core holds what it could not apply and hands
        it out again later (DiskSpacePolicy.on_state_full)."""
        node = self._node
        payload_bytes = sum(len(e.payload) for e in entries)
        started = time.perf_counter()
        try:
            if len(entries) <= INLINE_APPLY_ENTRIES and payload_bytes <= INLINE_APPLY_BYTES \
                    and node.fsm.in_proportion(entries):
                results = node.fsm.apply(entries)
            elif self._gives_way(len(entries)):
                results = await node.workers.apply.run(apply_in_slices, node.fsm.apply, entries,
                                                       node.config.tuning.follower_yield_entries)
            else:
                results = await node.workers.apply.run(node.fsm.apply, entries)
        except node.disk_space.fsm_full_errors as e:
            # A sliced apply may have committed its first slices (their results are lost): the
            # core hands out again what follows what the state machine holds.
            node.applied(node.fsm.applied_index)
            node.disk_space.on_state_full(e)
            return
        node.stats.apply_seconds.observe(time.perf_counter() - started)  # one per apply transaction
        node.disk_space.store_accepts_writes("state machine")
        node.snapshots.bytes_since += payload_bytes
        core = node.core
        for entry, result in zip(entries, results):
            node.proposals.settle(entry, result, core.leader, core.term)
        if len(results) < len(entries):  # ended at a state check marker: the rest comes again
            core.apply_stopped(node.fsm.applied_index)
        node.applied(node.fsm.applied_index)


    def _gives_way(self, entries: int) -> bool:
        node = self._node
        return gives_way(node.core.role, entries, node.config.tuning.follower_yield_entries)


def _run_without_suspending(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never awaits anything that suspends, to its end, synchronously."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("a Ready handled on the spot suspended: it needed the driver's loop")
