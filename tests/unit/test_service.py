"""kv/server/kv_service.py and pipeline_call.py on a real single node: a request starts in a
`begin_*` call and finishes through callbacks on the node's future (no task each), with the
client API's errors and timeouts."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from kv import errors
from kv.server import pipeline_call
from kv.server.server import start_server
from kv.server.kv_handler import KVHandler
from kv.server.node_calls import begin_node_call
from kv.server.kv_service import KVServicer
from kv.server.pipeline_call import _ReplyGather, read_requests
from raftkv_proto import kv_pb2
from raft.node import errors as node_errors
from raft.node.config import NodeConfig, StorageConfig
from tests.unit.test_node import WAIT_S, Single, free_port, run


def header(seq: int, client_id: str) -> kv_pb2.WriteHeader:
    return kv_pb2.WriteHeader(client_id=client_id, seq=seq)


async def registered(handler: KVHandler) -> str:
    """A client id the node issued."""
    return (await handler.register_client(kv_pb2.RegisterClientRequest(name="test"), WAIT_S)).client_id


def test_many_requests_in_flight_finish_without_a_task_each(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            client_id = await registered(handler)
            tasks_before = len(asyncio.all_tasks())
            puts = [handler.begin_put(kv_pb2.PutRequest(key=b"k%d" % i, value=b"v%d" % i, header=header(i + 1, client_id)),
                                      WAIT_S) for i in range(50)]
            assert len(asyncio.all_tasks()) == tasks_before
            replies = await asyncio.gather(*puts)
            assert sorted(r.index for r in replies) == [r.index for r in replies] and replies[0].index > 0
            got = await handler.begin_get(kv_pb2.GetRequest(key=b"k49"), WAIT_S)
            assert (got.found, got.value) == (True, b"v49") and got.index >= replies[-1].index
            gone = await handler.begin_delete(kv_pb2.DeleteRequest(key=b"k0", header=header(51, client_id)), WAIT_S)
            assert gone.existed
            assert not (await handler.begin_get(kv_pb2.GetRequest(key=b"k0"), WAIT_S)).found

    run(main)


def test_a_write_in_a_session_the_node_did_not_issue_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            first, second = await registered(handler), await registered(handler)
            assert first != second and first.split(".")[0].isdigit()
            await handler.put(kv_pb2.PutRequest(key=b"k", value=b"mine", header=header(1, first)), WAIT_S)
            index, _, secret = first.partition(".")
            guessed = f"{index}.{'0' * len(secret)}"
            for client_id in ("made-up", guessed):
                with pytest.raises(errors.UnknownSessionError, match="register again"):
                    await handler.put(kv_pb2.PutRequest(key=b"k", value=b"forged", header=header(2, client_id)), WAIT_S)
            again = await handler.put(kv_pb2.PutRequest(key=b"k", value=b"next", header=header(2, first)), WAIT_S)
            assert again.index > 0 and single.fsm.get(b"k") == b"next"

    run(main)


def test_a_node_call_times_out_with_the_client_error_and_leaves_the_node_future(tmp_path: Path) -> None:
    async def main() -> None:
        async with Single(tmp_path) as node:
            never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            call = begin_node_call(node, lambda: never, 0.05, "not done within {:.3f}s", lambda r: r)
            with pytest.raises(errors.TimeoutError, match="not done within 0.050s"):
                await call
            assert not never.done()  # the node still owns it (a write may yet be applied)

    run(main)


def test_node_errors_become_client_errors_when_raised_at_start_or_at_the_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with Single(tmp_path) as node:
            def refuse() -> asyncio.Future[int]:
                raise node_errors.QueueFullError("10 waiting")
            with pytest.raises(errors.QueueFullError, match="10 waiting"):
                begin_node_call(node, refuse, WAIT_S, "{}", lambda r: r)

            failing: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            call = begin_node_call(node, lambda: failing, WAIT_S, "{}", lambda r: r)
            failing.set_exception(node_errors.NotLeaderError("n1", 3))
            with pytest.raises(errors.NotLeaderError) as refused:
                await call
            assert (refused.value.leader_id, refused.value.leader_address) == ("n1", node.config.listen)

            def invalid(_: int) -> int:
                raise errors.InvalidArgumentError("no such thing")
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            done.set_result(1)
            with pytest.raises(errors.InvalidArgumentError, match="no such thing"):
                await begin_node_call(node, lambda: done, WAIT_S, "{}", invalid)

    run(main)


def test_a_pipeline_holds_at_most_its_limit_and_makes_room_as_replies_are_taken() -> None:
    async def main() -> None:
        replies = _ReplyGather(limit=2)
        reader = asyncio.get_running_loop().create_future()  # the request reader, still reading
        replies.read_with(reader)  # type: ignore[arg-type]
        first, second = (asyncio.get_running_loop().create_future() for _ in range(2))
        replies.start(1, "put", first)
        assert not replies.full
        replies.answered(2, kv_pb2.StreamReply())  # a refusal, answered at once
        assert replies.full
        room = asyncio.ensure_future(replies.room())
        settled = asyncio.Event()
        first.add_done_callback(lambda _: settled.set())  # runs after the gather's own callback
        first.set_result(kv_pb2.PutResponse(index=7))
        await settled.wait()
        assert replies.full and not room.done()  # answered but not yet taken: still held
        batch = await replies.next_batch()
        assert sorted(r.tag for r in batch or []) == [1, 2]
        assert replies.full and not room.done()  # being sent: still held until gRPC takes them
        replies.sent()
        await room  # sent: there is room again
        assert not replies.full
        replies.start(3, "put", second)
        second.cancel()
        reader.set_result(None)
        assert await replies.next_batch() is None

    run(main)


def test_a_pipeline_holds_at_most_its_reply_bytes_and_counts_gets_in_flight_at_an_estimate() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        replies = _ReplyGather(limit=100, byte_limit=1000)
        reader = loop.create_future()
        replies.read_with(reader)  # type: ignore[arg-type]
        first = loop.create_future()
        replies.start(1, "get", first)
        assert replies.full  # a get in flight counts at the first estimate (64 KiB), over 1000 bytes
        first.set_result(kv_pb2.GetResponse(found=True, value=b"v" * 600))
        await asyncio.sleep(0)  # the gather's done callback
        assert replies.held_bytes > 600 and not replies.full  # answered: its real size now
        second = loop.create_future()
        replies.start(2, "get", second)
        assert replies.full  # at the estimate, still far above 600 bytes: read no further
        second.cancel()
        await asyncio.sleep(0)
        batch = await replies.next_batch()
        assert [r.tag for r in batch or []] == [1] and replies.held_bytes > 600  # being sent: held
        replies.sent()
        assert replies.held_bytes == 0 and not replies.full
        reader.set_result(None)
        assert await replies.next_batch() is None

    run(main)


def test_a_pipeline_past_its_limit_answers_every_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 4 held requests, a client sending 60 in one message gets all 60 answered,
    each with its tag: the call reads on as the replies it holds are sent."""
    monkeypatch.setattr(pipeline_call, "MAX_PIPELINE_HELD", 4)

    async def main() -> None:
        port = free_port()
        config = NodeConfig(node_id="n1", listen=f"127.0.0.1:{port}", data_dir=tmp_path / "n1",
                            storage=StorageConfig(log_max_bytes=64 << 20, state_max_bytes=64 << 20))
        server = await start_server(config)
        try:
            await asyncio.wait_for(server.node.wait_for_leader(), WAIT_S)
            client_id = await registered(server.handler)
            requests = [kv_pb2.TaggedRequest(tag=100 + i, request=kv_pb2.StreamRequest(
                put=kv_pb2.PutRequest(key=b"k%d" % i, value=b"v", header=header(i + 1, client_id)))) for i in range(30)]
            requests += [kv_pb2.TaggedRequest(tag=200 + i, request=kv_pb2.StreamRequest(
                get=kv_pb2.GetRequest(key=b"k%d" % i, consistency=kv_pb2.STALE))) for i in range(30)]
            async with grpc.aio.insecure_channel(config.listen) as channel:
                pipeline = channel.stream_stream("/raftkv.kv.KV/Pipeline",
                                                 request_serializer=kv_pb2.PipelineRequest.SerializeToString,
                                                 response_deserializer=kv_pb2.PipelineReply.FromString)
                call = pipeline(iter([kv_pb2.PipelineRequest(requests=requests)]), timeout=WAIT_S)
                tags = [r.tag for message in [m async for m in call] for r in message.replies]
        finally:
            await server.stop()
        assert sorted(tags) == [r.tag for r in requests]

    run(main)


