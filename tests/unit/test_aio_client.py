"""kv.aio.Client against real gRPC servers on 127.0.0.1 whose KV servicer follows a script (the
servers of tests/unit/test_client.py): the sync client's routing, retries, errors and
exactly-once rules, awaited; one client session shared by concurrent tasks and kept within the
cluster's window. Each test runs its coroutine with asyncio.run."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent import futures
from typing import Any

import grpc
import pytest

import kv.aio
from kv.client import session as client_session
from kv.errors import InvalidArgumentError, RaftKVError, TimeoutError, UnavailableError, UnknownSessionError
from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb_etcd
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2
from tests.unit.test_client import (  # noqa: F401 - start_node is a fixture
    expire_sessions,
    fail_times,
    free_address,
    not_leader,
    refuse,
    start_node,
)


def run(test: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(test())


def test_follows_not_leader_hint_and_remembers_the_leader(start_node):
    leader, follower = start_node("n2"), start_node("n1")
    follower.kv.script["Put"] = not_leader(leader)

    async def test() -> None:
        async with kv.aio.Client([follower.address], timeout=2.0) as client:
            assert await client.put(b"k", b"v") == 1
            assert await client.put(b"k", b"w") == 2
    run(test)
    assert follower.kv.count("Put") == 1  # the second write went straight to the leader
    assert leader.kv.data == {b"k": b"w"}
    (refused,) = follower.kv.requests("Put")
    assert refused.header == leader.kv.requests("Put")[0].header  # the same write, followed


def test_not_leader_without_hint_and_a_dead_endpoint_try_the_next(start_node):
    electing, leader = start_node("n1"), start_node("n2")
    electing.kv.script["Get"] = not_leader(None)
    leader.kv.data[b"k"] = b"v"

    async def test() -> None:
        async with kv.aio.Client([electing.address, free_address(), leader.address], timeout=3.0) as client:
            assert await client.get("k") == b"v"
    run(test)
    assert electing.kv.count("Get") == 1


def test_server_down_gives_unavailable_after_the_timeout_saying_what_each_endpoint_answered():
    async def test() -> None:
        async with kv.aio.Client([free_address()], timeout=0.5) as client:
            started = time.monotonic()
            with pytest.raises(UnavailableError, match="no node served the request within 0.5s"):
                await client.get("k")
            assert 0.4 <= time.monotonic() - started < 10  # the whole timeout, then it stops
    run(test)


def test_concurrent_writes_share_one_session_and_retries_keep_their_header(start_node):
    node = start_node()
    node.kv.script["Put"] = fail_times(3, UnavailableError("starting"),
                                       lambda req, ctx: kv_pb2.PutResponse(index=len(node.kv.calls)))

    async def test() -> None:
        async with kv.aio.Client([node.address], timeout=5.0, client_id="me") as client:
            await asyncio.gather(*(client.put(f"k{i}", "v") for i in range(40)))
            await client.delete("k1")
    run(test)
    (registration,) = node.kv.requests("RegisterClient")  # one session for every task
    assert registration.name == "me"
    headers = [(p.header.client_id, p.header.seq) for p in node.kv.requests("Put")]
    assert len(headers) == 43 and {client_id for client_id, _ in headers} == {f"1.{1:032x}"}
    assert {seq for _, seq in headers} == set(range(1, 41))  # each write a seq of its own, kept on its retries
    assert node.kv.requests("Delete")[0].header.seq == 41


def test_writes_in_flight_stay_within_the_session_window(start_node, monkeypatch):
    monkeypatch.setattr(client_session, "SESSION_WINDOW", 4)
    node = start_node()
    release = threading.Event()

    def put(request, context):
        if request.header.seq == 1:
            release.wait(5)
        return kv_pb2.PutResponse(index=request.header.seq)
    node.kv.script["Put"] = put

    async def test() -> None:
        async with kv.aio.Client([node.address], timeout=10.0) as client:
            writes = asyncio.gather(*(client.put(f"k{i}", "v") for i in range(10)))
            await asyncio.sleep(0.5)
            # While seq 1 is unanswered only seqs 2..4 may go: a 5th would leave the cluster's window.
            assert sorted(p.header.seq for p in node.kv.requests("Put")) == [1, 2, 3, 4]
            release.set()
            assert sorted(await writes) == list(range(1, 11))
    try:
        run(test)
    finally:
        release.set()


def test_a_write_refused_for_an_expired_session_is_sent_again_in_a_new_one(start_node):
    node = start_node()
    node.kv.script["Put"] = expire_sessions(node.kv, [UnknownSessionError("gone")])

    async def test() -> None:
        async with kv.aio.Client([node.address], timeout=2.0) as client:
            assert await client.put("k", "v") == 1
            await client.put("k", "w")
    run(test)
    assert node.kv.count("RegisterClient") == 2
    headers = [(p.header.client_id, p.header.seq) for p in node.kv.requests("Put")]
    assert headers == [(f"1.{1:032x}", 1), (f"2.{2:032x}", 1), (f"2.{2:032x}", 2)]


def test_an_expired_session_met_by_a_retry_is_an_unknown_outcome(start_node):
    node = start_node()
    node.kv.script["Put"] = expire_sessions(node.kv, [UnavailableError("lost"), UnknownSessionError("gone")])

    async def test() -> None:
        async with kv.aio.Client([node.address], timeout=2.0) as client:
            with pytest.raises(UnknownSessionError, match="outcome is\\s+unknown"):
                await client.put("k", "v")
            await client.put("k2", "v")  # the next write gets a new session
    run(test)
    assert node.kv.count("RegisterClient") == 2 and b"k" not in node.kv.data


def test_invalid_argument_is_not_retried_and_a_slow_server_times_out(start_node):
    node = start_node()
    node.kv.script["Put"] = lambda req, ctx: refuse(ctx, InvalidArgumentError("key is empty"))
    release = threading.Event()
    node.kv.script["Get"] = lambda req, ctx: (release.wait(5), kv_pb2.GetResponse())[1]

    async def test() -> None:
        async with kv.aio.Client([node.address], timeout=0.3) as client:
            with pytest.raises(InvalidArgumentError, match="key is empty"):
                await client.put(b"", b"v")
            with pytest.raises(TimeoutError):
                await client.get("k")
    try:
        run(test)
    finally:
        release.set()
    assert node.kv.count("Put") == 1


def test_scan_batch_status_and_a_closed_client(start_node):
    node = start_node("n7")
    down = free_address()

    async def test() -> None:
        client = kv.aio.Client([node.address, down], timeout=0.5)
        assert await client.batch(puts=[("a", "1"), ("b", "2"), ("c", "3")], deletes=["z"]) == [False] * 4
        assert await client.scan(prefix="") == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]  # pages of two
        assert await client.scan(start="b", limit=1) == [(b"b", b"2")]
        with pytest.raises(ValueError):
            await client.scan(prefix="a", start="b")
        up, unreachable = await client.status()
        assert up["id"] == "n7" and up["role"] == "leader"
        assert unreachable["address"] == down and unreachable["error"]
        await client.close()
        with pytest.raises(RuntimeError, match="closed"):
            await client.get("a")
    run(test)
    assert node.kv.count("Scan") == 3


def test_errors_are_kv_errors():
    assert issubclass(UnknownSessionError, RaftKVError)
    with pytest.raises(ValueError):
        kv.aio.Client([])
    with pytest.raises(ValueError):
        kv.aio.Client("a:1", timeout=0)
    with pytest.raises(ValueError, match="one of key, prefix or start"):
        kv.aio.Client("a:1").watch(key="a", prefix="b")


class TwoMembersWatch(etcd_rpc_pb2_grpc.WatchServicer):
    """Etcd's Watch on two scripted members: the first sends revisions 2 and 3, then its stream
    breaks; the second sends from the revision it was asked for on: 4 and 5."""

    def __init__(self) -> None:
        self.starts: list[int] = []

    def Watch(self, requests, context):
        create = next(requests).create_request
        self.starts.append(create.start_revision)
        yield pb_etcd.WatchResponse(created=True, header=pb_etcd.ResponseHeader(revision=1))
        revisions = [[2], [3]] if len(self.starts) == 1 else [[4], [5]]
        for group in revisions:
            events = [mvccpb.Event(kv=mvccpb.KeyValue(key=b"w", value=b"%d" % r, mod_revision=r)) for r in group]
            yield pb_etcd.WatchResponse(events=events)
        if len(self.starts) == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the member died")
        while context.is_active():  # the second stays open until the client leaves
            time.sleep(0.05)


def test_a_watch_resumes_after_its_last_event_and_delivers_each_revision_once():
    servicer = TwoMembersWatch()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    etcd_rpc_pb2_grpc.add_WatchServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def test() -> list[int]:
        async with kv.aio.Client([f"127.0.0.1:{port}"], timeout=2.0) as client:
            revisions = []
            async with client.watch(key="w", start_revision=2) as watch:
                async for event in watch:
                    revisions.append(event.mod_revision)
                    if len(revisions) == 4:
                        break
            return revisions
    try:
        assert run(test) == [2, 3, 4, 5]
        assert servicer.starts == [2, 4]  # the second stream from the revision after the last event
    finally:
        server.stop(grace=None)
