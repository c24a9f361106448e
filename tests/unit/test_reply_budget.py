"""The member's budget of large replies (kv/server/reply_budget.py): one over the send limit is
refused with gRPC's words, replies beyond the budget wait for room, and a grant given back before
its read measured anything takes nothing."""
from __future__ import annotations

import asyncio

import pytest

from kv import errors
from kv.server.reply_budget import NoRoom, ReplyBudget


def test_a_reply_over_the_send_limit_is_refused_as_grpc_refuses_it() -> None:
    async def run() -> None:
        budget = ReplyBudget(limit_bytes=100, max_reply_bytes=60)
        with pytest.raises(errors.ReplyTooLargeError) as refused:
            budget.grant()(61)
        assert str(refused.value) == "grpc: trying to send message larger than max (61 vs. 60)"
        assert refused.value.code.name == "RESOURCE_EXHAUSTED" and budget.in_flight == 0
    asyncio.run(run())


def test_replies_past_the_budget_wait_for_room() -> None:
    async def run() -> None:
        budget = ReplyBudget(limit_bytes=100, max_reply_bytes=60)
        first, second = budget.grant(), budget.grant()
        first(60)
        with pytest.raises(NoRoom):
            second(50)
        waiting = asyncio.create_task(budget.wait_room(50, timeout=None))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        first.release()
        await asyncio.wait_for(waiting, 5)
        second(50)
        assert budget.in_flight == 50
        with pytest.raises(errors.TimeoutError):
            await budget.wait_room(60, timeout=0.01)
        second.release()
        second.release()  # once only
        assert budget.in_flight == 0
    asyncio.run(run())


def test_the_only_reply_in_flight_is_taken_and_a_released_grant_takes_nothing() -> None:
    async def run() -> None:
        budget = ReplyBudget(limit_bytes=10, max_reply_bytes=60)
        alone = budget.grant()
        alone(60)  # over the budget, under the send limit, nothing else in flight
        alone.release()
        given_up = budget.grant()
        given_up.release()  # its call ended while its read was still measuring
        with pytest.raises(NoRoom):
            given_up(5)
        assert budget.in_flight == 0
    asyncio.run(run())
