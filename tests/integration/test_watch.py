"""Watches on real members: etcd's Watch protocol (created before events, ids, cancel, progress,
filters, prev_kv, compaction) and kv.Client.watch delivering every committed write exactly once, in
revision order, while leaders are SIGKILLed and a follower is paused."""
from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from kv.errors import RaftKVError, RevisionError
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration


class RawWatch:
    """One etcd Watch stream, driven request by request."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        self._call = etcd_rpc_pb2_grpc.WatchStub(channel).Watch(iter(self._requests.get, None))
        self._responses = iter(self._call)

    def send(self, **request: object) -> None:
        self._requests.put(pb.WatchRequest(**request))  # type: ignore[arg-type]

    def next(self) -> pb.WatchResponse:
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


def test_the_watch_protocol_as_etcd_speaks_it(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    c = cluster.client()
    c.put("w/a", "1")
    first = c.revision()
    c.put("w/a", "2")
    c.delete("w/a")
    c.put("w/b", "x")
    on_follower = cluster.client([follower])
    wait_until("the follower applied every write",
               lambda: on_follower.get_kv("w/b", consistency="stale") is not None or None)
    stream = RawWatch(cluster._channel(follower))  # a follower serves watches from its own state
    try:
        # From a past revision, with the versions they replaced, no deletes.
        stream.send(create_request=pb.WatchCreateRequest(key=b"w/", range_end=b"w0", start_revision=first,
                                                         prev_kv=True, filters=[pb.WatchCreateRequest.NODELETE]))
        created = stream.next()
        assert (created.created, created.watch_id, created.canceled) == (True, 0, False)
        events: list = []
        while len(events) < 3:
            response = stream.next()
            assert response.watch_id == 0 and not response.canceled
            events += response.events
        assert [(e.kv.key, e.kv.value, e.kv.mod_revision) for e in events] == \
            [(b"w/a", b"1", first), (b"w/a", b"2", first + 1), (b"w/b", b"x", first + 3)]
        assert not events[0].HasField("prev_kv")  # a creation has none
        assert events[1].prev_kv.value == b"1"
        # A second watch gets the next id; a live put reaches both; a cancel ends one.
        stream.send(create_request=pb.WatchCreateRequest(key=b"w/c"))
        assert (stream.next().watch_id, True) == (1, True)
        c.put("w/c", "live")
        seen = {}
        while len(seen) < 2:
            response = stream.next()
            seen[response.watch_id] = [(e.kv.key, e.kv.value) for e in response.events]
        assert seen == {0: [(b"w/c", b"live")], 1: [(b"w/c", b"live")]}
        stream.send(cancel_request=pb.WatchCancelRequest(watch_id=1))
        cancelled = stream.next()
        assert (cancelled.watch_id, cancelled.canceled) == (1, True)
        stream.send(progress_request=pb.WatchProgressRequest())
        progress = stream.next()
        assert progress.watch_id == -1 and progress.header.revision >= first + 4 and not progress.events
        # A watch from a compacted revision is created, then cancelled with the compacted revision.
        c.compact(first + 2)
        wait_until("the follower applied the compaction",
                   lambda: _refused(lambda: on_follower.get_kv("w/a", revision=first, consistency="stale")) or None)
        stream.send(create_request=pb.WatchCreateRequest(key=b"w/a", start_revision=first))
        assert stream.next().created
        gone = stream.next()
        assert gone.canceled and gone.compact_revision == first + 2
    finally:
        stream.close()


def _refused(read) -> bool:  # type: ignore[no-untyped-def]
    try:
        read()
    except RevisionError:
        return True
    return False


def test_a_watch_gets_every_committed_write_once_in_order_across_leader_kills(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    writer = cluster.client(timeout=20)
    start = writer.revision() + 1
    acknowledged: list[tuple[bytes, bytes]] = []
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            key, value = b"feed/%03d" % (n % 50), b"v%d" % n
            try:
                writer.put(key, value)
                acknowledged.append((key, value))
            except RaftKVError:
                pass  # not acknowledged: may or may not be applied (once at most)
            n += 1

    received: list = []
    watcher = cluster.client(timeout=20)
    watch = watcher.watch(prefix="feed/", start_revision=start)

    def consume() -> None:
        for event in watch:
            received.append(event)

    threads = [threading.Thread(target=write), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(2):
            wait_until("writes flowing", lambda: len(acknowledged) > 20 + len(received) // 4 or None, timeout=30)
            leader = cluster.wait_for_leader()
            cluster.kill(leader)
            cluster.wait_for_leader(among=[n for n in cluster.nodes if n != leader])
            cluster.start_node(leader)
        follower = next(n for n in cluster.nodes if n != cluster.wait_for_leader())
        cluster.pause(follower)
        time.sleep(1.0)  # writes go on against the two others while this member is stopped
        cluster.resume(follower)
        wait_until("more writes after the resume", lambda: len(acknowledged) > 300 or None, timeout=60)
    finally:
        stop.set()
        threads[0].join()
    final = writer.revision()
    wait_until("the watch delivered everything", lambda: watch.next_revision > final or None, timeout=60)
    watch.close()
    threads[1].join(10)
    revisions = [e.mod_revision for e in received]
    # Only this writer writes under feed/, one revision a put: the watch saw each revision once.
    assert revisions == list(range(start, final + 1))
    delivered = [(e.key, e.value) for e in received]
    assert len(set(delivered)) == len(delivered)
    assert set(acknowledged) <= set(delivered)
    assert {e.key: e.value for e in received} == dict(writer.scan(prefix="feed/", limit=1000))


def test_a_watch_from_a_compacted_revision_raises(cluster: Cluster) -> None:
    c = cluster.client([cluster.wait_for_leader()])  # the member that applied the compaction when it answered
    c.put("old", "1")
    c.put("old", "2")
    c.compact(c.revision())
    with c.watch(key="old", start_revision=1) as watch, pytest.raises(RevisionError, match="compacted"):
        next(iter(watch))


def test_an_idle_watch_stream_survives_a_client_that_pings_every_half_second(cluster: Cluster) -> None:
    """etcd's clients ping long streams every few seconds; grpc's default server policy answers
    pings more frequent than every 5 minutes with GOAWAY "too_many_pings". The node accepts them."""
    cluster.wait_for_leader()
    node = next(iter(cluster.nodes))
    channel = grpc.insecure_channel(cluster.nodes[node].address, options=[
        ("grpc.keepalive_time_ms", 500), ("grpc.keepalive_timeout_ms", 2000),
        ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)])
    stream = RawWatch(channel)
    try:
        stream.send(create_request=pb.WatchCreateRequest(key=b"idle"))
        assert stream.next().created
        time.sleep(6)  # idle: only pings travel (a dozen, where grpc's default allows one in 5 minutes)
        cluster.client().put("idle", "at last")
        event = stream.next().events[0]
        assert (event.kv.key, event.kv.value) == (b"idle", b"at last")
    finally:
        stream.close()
        channel.close()
