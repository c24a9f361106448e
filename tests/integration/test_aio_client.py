"""kv.aio.Client on real members: every method through a follower; writes from concurrent tasks
retried across a leader kill and applied once; a watch across a leader kill delivering every
change once, in order; a lease kept alive by its `async with` across a leader kill; an aio Lock
and a sync Lock (and elections) excluding each other on one name. Each test runs its coroutine
with asyncio.run; what blocks (killing, waiting for a leader) runs in a thread, so that the
event loop goes on (renewing leases, reading watches) meanwhile."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import kv.aio
from kv.aio.concurrency import Election as AioElection
from kv.aio.concurrency import Lock as AioLock
from kv.concurrency import Election, Lock
from kv.errors import RaftKVError, RevisionError
from kv.txn import Value, get, put
from raftkv_proto import kv_pb2
from tests.integration.cluster import Cluster, eventually

pytestmark = pytest.mark.integration


def aio_client(cluster: Cluster, node_ids: list[str] | None = None, timeout: float = 10.0) -> kv.aio.Client:
    ids = node_ids if node_ids is not None else list(cluster.nodes)
    return kv.aio.Client([cluster.nodes[i].address for i in ids], timeout=timeout)


async def kill_the_leader(cluster: Cluster, then: Callable[[], object] = lambda: None) -> str:
    """SIGKILL the leader, call `then()`, and wait for the others to elect one; the killed member's id."""
    leader = await asyncio.to_thread(cluster.wait_for_leader)
    await asyncio.to_thread(cluster.kill, leader)
    then()
    await asyncio.to_thread(cluster.wait_for_leader, [n for n in cluster.nodes if n != leader])
    return leader


def test_every_method_through_a_follower(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)

    async def test() -> None:
        async with aio_client(cluster, [follower]) as c:
            assert await c.put("m/a", "1") > 0
            assert await c.get("m/a") == b"1" and await c.get("m/none") is None
            assert await c.batch(puts={"m/b": "2", "m/c": "3"}, deletes=["m/a"]) == [False, False, True]
            assert await c.apply_ops([kv_pb2.Op(put=kv_pb2.KeyValue(key=b"m/d", value=b"4"))]) == [False]
            assert await c.delete("m/d") is True and await c.delete("m/d") is False
            assert await c.scan(prefix="m/") == [(b"m/b", b"2"), (b"m/c", b"3")]
            assert await c.scan(start="m/c", end="m/z", limit=1) == [(b"m/c", b"3")]
            before = await c.revision()
            kv_b = await c.get_kv("m/b")
            assert (kv_b.value, kv_b.version, kv_b.create_revision) == (b"2", 1, kv_b.mod_revision)
            assert await c.compare_and_swap("m/b", "2", "two") is True
            assert await c.compare_and_swap("m/b", "2", "deux") is False
            assert await c.put_if_absent("m/b", "x") is False and await c.put_if_absent("m/e", "5") is True
            result = await c.txn(compare=[Value("m/b") == b"two"], success=[put("m/b", "zwei", prev_kv=True)],
                                 failure=[get("m/b")])
            assert result.succeeded and result.responses[0].value == b"two"
            assert await c.get("m/b", revision=before) == b"2"
            assert await c.scan(prefix="m/", revision=before) == [(b"m/b", b"2"), (b"m/c", b"3")]
            assert await c.scan(prefix="m/", revision=before, keys_only=True) == [(b"m/b", b""), (b"m/c", b"")]
            assert [kv.key for kv in await c.scan_at(before, prefix="m/")] == [b"m/b", b"m/c"]
            newest, read_at = await c.get_range("m/", sort_by="create", descending=True, limit=1)
            assert newest[0].key == b"m/e" and read_at == await c.revision()
            await c.compact(before)
            with pytest.raises(RevisionError, match="compacted"):
                await c.get("m/b", revision=before - 1)
            statuses = await c.status()
            assert [s["id"] for s in statuses] == [follower] and statuses[0]["leader"] == leader
            assert await c.alarm_list() == []

            lease_id, ttl = await c.lease_grant(5)
            assert ttl == 5 and lease_id in await c.leases()
            await c.put("m/leased", "x", lease=lease_id)
            assert await c.lease_keep_alive(lease_id) == 5
            assert (await c.lease_time_to_live(lease_id, keys=True))["keys"] == [b"m/leased"]
            await c.lease_revoke(lease_id)
            assert await c.get("m/leased") is None and await c.lease_keep_alive(lease_id) == 0
            async with c.lease(3) as lease:
                await c.put("m/leased", "y", lease=lease.id)
                assert (await c.get_kv("m/leased")).lease == lease.id
            assert await c.get("m/leased") is None  # leaving the block revoked the lease

            start = await c.revision() + 1
            async with c.watch(prefix="m/", start_revision=start, prev_kv=True) as events:
                await c.put("m/c", "three")
                await c.delete("m/c")
                seen = []
                async for event in events:
                    seen.append((event.type, event.key, event.value, event.prev.value if event.prev else None))
                    if len(seen) == 2:
                        break
            assert seen == [("PUT", b"m/c", b"three", b"3"), ("DELETE", b"m/c", b"", b"three")]
            changes = [(ch.type, ch.key, ch.prev_value) async for ch in c.changes(start, prefix="m/", prev_kv=True)]
            assert changes == [("put", b"m/c", b"3"), ("delete", b"m/c", b"three")]
            assert await c.oldest_revision() == before  # compacted there above

    asyncio.run(test())


