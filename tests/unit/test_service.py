"""kv/service.py on a real single node: a request starts in a `begin_*` call and finishes through
callbacks on the node's future (no task each), with the client API's errors and timeouts."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kv import errors
from kv.service import KVHandler, begin_node_call
from proto import kv_pb2
from raft.node import errors as node_errors
from tests.unit.test_node import WAIT_S, Single, run


def header(seq: int) -> kv_pb2.WriteHeader:
    return kv_pb2.WriteHeader(client_id="test-client", seq=seq)


def test_many_requests_in_flight_finish_without_a_task_each(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            tasks_before = len(asyncio.all_tasks())
            puts = [handler.begin_put(kv_pb2.PutRequest(key=b"k%d" % i, value=b"v%d" % i, header=header(i + 1)),
                                      WAIT_S) for i in range(50)]
            assert len(asyncio.all_tasks()) == tasks_before
            replies = await asyncio.gather(*puts)
            assert sorted(r.index for r in replies) == [r.index for r in replies] and replies[0].index > 0
            got = await handler.begin_get(kv_pb2.GetRequest(key=b"k49"), WAIT_S)
            assert (got.found, got.value) == (True, b"v49") and got.index >= replies[-1].index
            gone = await handler.begin_delete(kv_pb2.DeleteRequest(key=b"k0", header=header(51)), WAIT_S)
            assert gone.existed
            assert not (await handler.begin_get(kv_pb2.GetRequest(key=b"k0"), WAIT_S)).found

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
            assert (refused.value.leader_id, refused.value.leader_address) == ("n1", node.config.peers["n1"])

            def invalid(_: int) -> int:
                raise errors.InvalidArgumentError("no such thing")
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            done.set_result(1)
            with pytest.raises(errors.InvalidArgumentError, match="no such thing"):
                await begin_node_call(node, lambda: done, WAIT_S, "{}", invalid)

    run(main)
