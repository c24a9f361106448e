"""The change feed of a node, which etcd's Watch and the native KV.Changes both follow: every watcher gets every change to its key range from its start revision on,
in revision order, exactly once, from this member's applied state (any member serves watches).

A watcher is either synced (it has every change up to the hub's revision) or catching up. Each
time the node applies entries, the hub reads the new changes once (statemachine/mvcc.py,
changes_between) and hands each synced watcher those in its range. A watcher created at a past
revision, or one whose consumer fell behind (its stream has not sent what it was given), catches
up on its own: it reads from the store, at most CATCH_UP_REVISIONS revisions at a time and only
when its consumer has room, until it reaches the hub's revision and joins the synced ones. So a slow
consumer costs reads of the store, never memory without bound (etcd's synced and unsynced
watcher groups, for the same reason). A watcher whose next revision was compacted away is told so
and ends."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from raft.node.node import RaftNode
from statemachine.kv_state import KVStateMachine
from statemachine.mvcc import Change, CompactedError

log = logging.getLogger(__name__)

# Revisions one read of a catching-up watcher covers (etcd's watchBatchMaxRevs).
CATCH_UP_REVISIONS = 1000
# Synced watchers handed their changes in one turn of the event loop (about a millisecond's work).
WATCHERS_PER_TURN = 256


@dataclass(eq=False)
class Watcher:
    """One watch: [start, end) (end None: to the last key), from `next_revision` on. The hub calls
    `deliver(changes, revision)` with the watcher's changes through `revision` (possibly none),
    `compacted(revision)` when the changes it needs were compacted (then it is removed), and asks
    `behind()` whether its consumer has too much not yet sent (then it catches up instead)."""

    start: bytes
    end: bytes | None
    next_revision: int
    with_prev: bool
    deliver: Callable[[list[Change], int], None]
    compacted: Callable[[int], None]
    behind: Callable[[], bool]
    room: Callable[[], asyncio.Event]  # set while the consumer can take more
    removed: bool = field(default=False, init=False)

    def covers(self, key: bytes) -> bool:
        return key >= self.start and (self.end is None or key < self.end)

    def take(self, changes: list[Change], revision: int) -> None:
        """Hand over the changes in range from next_revision through `revision`."""
        self.take_in_range([c for c in changes if self.covers(c.kv.key)], revision)

    def take_in_range(self, in_range: list[Change], revision: int) -> None:
        """`take` of changes already cut to this watcher's range (in revision order): handed over
        as the same list when the watcher wants all of them, so watches of one range share it."""
        first = self.next_revision
        mine = in_range if not in_range or in_range[0].kv.mod_revision >= first else \
            [c for c in in_range if c.kv.mod_revision >= first]
        # Never backwards: a watch resumed on a member behind it may be handed revisions it has.
        self.next_revision = max(first, revision + 1)
        self.deliver(mine, revision)


class WatchHub:
    def __init__(self, node: RaftNode, fsm: KVStateMachine) -> None:
        self._node = node
        self._fsm = fsm
        self._synced: set[Watcher] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.revision = 0  # every synced watcher has had every change up to here
        self._advanced = asyncio.Event()  # set, and replaced, each time `revision` moves
        self._follower: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.revision = self._fsm.revision
        self._follower = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._follower] if self._follower else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def watchers(self) -> int:
        return len(self._synced) + len(self._tasks)

    async def reached(self, revision: int) -> int:
        """Return once the hub has read this member's changes through `revision` (KV.Changes waits
        here for its end revision, as a watch waits for its events); the hub's revision then."""
        while self.revision < revision:
            await self._advanced.wait()
        return self.revision

    def add(self, watcher: Watcher) -> None:
        if watcher.next_revision > self.revision:
            self._synced.add(watcher)
        else:
            self._catch_up(watcher)

    def remove(self, watcher: Watcher) -> None:
        watcher.removed = True
        self._synced.discard(watcher)

    async def _follow(self) -> None:
        while True:
            # Noted before the read: whatever is applied while _advance reads wakes the wait at once.
            seen = self._node.applied_index
            try:
                await self._advance()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a read failed (a damaged value): the catch-ups retry it
                log.exception("watch: reading the new changes failed; synced watchers catch up from the store")
                for watcher in list(self._synced):
                    self._demote(watcher)
            try:
                await self._node.wait_applied(seen + 1)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the node failed its waiters (a stop, a term change): wait again
                await asyncio.sleep(0.05)

    async def _advance(self) -> None:
        revision = self._fsm.revision
        if revision <= self.revision:
            return
        if self._synced:
            with_prev = any(w.with_prev for w in self._synced)
            try:
                changes: list[Change] | None = await asyncio.to_thread(
                    self._fsm.changes, self.revision + 1, revision, b"", None, with_prev)
            except CompactedError:
                changes = None  # a snapshot install jumped past compacted changes: each catch-up says so
            await self._hand_out(changes, revision, with_prev)
        self.revision = revision
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    async def _hand_out(self, changes: list[Change] | None, revision: int, with_prev: bool) -> None:
        """Each synced watcher's share of `changes` (through `revision`), WATCHERS_PER_TURN at a
        time, giving the loop back between them: thousands of watches must not hold the member's
        own work (heartbeats, status, writes) for the whole fan-out. A watcher that joins the synced
        ones meanwhile (a new watch, a catch-up that reached the hub's revision, which is not moved
        yet) is served in the same round: nothing it needs is skipped. A watcher may have joined
        during the read, too: one that wants previous versions the read left out catches up from
        the store (with them), as one that fell behind does."""
        served: set[Watcher] = set()
        in_range: dict[tuple[bytes, bytes | None], list[Change]] = {}  # cut once per range watched
        while pending := [w for w in self._synced if w not in served]:
            for count, watcher in enumerate(pending, 1):
                if watcher in self._synced:  # not removed or demoted while the loop had the turn
                    served.add(watcher)
                    if changes is None or watcher.behind() or (watcher.with_prev and not with_prev):
                        self._demote(watcher)
                    else:
                        span = (watcher.start, watcher.end)
                        cut = in_range.get(span)
                        if cut is None:
                            cut = in_range[span] = [c for c in changes if watcher.covers(c.kv.key)]
                        watcher.take_in_range(cut, revision)
                if count % WATCHERS_PER_TURN == 0:
                    await asyncio.sleep(0)

    def _demote(self, watcher: Watcher) -> None:
        self._synced.discard(watcher)
        self._catch_up(watcher)

    def _catch_up(self, watcher: Watcher) -> None:
        task = asyncio.create_task(self._catching_up(watcher))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _catching_up(self, watcher: Watcher) -> None:
        while not watcher.removed:
            await watcher.room().wait()
            if watcher.removed:
                return
            target = self.revision
            if watcher.next_revision > target:
                self._synced.add(watcher)  # no await since the check: no change slips between
                return
            last = min(target, watcher.next_revision + CATCH_UP_REVISIONS - 1)
            try:
                changes = await asyncio.to_thread(self._fsm.changes, watcher.next_revision, last, watcher.start,
                                                  watcher.end, watcher.with_prev)
            except CompactedError:
                self.remove(watcher)
                watcher.compacted(self._fsm.compacted_revision)
                return
            if not watcher.removed:
                watcher.take(changes, last)
