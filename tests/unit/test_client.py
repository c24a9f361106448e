"""kv.Client against real gRPC servers on 127.0.0.1 whose KV servicer follows a script. Tests of
put, get and delete run twice: on the client's request streams and on unary calls."""
from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from kv import Client
from kv.client.client import batch_request, paged_scan
from raftkv_proto.key_ranges import prefix_end
from kv.errors import (
    InvalidArgumentError,
    NotLeaderError,
    RaftKVError,
    TimeoutError,
    UnavailableError,
    UnknownSessionError,
    from_rpc_error,
    stream_error,
)
from kv.client.request_pipeline import MAX_BYTES_PER_MESSAGE, PipelineHub, fits, outgoing_messages
from raftkv_proto.request_limits import MIN_MAX_REQUEST_BYTES, REQUEST_OVERHEAD_BYTES
from kv.client import stream_call
from kv.client.stream_call import CallEnded
from kv.client.request_stream import MAX_STREAMS_PER_NODE, StreamPool
from raftkv_proto import kv_pb2, kv_pb2_grpc
from kv.tools.cluster_up import free_ports

Handler = Callable[[Any, grpc.ServicerContext], Any]


def free_address() -> str:
    """An address nothing listens on: a port free a moment ago, reserved against other suites
    (free_ports) and below the kernel's ephemeral range, where no connection's local end lands."""
    return f"127.0.0.1:{free_ports(1)[0]}"


def refuse(context: grpc.ServicerContext, error: RaftKVError) -> None:
    """Abort the call the way the real server does (kv.errors.abort, sync flavour)."""
    context.set_trailing_metadata(error.metadata())
    context.abort(error.code, str(error))


@dataclass
class _StreamMessageContext:
    """What a scripted handler is given for one message on KV.Stream: its abort becomes the
    message's error reply, converted as the real server converts a refusal."""

    metadata: tuple[tuple[str, str], ...] = ()

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise CallEnded(code, details, self.metadata)  # an RpcError with the status's parts


