"""One client never costs the cluster, tried through etcd's API on three real members: large lists
answered, lists too large refused before they are built, and a member fanning out a busy prefix to
thousands of watches keeps answering its own calls. After each attack the leader and its term are
unchanged, every member answers, and the attacked member's own memory (RssAnon: member_memory.py)
grew less than a bound each test justifies.

What was seen before: 8 Ranges of 200,000 keys of 1 KiB grew the leader to 2.9 GB and cost it its
leadership before gRPC refused each built reply; at 20,000 keys 5 of 8 failed; 500 streams x 10
watches on a follower kept its Status waiting 4.2 s while it sent 200 puts' events."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from kv.server.reply_budget import REPLY_BUDGET_BYTES
from kv.server.server_group import MAX_SEND_BYTES
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import FAST_TIMING, STEADY_TIMING, Cluster
from tests.integration.member_memory import AnonPeak

pytestmark = pytest.mark.integration

VALUE = b"v" * 1024
MIB = 1 << 20
EVERYTHING = pb.RangeRequest(key=b"\0", range_end=b"\0")
# As etcd's clients: no limit of their own on what they receive (clientv3: math.MaxInt32).
RECEIVE_ANY = [("grpc.max_receive_message_length", -1)]


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    cluster = make_cluster(3, extra_args=STEADY_TIMING)
    cluster.wait_for_leader()
    return cluster


def load(cluster: Cluster, keys: int, prefix: bytes = b"key/") -> None:
    """`keys` keys of 1 KiB, applied on every member."""
    with cluster.client() as client:
        for first in range(0, keys, 1000):
            client.batch(puts={prefix + b"%06d" % i: VALUE for i in range(first, min(keys, first + 1000))})
    leader = cluster.wait_for_leader()
    commit = cluster.status(leader)["commit_index"]
    for node in cluster.nodes:
        cluster.wait_applied(node, commit)


def concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call's result, or the grpc.RpcError it raised; all started together."""
    def outcome(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except grpc.RpcError as e:
            return e
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(outcome, calls))


@contextmanager
def kv_stub(cluster: Cluster, node: str) -> Iterator[etcd_rpc_pb2_grpc.KVStub]:
    with grpc.insecure_channel(cluster.nodes[node].address, options=RECEIVE_ANY) as channel:
        yield etcd_rpc_pb2_grpc.KVStub(channel)


def unchanged(cluster: Cluster, leader: str, term: int) -> None:
    """The leader and its term as before, every member answering and following it."""
    for node, status in cluster.statuses().items():
        assert "error" not in status, (node, status)
        assert (status["leader"], status["term"]) == (leader, term), (node, status)


def ranges(cluster: Cluster, request: pb.RangeRequest, via: list[str]) -> list[Any]:
    """One Range per member named in `via`, all at once, each on a channel of its own."""
    channels = [grpc.insecure_channel(cluster.nodes[node].address, options=RECEIVE_ANY) for node in via]
    try:
        stubs = [etcd_rpc_pb2_grpc.KVStub(channel) for channel in channels]
        return concurrently([lambda stub=stub: stub.Range(request, timeout=60) for stub in stubs])
    finally:
        for channel in channels:
            channel.close()


def test_eight_concurrent_lists_of_20000_keys_are_all_answered(cluster: Cluster) -> None:
    """The issue's Kubernetes-style LIST at its own size: 8 Ranges of 20,000 keys of 1 KiB (about
    21 MB each), half to the leader, half through the followers (forwarded to it)."""
    load(cluster, 20_000)
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    followers = [n for n in cluster.nodes if n != leader]
    with AnonPeak(cluster.nodes[leader].process.pid) as memory:
        answers = ranges(cluster, EVERYTHING, [leader] * 4 + followers * 2)
    for answer in answers:
        assert isinstance(answer, pb.RangeResponse), answer
        assert answer.count == len(answer.kvs) == 20_000 and not answer.more
        assert answer.kvs[0].value == VALUE
    unchanged(cluster, leader, term)
    # The leader builds every reply and holds at most REPLY_BUDGET_BYTES of them at once (here all
    # 8, 168 MB), each costing about twice its size (message, then bytes), and 64 MiB for the rest:
    # 400 MiB (about 180 MiB measured). Unbounded, 8 lists of 200,000 keys grew it by 2.9 GB.
    in_flight = min(REPLY_BUDGET_BYTES, 8 * 20_000 * (len(VALUE) + 30))
    assert memory.growth_mib < 2 * in_flight / MIB + 64, memory.growth_mib