def test_writes_from_concurrent_tasks_across_a_leader_kill_are_applied_once(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    workers, after_the_kill = 8, 10  # each writes until the leader was killed, then 10 more
    attempted: list[bytes] = []
    acknowledged: dict[bytes, bytes] = {}
    failed: list[RaftKVError] = []
    killed_once: list[str] = []

    async def test() -> None:
        async with aio_client(cluster, timeout=30.0) as c:
            async def write(worker: int) -> None:
                i, left = 0, after_the_kill
                while left:
                    key, value = b"once/%d/%03d" % (worker, i), b"w%d-%d" % (worker, i)
                    attempted.append(key)
                    try:
                        await c.put(key, value)
                        acknowledged[key] = value
                    except RaftKVError as error:
                        failed.append(error)  # not acknowledged: applied once or not at all
                    i += 1
                    left -= bool(killed_once)
                    await asyncio.sleep(0.02)

            async def kill_midway() -> str:
                await eventually("writes flowing", lambda: len(acknowledged) >= 40)
                return await kill_the_leader(cluster, lambda: killed_once.append("killed"))

            *_, killed = await asyncio.gather(*(write(w) for w in range(workers)), kill_midway())
            cluster.start_node(killed)

    asyncio.run(test())
    assert not failed, failed
    assert len(acknowledged) == len(attempted) >= 40 + workers * after_the_kill  # writes went on across the kill
    sync = cluster.client(timeout=20)
    stored, _ = sync.get_range("once/")
    assert {kv.key: kv.value for kv in stored} == acknowledged
    # One put per key: a put applied twice would have made version 2 (and a later mod revision).
    assert all(kv.version == 1 and kv.mod_revision == kv.create_revision for kv in stored)
    assert len({kv.mod_revision for kv in stored}) == len(stored)


def test_a_watch_across_a_leader_kill_delivers_every_change_once_in_order(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    # The watch reads from the leader (the first endpoint): the kill breaks its stream too.
    order = [leader, *(n for n in cluster.nodes if n != leader)]
    received: list[Any] = []
    acknowledged: list[tuple[bytes, bytes]] = []

    async def test() -> None:
        async with aio_client(cluster, order, timeout=20.0) as watcher, aio_client(cluster, timeout=20.0) as writer:
            start = await writer.revision() + 1
            stop = asyncio.Event()

            async def write() -> None:
                n = 0
                while not stop.is_set():
                    key, value = b"feed/%03d" % (n % 50), b"v%d" % n
                    try:
                        await writer.put(key, value)
                        acknowledged.append((key, value))
                    except RaftKVError:
                        pass  # not acknowledged: may or may not be applied (once at most)
                    n += 1

            async def consume(watch: Any) -> None:
                async for event in watch:
                    received.append(event)

            async with watcher.watch(prefix="feed/", start_revision=start) as watch:
                tasks = [asyncio.create_task(write()), asyncio.create_task(consume(watch))]
                await eventually("events flowing", lambda: len(received) >= 50)
                killed = await kill_the_leader(cluster)
                seen = len(acknowledged)
                await eventually("writes after the kill", lambda: len(acknowledged) >= seen + 100)
                await asyncio.to_thread(cluster.start_node, killed)
                stop.set()
                await tasks[0]
                final = await writer.revision()
                await eventually("the watch delivered everything", lambda: watch.next_revision > final)
            await asyncio.wait_for(tasks[1], 10)  # leaving the block ended the iteration
            revisions = [e.mod_revision for e in received]
            # Only this writer writes under feed/, one revision a put: the watch saw each revision once.
            assert revisions == list(range(start, final + 1))
            assert {e.key: e.value for e in received} == dict(await writer.scan(prefix="feed/", limit=1000))

    asyncio.run(test())
    delivered = [(e.key, e.value) for e in received]
    assert len(set(delivered)) == len(delivered)
    assert set(acknowledged) <= set(delivered)


def test_a_lease_kept_alive_by_its_context_manager_outlives_a_leader_kill(cluster: Cluster) -> None:
    cluster.wait_for_leader()

    async def test() -> None:
        async with aio_client(cluster, timeout=20.0) as c:
            async with c.lease(ttl=3) as lease:
                await c.put("svc/a", "10.0.0.1", lease=lease.id)
                started = time.monotonic()
                await asyncio.sleep(2)
                killed = await kill_the_leader(cluster)
                assert await c.get("svc/a") == b"10.0.0.1"
                await asyncio.to_thread(cluster.start_node, killed)
                while time.monotonic() - started < 10:  # over three TTLs
                    assert await c.get("svc/a") == b"10.0.0.1", f"deleted after {time.monotonic() - started:.1f}s"
                    await asyncio.sleep(0.5)
                assert lease.alive
            assert await c.get("svc/a") is None  # leaving the block revoked it
            assert lease.id not in await c.leases()

    asyncio.run(test())


def test_an_aio_lock_and_a_sync_lock_exclude_each_other(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    sync = cluster.client()
    events: list[tuple[str, float, int]] = []

    def sync_holder(holding: threading.Event) -> None:
        with Lock(sync, "shared", ttl=5) as held:
            events.append(("sync acquired", time.monotonic(), held.revision))
            holding.set()
            time.sleep(1)
            events.append(("sync released", time.monotonic(), held.revision))

    async def test() -> None:
        async with aio_client(cluster) as c:
            async with AioLock(c, "shared", ttl=5) as held:
                events.append(("aio acquired", time.monotonic(), held.revision))
                holding = threading.Event()
                waiter = threading.Thread(target=sync_holder, args=(holding,))
                waiter.start()
                for _ in range(200):  # the sync lock queues behind
                    if len((await c.get_range("shared/"))[0]) == 2:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)
                assert not holding.is_set()
                events.append(("aio released", time.monotonic(), held.revision))
            await asyncio.to_thread(holding.wait, 10)
            # And the other way round: the aio lock waits while the sync one is held.
            async with AioLock(c, "shared", ttl=5) as held:
                events.append(("aio acquired", time.monotonic(), held.revision))
            await asyncio.to_thread(waiter.join, 10)

            # Elections too: a sync leader, an aio campaign that waits for its resignation.
            sync_side = Election(sync, "sched", ttl=5)
            sync_side.campaign(b"sync")
            aio_side = AioElection(c, "sched", ttl=5)
            campaign = asyncio.create_task(aio_side.campaign(b"aio"))
            await asyncio.sleep(1)
            assert not campaign.done() and await aio_side.leader() == b"sync"
            await asyncio.to_thread(sync_side.close)
            await asyncio.wait_for(campaign, 10)
            assert sync_side.leader() == b"aio"
            await aio_side.close()
            assert await aio_side.leader() is None

    asyncio.run(test())
    assert [name for name, _, _ in events] == ["aio acquired", "aio released", "sync acquired", "sync released",
                                                "aio acquired"]
    times = [t for _, t, _ in events]
    assert times == sorted(times)
    revisions = [r for _, _, r in events]
    assert revisions[0] < revisions[2] < revisions[4]  # each hold a later fencing revision


def test_an_aio_election_observes_each_leader_as_it_changes(cluster: Cluster) -> None:
    cluster.wait_for_leader()

    async def test() -> list[bytes]:
        async with aio_client(cluster) as c:
            first, second = AioElection(c, "aobs", ttl=5), AioElection(c, "aobs", ttl=5)
            await first.campaign(b"a")
            seen: list[bytes] = []

            async def observe() -> None:
                async for value in AioElection(c, "aobs", ttl=5).observe():
                    seen.append(value)
                    if len(seen) == 2:
                        return
            observer = asyncio.create_task(observe())
            await eventually("the first leader observed", lambda: seen == [b"a"])
            campaigning = asyncio.create_task(second.campaign(b"b"))
            await first.close()
            await asyncio.wait_for(campaigning, 20)
            await asyncio.wait_for(observer, 20)
            await second.close()
            return seen
    assert asyncio.run(test()) == [b"a", b"b"]


def test_members_listed_added_and_removed_and_leadership_moved_by_an_aio_client(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    target = next(n for n in cluster.nodes if n != leader)

    async def test() -> None:
        async with aio_client(cluster) as c:
            assert {(m["id"], m["learner"]) for m in await c.member_list()} == {("n1", False), ("n2", False),
                                                                                 ("n3", False)}
            added = await c.member_add("n9", "127.0.0.1:1", learner=True)  # never started: a learner costs nothing
            assert (added["id"], added["learner"], added["peer_address"]) == ("n9", True, "127.0.0.1:1")
            assert [m["id"] for m in await c.member_remove("n9")] == ["n1", "n2", "n3"]
            assert await c.move_leader(target) == target

    asyncio.run(test())
    assert cluster.wait_for_leader() == target