@dataclass
class ScriptedKV(kv_pb2_grpc.KVServicer):
    """A KV servicer whose answers are set per method by the test; it records every request.
    Without a script it behaves as a tiny in-memory store."""

    node_id: str = "n1"
    script: dict[str, Handler] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    data: dict[bytes, bytes] = field(default_factory=dict)
    index: int = 0
    registered: int = 0  # client sessions issued
    streams_opened: int = 0
    pipelines_opened: int = 0
    pipeline_messages: list[int] = field(default_factory=list)  # requests per message

    def _run(self, method: str, request: Any, context: grpc.ServicerContext, default: Handler) -> Any:
        self.calls.append((method, request))
        return self.script.get(method, default)(request, context)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def requests(self, method: str) -> list[Any]:
        return [r for m, r in self.calls if m == method]

    def _commit(self) -> int:
        self.index += 1
        return self.index

    def Put(self, request, context):
        def store(req, ctx):
            self.data[req.key] = req.value
            return kv_pb2.PutResponse(index=self._commit())
        return self._run("Put", request, context, store)

    def RegisterClient(self, request, context):
        def register(req, ctx):
            self.registered += 1
            return kv_pb2.RegisterClientResponse(client_id=f"{self.registered}.{self.registered:032x}",
                                                 index=self.registered)
        return self._run("RegisterClient", request, context, register)

    def Get(self, request, context):
        def load(req, ctx):
            found = req.key in self.data
            return kv_pb2.GetResponse(found=found, value=self.data.get(req.key, b""), index=self.index)
        return self._run("Get", request, context, load)

    def Delete(self, request, context):
        def remove(req, ctx):
            return kv_pb2.DeleteResponse(existed=self.data.pop(req.key, None) is not None, index=self._commit())
        return self._run("Delete", request, context, remove)

    def Scan(self, request, context):
        def scan(req, ctx):
            keys = sorted(k for k in self.data if k >= req.start and (not req.end or k < req.end))
            page = keys[: min(req.limit or 100, 2)]  # pages of two, so the client must continue
            items = [kv_pb2.KeyValue(key=k, value=self.data[k]) for k in page]
            return kv_pb2.ScanResponse(items=items, more=len(keys) > len(page), index=self.index)
        return self._run("Scan", request, context, scan)

    def Batch(self, request, context):
        def apply(req, ctx):
            existed = []
            for op in req.ops:
                if op.WhichOneof("op") == "put":
                    existed.append(op.put.key in self.data)
                    self.data[op.put.key] = op.put.value
                else:
                    existed.append(self.data.pop(op.delete, None) is not None)
            return kv_pb2.BatchResponse(index=self._commit(), existed=existed)
        return self._run("Batch", request, context, apply)

    def Status(self, request, context):
        def status(req, ctx):
            return kv_pb2.StatusResponse(id=self.node_id, role="leader", term=3, leader=self.node_id,
                                         commit_index=self.index, applied_index=self.index,
                                         peers={self.node_id: self.index})
        return self._run("Status", request, context, status)

    def Stream(self, requests, context):
        """Each message answered by the scripted Put, Get or Delete, in order."""
        self.streams_opened += 1
        for request in requests:
            yield self._stream_answer(request)

    def Pipeline(self, requests, context):
        """Each message's requests answered by the scripted Put, Get or Delete, in one message
        and in reverse order (a client must match replies by tag). A "Pipeline" script sees each
        message first and may abort the call."""
        self.pipelines_opened += 1
        for message in requests:
            self.pipeline_messages.append(len(message.requests))
            self.script.get("Pipeline", lambda m, c: None)(message, context)
            yield kv_pb2.PipelineReply(replies=[kv_pb2.TaggedReply(tag=t.tag, reply=self._stream_answer(t.request))
                                                for t in reversed(message.requests)])

    def _stream_answer(self, request: kv_pb2.StreamRequest) -> kv_pb2.StreamReply:
        kind = request.WhichOneof("request")
        try:
            reply = getattr(self, kind.capitalize())(getattr(request, kind), _StreamMessageContext())
        except CallEnded as aborted:
            return kv_pb2.StreamReply(error=stream_error(from_rpc_error(aborted)))
        return kv_pb2.StreamReply(**{kind: reply})


@dataclass
class Node:
    address: str
    kv: ScriptedKV
    server: grpc.Server


@pytest.fixture
def start_node() -> Iterator[Callable[..., Node]]:
    servers: list[grpc.Server] = []

    def start(node_id: str = "n1", kind: type[ScriptedKV] = ScriptedKV) -> Node:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        servicer = kind(node_id=node_id)
        kv_pb2_grpc.add_KVServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return Node(f"127.0.0.1:{port}", servicer, server)

    yield start
    for server in servers:
        server.stop(grace=None)


@pytest.fixture(params=["inline", "queued"])
def stream_kind(request, monkeypatch) -> str:
    """Which StreamCall the client's request streams run on (kv/client/stream_call.py): driven by the
    caller's thread, or gRPC's public API (the fallback)."""
    monkeypatch.setattr(stream_call, "_inline_works", request.param == "inline")
    return request.param


@pytest.fixture(params=["inline-stream", "queued-stream", "unary"])
def streams(request, monkeypatch) -> bool:
    """Whether the client sends put, get and delete on request streams (and which kind)."""
    monkeypatch.setattr(stream_call, "_inline_works", request.param == "inline-stream")
    return request.param != "unary"


def not_leader(leader: Node | None) -> Handler:
    def answer(request, context):
        if leader is None:
            refuse(context, NotLeaderError())
        else:
            refuse(context, NotLeaderError(leader.kv.node_id, leader.address))
    return answer