def test_a_pipeline_reads_no_request_while_it_holds_its_limit(tmp_path: Path) -> None:
    """The call's request reader waits for room: the client's requests are never pulled while
    the call already holds its limit, however fast they come."""
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            await asyncio.wait_for(node.wait_for_leader(), WAIT_S)
            servicer = KVServicer(KVHandler(node, single.fsm))
            replies = _ReplyGather(limit=4)
            held_at_pull: list[int] = []

            async def requests() -> AsyncIterator[kv_pb2.PipelineRequest]:
                for tag in range(20):  # never awaits: only the reader's own waits let others run
                    held_at_pull.append(replies.held)
                    stale = kv_pb2.StreamRequest(get=kv_pb2.GetRequest(key=b"k", consistency=kv_pb2.STALE))
                    yield kv_pb2.PipelineRequest(requests=[kv_pb2.TaggedRequest(tag=tag, request=stale)])

            replies.read_with(asyncio.create_task(read_requests(requests(), replies, servicer._begin)))
            tags = []
            while (batch := await replies.next_batch()) is not None:
                tags += [r.tag for r in batch]
                replies.sent()
        assert sorted(tags) == list(range(20))
        assert max(held_at_pull) == 4  # pulled with the call full, then it waited for room

    run(main)


def test_a_node_call_its_caller_gave_up_on_leaves_no_timer_armed(tmp_path: Path) -> None:
    async def main() -> None:
        async with Single(tmp_path) as node:
            loop = asyncio.get_running_loop()

            def armed() -> int:  # asyncio's own timer heap: the test's only window onto it
                return sum(1 for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]

            never: asyncio.Future[int] = loop.create_future()
            before = armed()
            call = begin_node_call(node, lambda: never, 60.0, "{}", lambda r: r)
            assert armed() == before + 1
            call.cancel()  # a stream handler cancelled with its client
            await asyncio.sleep(0)  # done callbacks run on the next loop turn
            assert armed() == before

    run(main)