def test_one_range_deletion_of_120000_keys_keeps_the_leader(make_cluster: Callable[..., Cluster]) -> None:
    """One DeleteRange over 120,000 keys, with elections at 500 ms: every member spends seconds
    applying it (1.8 s measured on the leader). It was applied on each member's event loop (one
    small entry), which held the leader's heartbeats: the followers stood and a new leader was
    elected in a new term. Now it runs on the apply thread while heartbeats and their answers
    leave (docs/decisions/0074-heartbeats-beside-the-apply.md): same leader, same term."""
    cluster = make_cluster(3, extra_args=FAST_TIMING)
    keys = 120_000
    with cluster.client() as client:
        for first in range(0, keys, 1000):
            client.batch(puts={b"del/%06d" % i: b"v" for i in range(first, min(keys, first + 1000))})
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    with kv_stub(cluster, leader) as kv:
        deleted = kv.DeleteRange(pb.DeleteRangeRequest(key=b"del/", range_end=b"del0"), timeout=60)
    assert deleted.deleted == keys
    for node in cluster.nodes:
        cluster.wait_applied(node, cluster.status(leader)["commit_index"])
        with kv_stub(cluster, node) as kv:
            left = kv.Range(pb.RangeRequest(key=b"del/", range_end=b"del0", count_only=True, serializable=True))
        assert left.count == 0, node
    unchanged(cluster, leader, term)