def fail_times(n: int, error: RaftKVError, then: Handler) -> Handler:
    """Refuse the first n calls with `error`, then answer with `then`."""
    left = [n]

    def answer(request, context):
        if left[0] > 0:
            left[0] -= 1
            refuse(context, error)
        return then(request, context)
    return answer


def test_follows_not_leader_hint_and_remembers_the_leader(start_node, streams):
    leader, follower = start_node("n2"), start_node("n1")
    follower.kv.script["Put"] = not_leader(leader)
    with Client([follower.address], timeout=2.0, streams=streams) as client:
        assert client.put(b"k", b"v") == 1
        assert client.put(b"k", b"w") == 2
    assert follower.kv.count("Put") == 1  # the second write went straight to the leader
    assert leader.kv.data == {b"k": b"w"}


def test_not_leader_without_hint_tries_the_next_endpoint(start_node, streams):
    electing, leader = start_node("n1"), start_node("n2")
    electing.kv.script["Get"] = not_leader(None)
    leader.kv.data[b"k"] = b"v"
    with Client([electing.address, leader.address], timeout=2.0, streams=streams) as client:
        assert client.get("k") == b"v"
    assert electing.kv.count("Get") == 1


def test_skips_an_endpoint_that_is_down(start_node, streams):
    node = start_node()
    with Client([free_address(), node.address], timeout=2.0, streams=streams) as client:
        assert client.put("a", "1") == 1
        assert client.get("a") == b"1"


def test_server_down_gives_unavailable_after_the_timeout(streams):
    with Client([free_address()], timeout=0.5, streams=streams) as client:
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            client.put("k", "v")
        elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 10  # it kept retrying for (about) the whole timeout, and stopped


def test_retries_keep_the_write_header(start_node, streams):
    node = start_node()
    node.kv.script["Put"] = fail_times(2, UnavailableError("starting"), lambda req, ctx: kv_pb2.PutResponse(index=9))
    with Client([node.address], timeout=2.0, client_id="me", streams=streams) as client:
        assert client.put("k", "v") == 9
        client.delete("k")
    (registration,) = node.kv.requests("RegisterClient")
    assert registration.name == "me"  # the client's name; the id is the cluster's
    puts = node.kv.requests("Put")
    assert len(puts) == 3
    assert {(p.header.client_id, p.header.seq) for p in puts} == {(f"1.{1:032x}", 1)}
    (delete,) = node.kv.requests("Delete")
    assert delete.header.client_id == f"1.{1:032x}"
    assert delete.header.seq == puts[0].header.seq + 1  # a new write, a new sequence


def expire_sessions(kv: ScriptedKV, refusals: list[RaftKVError]) -> Handler:
    """A Put handler that answers with `refusals` in turn, then stores; once it has refused with
    UNKNOWN_SESSION it refuses every later write in that session too, as the cluster does."""
    expired: set[str] = set()

    def answer(request, context):
        if request.header.client_id in expired:
            refuse(context, UnknownSessionError("gone"))
        if refusals:
            error = refusals.pop(0)
            if isinstance(error, UnknownSessionError):
                expired.add(request.header.client_id)
            refuse(context, error)
        kv.data[request.key] = request.value
        return kv_pb2.PutResponse(index=kv._commit())
    return answer


def test_a_write_refused_for_an_expired_session_is_sent_again_in_a_new_one(start_node, streams):
    """The first attempt was refused before anything of it was applied: a new session and the
    same write again are safe, and the caller sees only the success."""
    node = start_node()
    node.kv.script["Put"] = expire_sessions(node.kv, [UnknownSessionError("gone")])
    with Client([node.address], timeout=2.0, streams=streams) as client:
        assert client.put("k", "v") == 1
        client.put("k", "w")
    assert node.kv.count("RegisterClient") == 2
    headers = [(p.header.client_id, p.header.seq) for p in node.kv.requests("Put")]
    assert headers == [(f"1.{1:032x}", 1), (f"2.{2:032x}", 1), (f"2.{2:032x}", 2)]
    assert node.kv.data[b"k"] == b"w"


