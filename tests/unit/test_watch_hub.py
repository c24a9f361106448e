"""The watch hub (kv/server/watch_hub.py) against a fake node and store: what is applied while it
reads is not held back, a watcher never goes back to revisions it was given, and one that wants
previous versions never gets changes read without them."""
from __future__ import annotations

import asyncio

from kv.server.watch_hub import WATCHERS_PER_TURN, Watcher, WatchHub
from statemachine.key_record import KeyVersion
from statemachine.mvcc import Change
from tests.integration.cluster import eventually


class FakeNode:
    def __init__(self) -> None:
        self.applied_index = 0
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []

    def wait_applied(self, index: int) -> asyncio.Future[int]:
        future = asyncio.get_running_loop().create_future()
        if self.applied_index >= index:
            future.set_result(self.applied_index)
        else:
            self._waiters.append((index, future))
        return future

    def apply(self) -> None:
        self.applied_index += 1
        for index, future in list(self._waiters):
            if index <= self.applied_index and not future.done():
                future.set_result(self.applied_index)


class FakeStore:
    """Revision r holds one put of key b"k" with value str(r); `during_read` runs inside a read."""

    def __init__(self) -> None:
        self.revision = 1
        self.compacted_revision = 0
        self.during_read = None

    def changes(self, first, last, start=b"", end=None, with_prev=False):  # type: ignore[no-untyped-def]
        if self.during_read is not None:
            self.during_read()
            self.during_read = None
        return [Change(KeyVersion(b"k", b"%d" % r, 2, r, r - 1),
                       KeyVersion(b"k", b"%d" % (r - 1), 2, r - 1, r - 2) if with_prev else None)
                for r in range(first, last + 1)]


def watcher(start: int, got: list[int], with_prev: bool = False, prevs: list[bool] | None = None) -> Watcher:
    """A watcher of key b"k" that notes the revisions it is handed in `got`, and in `prevs` whether
    each came with its previous version."""
    room = asyncio.Event()
    room.set()

    def deliver(changes: list[Change], _: int) -> None:
        got.extend(c.kv.mod_revision for c in changes)
        if prevs is not None:
            prevs.extend(c.prev is not None for c in changes)
    return Watcher(b"k", b"k\0", start, with_prev, deliver=deliver, compacted=lambda _: None,
                   behind=lambda: False, room=lambda: room)


def test_a_change_applied_while_the_hub_reads_is_delivered_without_another_apply() -> None:
    async def run() -> list[int]:
        node, store, got = FakeNode(), FakeStore(), []
        hub = WatchHub(node, store)  # type: ignore[arg-type]
        hub.start()
        hub.add(watcher(2, got))
        loop = asyncio.get_running_loop()

        def applied_meanwhile() -> None:  # in the reading thread: the node applies revision 3
            store.revision = 3
            loop.call_soon_threadsafe(node.apply)

        store.revision = 2
        store.during_read = applied_meanwhile
        node.apply()
        await eventually("revisions 2 and 3", lambda: got == [2, 3])
        await hub.stop()
        return got
    assert asyncio.run(run()) == [2, 3]


def test_a_watcher_is_never_handed_revisions_below_those_it_was_given() -> None:
    got: list[int] = []
    w = watcher(10, got)
    w.take([Change(KeyVersion(b"k", b"x", 2, r, 1)) for r in range(5, 12)], 11)
    assert got == [10, 11] and w.next_revision == 12
    w.take([Change(KeyVersion(b"k", b"x", 2, r, 1)) for r in range(8, 10)], 9)  # a member behind it
    assert got == [10, 11] and w.next_revision == 12


def test_a_watcher_wanting_previous_versions_added_while_the_hub_reads_without_them_gets_them() -> None:
    """The hub reads the new changes with previous versions only when a synced watcher wants them.
    A prev_kv watcher that joins the synced ones while such a read is under way must not be handed
    its result: it catches up from the store instead, previous versions included."""
    async def run() -> tuple[list[int], list[bool]]:
        node, store = FakeNode(), FakeStore()
        hub = WatchHub(node, store)  # type: ignore[arg-type]
        hub.start()
        hub.add(watcher(2, []))  # a synced watcher without prev_kv: the hub's reads leave them out
        got: list[int] = []
        prevs: list[bool] = []
        loop = asyncio.get_running_loop()
        store.during_read = lambda: loop.call_soon_threadsafe(hub.add, watcher(2, got, True, prevs))
        store.revision = 3
        node.apply()
        await eventually("the prev_kv watcher's revisions 2 and 3", lambda: got == [2, 3])
        await hub.stop()
        return got, prevs
    assert asyncio.run(run()) == ([2, 3], [True, True])


def test_the_fan_out_gives_the_loop_back_and_serves_a_watcher_that_joins_meanwhile() -> None:
    """Thousands of synced watchers are handed a revision a batch at a time: work queued on the
    member's loop once the fan-out has started (a heartbeat, a status call) runs before it ends,
    and a watcher that joins meanwhile still gets the revision."""
    async def run() -> tuple[int, list[int]]:
        node, store = FakeNode(), FakeStore()
        hub = WatchHub(node, store)  # type: ignore[arg-type]
        hub.start()
        loop = asyncio.get_running_loop()
        got: list[list[int]] = [[] for _ in range(4 * WATCHERS_PER_TURN)]
        joined: list[int] = []
        seen: list[int] = []

        def member_work() -> None:
            seen.append(sum(1 for revisions in got if revisions))
            hub.add(watcher(2, joined))

        for revisions in got:
            w = watcher(2, revisions)
            handed = w.deliver

            def deliver(changes: list[Change], revision: int, handed=handed) -> None:  # type: ignore[no-untyped-def]
                if not seen and not any(got):  # the fan-out's first hand-over: the member has work
                    loop.call_soon(member_work)
                handed(changes, revision)
            w.deliver = deliver
            hub.add(w)
        store.revision = 2
        node.apply()
        await eventually("every watcher's revision 2", lambda: all(r == [2] for r in got) and joined == [2])
        await hub.stop()
        return seen[0], joined
    served_first, joined = asyncio.run(run())
    assert served_first < 4 * WATCHERS_PER_TURN  # the member's work did not wait for the whole fan-out
    assert joined == [2]