def test_a_list_over_the_send_limit_is_refused_before_it_is_built(cluster: Cluster) -> None:
    """A store of about 68 MB (66,000 keys of 1 KiB: the smallest over the 64 MiB a member sends):
    8 Ranges of all of it, to the leader and through a follower, are each refused as gRPC refuses
    a message over its limit, with no reply built; a Range with a limit pages through it, and a
    read-only Txn whose ranges fit one by one but not together is refused as one reply."""
    keys = 66_000
    load(cluster, keys)
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    follower = next(n for n in cluster.nodes if n != leader)
    with AnonPeak(cluster.nodes[leader].process.pid) as memory:
        answers = ranges(cluster, EVERYTHING, [leader] * 4 + [follower] * 4)
    for answer in answers:
        assert isinstance(answer, grpc.RpcError), answer
        assert answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        message = answer.details()
        assert message.startswith("grpc: trying to send message larger than max (") and \
            message.endswith(f" vs. {MAX_SEND_BYTES})"), message
        assert int(message.split("(")[1].split(" ")[0]) > keys * len(VALUE)  # the whole reply's size
    # One reply built would be its values (68 MB) and its message (68 MB) at least; refused on
    # its measure, it holds no key and reads no value (about 0.3 MiB measured).
    assert memory.growth_mib < 32, memory.growth_mib

    with kv_stub(cluster, follower) as stub:
        page = stub.Range(pb.RangeRequest(key=b"\0", range_end=b"\0", limit=500), timeout=30)
        assert (page.count, len(page.kvs), page.more) == (keys, 500, True)
        half = b"key/%06d" % (keys // 2)
        halves = pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=b"key/", range_end=half)),
                                        pb.RequestOp(request_range=pb.RangeRequest(key=half, range_end=b"key0"))])
        with pytest.raises(grpc.RpcError) as refused:
            stub.Txn(halves, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        one_half = stub.Txn(pb.TxnRequest(success=halves.success[:1]), timeout=30)
        assert len(one_half.responses[0].response_range.kvs) == keys // 2
    unchanged(cluster, leader, term)


# The fan-out, at its own size: it runs in about 10 s on two cores.
STREAMS, WATCHES, PUTS = 500, 10, 200
# The member's own Status: 4.2-4.7 s before the fix, at most 0.33 s after (0.3 s with two other
# test runs on the machine's two cores).
ANSWER_WITHIN_S = 2.0
# A put and a get through it cross to the leader twice and commit through the log, so they wait on
# the whole machine too: 7.4 s before the fix, at most 0.8 s after, 2.7 s with two other test runs
# on the machine.
PUT_GET_WITHIN_S = 5.0


def test_a_member_fanning_out_watch_events_keeps_answering_its_own_calls(cluster: Cluster) -> None:
    """500 streams x 10 watches of one prefix on a follower, then 200 puts on it (a million events
    to send): while it sends them, its Status is answered within ANSWER_WITHIN_S and a put and a
    get through it within PUT_GET_WITHIN_S, and every watch gets every event."""
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    follower = next(n for n in cluster.nodes if n != leader)
    address = cluster.nodes[follower].address
    watchers = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.fan_out_watchers", address, str(STREAMS), str(WATCHES), "p/",
         str(PUTS)], stdout=subprocess.PIPE, text=True)
    try:
        assert watchers.stdout is not None
        assert watchers.stdout.readline().strip() == "ready"
        with grpc.insecure_channel(address) as channel, AnonPeak(cluster.nodes[follower].process.pid) as memory:
            probe = _Probe(etcd_rpc_pb2_grpc.MaintenanceStub(channel), etcd_rpc_pb2_grpc.KVStub(channel))
            probing = threading.Thread(target=probe.run)
            probing.start()
            try:
                with kv_stub(cluster, leader) as stub:
                    for i in range(PUTS):
                        stub.Put(pb.PutRequest(key=b"p/%04d" % i, value=b"v" * 100), timeout=10)
                outcome = watchers.stdout.readline().split()
            finally:
                probe.stop.set()
                probing.join()
        assert outcome == ["done", str(STREAMS * WATCHES * PUTS)], outcome
    finally:
        watchers.kill()
        watchers.wait()
    assert probe.error is None, probe.error
    # The probe ran from before the first put until the last event was received: every call it
    # made meanwhile is in `slowest` (a round that was under way at the end counts too).
    assert probe.rounds >= 1, probe.rounds
    assert probe.slowest["status"] < ANSWER_WITHIN_S and probe.slowest["put+get"] < PUT_GET_WITHIN_S, probe.slowest
    unchanged(cluster, leader, term)
    # The encoded events are shared by every watch (EventEncoder): a queued response holds
    # references to them, 8 bytes an event, 8 MB for all million; the responses built from them
    # are sent as they are built. 128 MiB leaves room for gRPC's buffers (about 35 MiB measured).
    assert memory.growth_mib < 128, memory.growth_mib


class _Probe:
    """Status, then a put and a get, through the fanning-out member, over and over until `stop`:
    the slowest of each, on this process's clock (the watching client runs in a process of its
    own)."""

    def __init__(self, maintenance: etcd_rpc_pb2_grpc.MaintenanceStub, kv: etcd_rpc_pb2_grpc.KVStub) -> None:
        self._maintenance = maintenance
        self._kv = kv
        self.stop = threading.Event()
        self.slowest = {"status": 0.0, "put+get": 0.0}
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._timed("status", lambda: self._maintenance.Status(pb.StatusRequest(), timeout=ANSWER_WITHIN_S))
                self._timed("put+get", self._put_and_get)
                self.rounds += 1
                self.stop.wait(0.02)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def _put_and_get(self) -> None:
        self._kv.Put(pb.PutRequest(key=b"probe", value=b"%d" % self.rounds), timeout=PUT_GET_WITHIN_S)
        got = self._kv.Range(pb.RangeRequest(key=b"probe"), timeout=PUT_GET_WITHIN_S)
        assert got.kvs[0].value == b"%d" % self.rounds

    def _timed(self, what: str, call: Callable[[], object]) -> None:
        started = time.monotonic()
        call()
        self.slowest[what] = max(self.slowest[what], time.monotonic() - started)