def test_an_expired_session_met_by_a_retry_is_an_unknown_outcome(start_node, streams):
    """An earlier attempt may have been applied before the session expired; a new session could
    apply the write a second time, so the client says the outcome is unknown instead."""
    node = start_node()
    node.kv.script["Put"] = expire_sessions(node.kv, [UnavailableError("lost"), UnknownSessionError("gone")])
    with Client([node.address], timeout=2.0, streams=streams) as client:
        with pytest.raises(UnknownSessionError, match="outcome is\\s+unknown"):
            client.put("k", "v")
        assert b"k" not in node.kv.data
        client.put("k2", "v")  # the next write gets a new session
    assert node.kv.count("RegisterClient") == 2
    assert node.kv.requests("Put")[-1].header.client_id == f"2.{2:032x}"


def test_follows_a_hint_for_a_write_with_the_same_header(start_node):
    leader, follower = start_node("n2"), start_node("n1")
    follower.kv.script["Batch"] = not_leader(leader)
    with Client([follower.address], timeout=2.0) as client:
        assert client.batch(puts={"a": "1"}, deletes=["b"]) == [False, False]
    (refused,), (served,) = follower.kv.requests("Batch"), leader.kv.requests("Batch")
    assert refused.header == served.header


def test_threads_get_separate_write_sessions(start_node, streams):
    node = start_node()
    with Client([node.address], timeout=5.0, client_id="app", streams=streams) as client:
        threads = [threading.Thread(target=lambda: [client.put("k", "v") for _ in range(20)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    headers = [(p.header.client_id, p.header.seq) for p in node.kv.requests("Put")]
    assert len(headers) == 80 and len(set(headers)) == 80
    by_session: dict[str, list[int]] = {}
    for client_id, seq in headers:
        by_session.setdefault(client_id, []).append(seq)
    assert len(by_session) == 4 and node.kv.count("RegisterClient") == 4
    # Within one session the writes arrive one after another, in increasing order.
    assert all(seqs == sorted(seqs) for seqs in by_session.values())


def test_invalid_argument_is_not_retried(start_node, streams):
    node = start_node()
    node.kv.script["Put"] = lambda req, ctx: refuse(ctx, InvalidArgumentError("key is empty"))
    with Client([node.address], timeout=2.0, streams=streams) as client:
        with pytest.raises(InvalidArgumentError, match="key is empty"):
            client.put(b"", b"v")
    assert node.kv.count("Put") == 1


def test_plain_grpc_status_maps_to_a_typed_error(start_node, streams):
    node = start_node()
    node.kv.script["Get"] = lambda req, ctx: ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad")
    with Client([node.address], timeout=1.0, streams=streams) as client, pytest.raises(InvalidArgumentError):
        client.get("k")


def test_slow_server_gives_timeout(start_node, streams):
    node = start_node()
    release = threading.Event()
    node.kv.script["Get"] = lambda req, ctx: (release.wait(5), kv_pb2.GetResponse())[1]
    try:
        with Client([node.address], timeout=0.3, streams=streams) as client, pytest.raises(TimeoutError):
            client.get("k")
    finally:
        release.set()


def test_after_a_timeout_later_calls_start_elsewhere(start_node, streams):
    hung, healthy = start_node("n1"), start_node("n2")
    release = threading.Event()
    hung.kv.script["Get"] = lambda req, ctx: (release.wait(30), kv_pb2.GetResponse())[1]
    try:
        # 2 s: room for the first connection to the healthy node on a busy machine.
        with Client([hung.address, healthy.address], timeout=2.0, streams=streams) as client:
            with pytest.raises(TimeoutError):
                client.get("k")  # the whole timeout went to the first endpoint
            assert client.get("k") is None  # served by the next one, without waiting on the first
    finally:
        release.set()
    assert (hung.kv.count("Get"), healthy.kv.count("Get")) == (1, 1)


def test_str_and_bytes_are_accepted(start_node, streams):
    node = start_node()
    with Client(node.address, timeout=2.0, streams=streams) as client:
        client.put("ключ", "значение")
        client.put(bytearray(b"b"), memoryview(b"\x00\xff"))
        assert client.get(b"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87") == "значение".encode()
        assert client.get("b") == b"\x00\xff"
        with pytest.raises(TypeError):
            client.put(1, "v")  # type: ignore[arg-type]
    assert node.kv.requests("Put")[0].key == "ключ".encode()


def test_get_delete_and_consistency(start_node, streams):
    node = start_node()
    with Client(node.address, timeout=2.0, streams=streams) as client:
        assert client.get("missing") is None
        client.put("k", "v")
        assert client.get("k", consistency="stale") == b"v"
        assert client.delete("k") is True
        assert client.delete("k") is False
        with pytest.raises(ValueError):
            client.get("k", consistency="eventual")
    levels = [r.consistency for r in node.kv.requests("Get")]
    assert levels == [kv_pb2.LINEARIZABLE, kv_pb2.STALE]


def test_scan_follows_pages_and_prefix(start_node):
    node = start_node()
    node.kv.data.update({b"a": b"0", b"u/1": b"1", b"u/2": b"2", b"u/3": b"3", b"v": b"4"})
    with Client(node.address, timeout=2.0) as client:
        assert client.scan(prefix="u/") == [(b"u/1", b"1"), (b"u/2", b"2"), (b"u/3", b"3")]
        assert client.scan(start="u/2", end="v") == [(b"u/2", b"2"), (b"u/3", b"3")]
        assert client.scan(limit=3) == [(b"a", b"0"), (b"u/1", b"1"), (b"u/2", b"2")]
        assert client.scan(start="u/3") == [(b"u/3", b"3"), (b"v", b"4")]
        with pytest.raises(ValueError):
            client.scan(prefix="u/", start="a")


def test_a_scan_larger_than_a_page_field_asks_for_the_most_a_page_may_hold():
    asked: list[int] = []

    def fetch(request: kv_pb2.ScanRequest) -> kv_pb2.ScanResponse:
        asked.append(request.limit)
        return kv_pb2.ScanResponse(items=[kv_pb2.KeyValue(key=b"k", value=b"v")], more=False)

    assert paged_scan(fetch, None, None, None, 2**40, "stale") == [(b"k", b"v")]
    assert asked == [2**32 - 1]


def test_bulk_load_batches_fit_in_any_nodes_request_limit() -> None:
    from kv.tools.spark.bulk_load import BulkLoader

    with BulkLoader(free_address()) as loader:
        batches = list(loader._batches((b"k%04d" % i, b"v" * (100 << 10)) for i in range(40)))
    assert sum(map(len, batches)) == 40 and len(batches) > 1
    for batch in batches:
        request = batch_request(batch)
        request.header.CopyFrom(kv_pb2.WriteHeader(client_id="c" * 256, seq=2**63))
        assert request.ByteSize() <= MIN_MAX_REQUEST_BYTES


def test_prefix_end():
    assert prefix_end(b"u/") == b"u0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b""
    assert prefix_end(b"") == b""


def test_batch_accepts_pairs_and_mappings(start_node):
    node = start_node()
    node.kv.data[b"old"] = b"x"
    with Client(node.address, timeout=2.0) as client:
        assert client.batch(puts=[("old", "y"), ("new", "z")], deletes=["old", "gone"]) == [True, False, True, False]
        assert client.batch() == []
    (request,) = node.kv.requests("Batch")
    assert [op.WhichOneof("op") for op in request.ops] == ["put", "put", "delete", "delete"]
    assert node.kv.data == {b"new": b"z"}


def test_status_reports_every_endpoint(start_node):
    node = start_node("n7")
    down = free_address()
    with Client([node.address, down], timeout=0.5) as client:
        up_status, down_status = client.status()
    assert up_status["id"] == "n7" and up_status["role"] == "leader" and up_status["leader"] == "n7"
    assert up_status["peers"] == {"n7": 0}
    assert {"term", "commit_index", "applied_index", "snapshot_index"} <= up_status.keys()
    assert down_status["address"] == down and down_status["error"]


def test_closed_client_refuses_calls(start_node):
    node = start_node()
    client = Client(node.address)
    client.close()
    with pytest.raises(RuntimeError):
        client.get("k")


def test_endpoints_are_validated():
    with pytest.raises(ValueError):
        Client([])
    with pytest.raises(ValueError):
        Client("localhost")
    assert Client("a:1, b:2,a:1").endpoints == ["a:1", "b:2"]


def test_calls_share_one_request_stream(start_node, stream_kind):
    node = start_node()
    with Client(node.address, timeout=2.0) as client:
        for i in range(5):
            client.put(f"k{i}", "v")
            assert client.get(f"k{i}") == b"v"
        assert client.delete("k0") is True
    assert node.kv.streams_opened == 1
    assert (node.kv.count("Put"), node.kv.count("Get"), node.kv.count("Delete")) == (5, 5, 1)
    with Client(node.address, timeout=2.0, streams=False) as client:
        client.put("k", "v")
    assert node.kv.streams_opened == 1  # unary only


def test_a_grpc_whose_internals_changed_leaves_the_client_on_the_public_api(start_node, monkeypatch, caplog):
    """The caller-driven streams use gRPC's Cython layer (kv/client/stream_call.py). If a grpcio differs
    from what they expect in the middle of a call, that call is retried and the process's later
    streams run on gRPC's public API."""
    node = start_node()
    monkeypatch.setattr(stream_call, "_inline_works", True)

    def changed(self, operations, tag):
        raise AttributeError("'SegregatedCall' object has no attribute 'operate'")

    monkeypatch.setattr(stream_call.InlineStreamCall, "_start", changed)
    with Client(node.address, timeout=2.0) as client:
        client.put("k", "v")
        assert client.get("k") == b"v"
    assert stream_call._inline_works is False
    assert node.kv.count("Put") == 1  # the failed attempt sent nothing
    assert "using gRPC's threads" in caplog.text


def test_a_reply_too_late_answers_no_later_request(start_node, stream_kind):
    node = start_node()
    release = threading.Event()
    answers = iter([b"late", b"fresh"])

    def answer(request, context):
        value = next(answers)
        if value == b"late":
            release.wait(5)
        return kv_pb2.GetResponse(found=True, value=value)

    node.kv.script["Get"] = answer
    with Client(node.address, timeout=0.3) as client:
        with pytest.raises(TimeoutError):
            client.get("k")
        release.set()  # the late reply goes out now, on the stream the client gave up
        assert client.get("k") == b"fresh"
    assert node.kv.streams_opened == 2


def test_stream_pool_lends_each_stream_to_one_caller(start_node, stream_kind):
    node = start_node()
    channel = grpc.insecure_channel(node.address)
    pool = StreamPool()
    try:
        lent = [pool.take(node.address, channel) for _ in range(MAX_STREAMS_PER_NODE)]
        assert None not in lent and len({id(s) for s in lent}) == MAX_STREAMS_PER_NODE
        assert pool.take(node.address, channel) is None  # the node's quota: the caller goes unary
        pool.give_back(lent[0])
        assert pool.take(node.address, channel) is lent[0]
        lent[1].broken = True
        pool.give_back(lent[1])  # dropped, which frees its place in the quota
        fresh = pool.take(node.address, channel)
        assert fresh is not None and fresh not in lent
        reply = fresh.call(kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"k")), timeout=2.0)
        assert reply.get.found is False
    finally:
        pool.close()
        channel.close()


# ---- pipelines (kv/client/request_pipeline.py) ---------------------------------------------------------


def test_a_request_while_another_is_in_flight_goes_on_the_pipeline(start_node):
    node = start_node()
    first_held = threading.Event()
    second_arrived = threading.Event()

    def hold_the_first(request, context):
        if request.key == b"first":
            first_held.set()
            assert second_arrived.wait(5), "the second put never reached the node"
        return kv_pb2.PutResponse(index=1)

    def note(message, context):
        if any(t.request.put.key == b"second" for t in message.requests):
            second_arrived.set()

    node.kv.script["Put"] = hold_the_first
    node.kv.script["Pipeline"] = note
    with Client(node.address, timeout=5.0) as client:
        first = threading.Thread(target=client.put, args=("first", "v"))
        first.start()
        assert first_held.wait(5)
        client.put("second", "v")  # the first is still in flight: this one takes the pipeline
        first.join(5)
    assert node.kv.streams_opened == 1 and node.kv.pipelines_opened == 1
    assert [r.key for r in node.kv.requests("Put")] == [b"first", b"second"]


def test_many_threads_share_one_pipeline_and_each_gets_its_own_reply(start_node):
    node = start_node()
    wrong: list[tuple[str, bytes | None]] = []
    with Client(node.address, timeout=5.0) as client:
        def work(worker: int) -> None:
            for i in range(20):
                key = f"w{worker}-{i}"
                client.put(key, key)
                if (value := client.get(key)) != key.encode():
                    wrong.append((key, value))
        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert wrong == []
    assert node.kv.count("Put") == 160  # each exactly once
    assert node.kv.pipelines_opened == 1 and sum(node.kv.pipeline_messages) > 0


def test_replies_are_matched_by_tag(start_node):
    node = start_node()
    node.kv.data.update({b"a": b"1", b"b": b"2", b"c": b"3"})
    hub = PipelineHub()
    pipeline = hub.pipeline(node.address, lambda: grpc.insecure_channel(node.address))
    queued = [kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=k)) for k in (b"a", b"b", b"c")]
    with futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda r: pipeline.call(r, 5.0).get.value, queued))
    assert answers == [b"1", b"2", b"3"]
    pipeline.close()


def test_a_message_takes_everything_queued():
    queue_: queue.SimpleQueue[kv_pb2.TaggedRequest | None] = queue.SimpleQueue()
    for tag in (1, 2, 3):
        queue_.put(kv_pb2.TaggedRequest(tag=tag))
    queue_.put(None)
    assert [[t.tag for t in m.requests] for m in outgoing_messages(queue_)] == [[1, 2, 3]]


def test_a_message_stays_within_its_byte_bound():
    queue_: queue.SimpleQueue[kv_pb2.TaggedRequest | None] = queue.SimpleQueue()
    big = kv_pb2.StreamRequest(put=kv_pb2.PutRequest(key=b"k", value=b"v" * (MAX_BYTES_PER_MESSAGE // 3)))
    for tag in range(1, 6):
        queue_.put(kv_pb2.TaggedRequest(tag=tag, request=big))
    queue_.put(None)
    messages = list(outgoing_messages(queue_))
    assert [[t.tag for t in m.requests] for m in messages] == [[1, 2], [3, 4], [5]]
    assert all(m.ByteSize() <= MAX_BYTES_PER_MESSAGE for m in messages)


def test_a_request_too_large_for_a_pipeline_message_goes_alone():
    assert fits(MAX_BYTES_PER_MESSAGE - REQUEST_OVERHEAD_BYTES)
    assert not fits(MAX_BYTES_PER_MESSAGE - REQUEST_OVERHEAD_BYTES + 1)


def test_a_request_gRPC_refused_as_too_large_is_an_invalid_argument_naming_the_flag():
    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self) -> str:
            return "SERVER: Received message larger than max (2097200 vs. 1572864)"

        def trailing_metadata(self) -> tuple[()]:
            return ()

    error = from_rpc_error(Refused())
    assert isinstance(error, InvalidArgumentError) and not error.retryable
    assert "2097200 vs. 1572864" in str(error) and "--max-request-bytes" in str(error)


def test_a_late_pipeline_reply_answers_no_later_request(start_node):
    node = start_node()
    release = threading.Event()

    def slow_for_late(request, context):
        if request.key == b"late":
            release.wait(5)
        return kv_pb2.GetResponse(found=True, value=request.key)

    node.kv.script["Get"] = slow_for_late
    pipeline = PipelineHub().pipeline(node.address, lambda: grpc.insecure_channel(node.address))
    with pytest.raises(TimeoutError):
        pipeline.call(kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"late")), 0.3)
    release.set()  # the late reply goes out now, on the same call
    assert pipeline.call(kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"fresh")), 5.0).get.value == b"fresh"
    assert node.kv.pipelines_opened == 1
    pipeline.close()


def test_a_failed_pipeline_fails_its_callers_as_unavailable_and_the_next_call_opens_another(start_node):
    node = start_node()
    aborts = [1]

    def abort_once(message, context):
        if aborts[0]:
            aborts[0] -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "the node is shutting down")

    node.kv.script["Pipeline"] = abort_once
    hub = PipelineHub()
    open_channel = lambda: grpc.insecure_channel(node.address)  # noqa: E731
    broken = hub.pipeline(node.address, open_channel)
    with pytest.raises(UnavailableError, match="UNAVAILABLE"):
        broken.call(kv_pb2.StreamRequest(put=kv_pb2.PutRequest(key=b"k", value=b"v")), 5.0)
    assert broken.broken
    fresh = hub.pipeline(node.address, open_channel)
    assert fresh is not broken
    assert fresh.call(kv_pb2.StreamRequest(put=kv_pb2.PutRequest(key=b"k", value=b"v")), 5.0).put.index == 1
    assert node.kv.pipelines_opened == 2
    fresh.close()


def test_pipelines_close_when_the_last_client_closes(start_node):
    node = start_node()
    hub = PipelineHub()
    first, second = hub.attach(), hub.attach()
    pipeline = hub.pipeline(node.address, lambda: grpc.insecure_channel(node.address))
    assert pipeline.call(kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"k")), 5.0).get.found is False
    first.release()
    first.release()  # idempotent: still one client in
    assert not pipeline.broken
    second.release_later()  # as a finalizer does: queued, applied at the hub's next enter
    assert not pipeline.broken
    hub.enter(node.address)
    assert pipeline.broken
    with pytest.raises(UnavailableError):
        pipeline.call(kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"k")), 5.0)


def _threads_feeding_pipelines() -> int:
    """Threads now waiting in a pipeline's message generator (gRPC's sending threads). Only each
    thread's innermost frame is read: walking another running thread's frames back can crash
    the interpreter (it did, in this test, once more threads ran beside it)."""
    return sum(1 for frame in sys._current_frames().values() if frame.f_code is outgoing_messages.__code__)


def test_a_broken_pipeline_leaves_no_thread_behind(start_node):
    node = start_node()
    node.kv.script["Pipeline"] = lambda message, context: context.abort(grpc.StatusCode.UNAVAILABLE, "gone")
    hub = PipelineHub()
    before = _threads_feeding_pipelines()
    for _ in range(5):
        pipeline = hub.pipeline(node.address, lambda: grpc.insecure_channel(node.address))
        with pytest.raises(UnavailableError):
            pipeline.call(kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"k")), 5.0)
    deadline = time.monotonic() + 5
    while _threads_feeding_pipelines() > before and time.monotonic() < deadline:
        time.sleep(0.01)  # the threads end on their own after the call; nothing to wait on
    assert _threads_feeding_pipelines() <= before
