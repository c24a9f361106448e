"""How a request waits on the node, on every face: `begin_node_call` starts a node operation and
gives a future of its answer with a timeout, the node's refusals become kv.errors (`kv_error`:
NOT_LEADER with the leader's client address, QUEUE_FULL, DISK_FULL, UNAVAILABLE), and
`propose_command` is the one way a command goes into the log, its outcome read back as the
refusal it stands for (`applied`: the one table from an applied command to kv.errors, which each
face renders in its own codes)."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kv import errors
from raft.node import errors as node_errors
from raft.node.node import RaftNode
from raftkv_proto import kv_pb2
from statemachine.apply_batch import ApplyOutcome
from statemachine.auth_state import PERMISSION_DENIED

T = TypeVar("T")
R = TypeVar("R")

TIMEOUT_MESSAGE = "not done within {:.3f}s; a write may still be applied later, at most once"


def not_leader(node: RaftNode, leader: str | None) -> errors.NotLeaderError:
    """NOT_LEADER naming `leader` (None: not known) and where its clients reach it."""
    return errors.NotLeaderError(leader, node.transport.client_address(leader) if leader else None)


_NO_HEADER = kv_pb2.WriteHeader()


def propose_command(node: RaftNode, payload: bytes, timeout: float | None,
                    header: kv_pb2.WriteHeader = _NO_HEADER, within_reserve: bool = False,
                    then: Callable[[ApplyOutcome], R] = lambda outcome: outcome) -> asyncio.Future[R]:
    """Every face's way to the log: propose a command (on the leader), and a future of
    `then(its outcome)`, or of the refusal the outcome stands for (`applied`) as a kv.errors error.
    `header` is the write's client session, named in refusals about it."""
    return begin_node_call(node, lambda: node.propose(payload, within_reserve=within_reserve), timeout,
                           TIMEOUT_MESSAGE, lambda outcome: then(applied(outcome, header)))


def applied(outcome: ApplyOutcome, header: kv_pb2.WriteHeader = _NO_HEADER) -> ApplyOutcome:
    """A command's outcome, or the refusal it stands for: the one table from an applied command to
    kv.errors, which each face renders in its own codes."""
    if outcome.other_user:
        raise errors.PermissionDeniedError(
            f"{PERMISSION_DENIED}: client session {header.client_id!r} belongs to another user")
    if outcome.result.refusal_kind:  # refused at apply (a permission revoked meanwhile, ...)
        raise errors.of_kind(outcome.result.refusal_kind, outcome.result.refusal)
    if outcome.unknown_session:
        raise errors.UnknownSessionError(
            f"client id {header.client_id!r} names no client session this cluster keeps (never registered, "
            "expired, or a wrong secret); this write was not applied: register again (RegisterClient)")
    if outcome.expired:
        raise errors.InvalidArgumentError(
            f"write seq {header.seq} of client {header.client_id!r} is older than its session window; "
            "whether it was applied is unknown (use a fresh sequence number)")
    if outcome.error is not None:
        raise errors.InvalidArgumentError(f"the command could not be applied: {outcome.error}")
    return outcome


def kv_error(node: RaftNode, e: BaseException) -> BaseException:
    """The client API's error (kv.errors) for one the node raised: NOT_LEADER with the leader's
    address, QUEUE_FULL, DISK_FULL, UNAVAILABLE; any other exception as it is."""
    if isinstance(e, node_errors.NotLeaderError):
        return not_leader(node, e.leader)
    if isinstance(e, node_errors.QueueFullError):
        return errors.QueueFullError(str(e))
    if isinstance(e, node_errors.DiskFullError):
        return errors.DiskFullError(str(e))
    if isinstance(e, node_errors.NodeStoppedError):
        return errors.UnavailableError(str(e))
    return e


def read_barrier(node: RaftNode, level: str, timeout: float | None,
                 then: Callable[[int], R] = lambda index: index) -> asyncio.Future[R]:  # type: ignore[assignment,return-value]
    """Every face's wait for a read at `level` ("linearizable", "lease", "stale"): a future of
    `then(the index through which the state is at least as fresh as asked)`."""
    return begin_node_call(node, lambda: node.read_barrier(level), timeout, TIMEOUT_MESSAGE, then)


def begin_node_call(node: RaftNode, start: Callable[[], asyncio.Future[T]], timeout: float | None,
                    timeout_message: str, then: Callable[[T], R]) -> asyncio.Future[R]:
    """Start a node operation (`start` returns its future); a future of `then(its result)`,
    failed with TimeoutError after `timeout` (`timeout_message` formatted with it) and with the
    client API's errors (`kv_error`) for the node's. Errors the start raises are raised here."""
    try:
        started = start()
    except (node_errors.NodeError, node_errors.NotLeaderError) as e:
        raise kv_error(node, e) from None
    loop = asyncio.get_running_loop()
    out: asyncio.Future[R] = loop.create_future()
    if timeout is not None:
        timer = loop.call_later(timeout, _expire, out, timeout_message.format(timeout))
        # However `out` ends (settled, timed out, or cancelled by a caller that gave up), the
        # timer goes with it.
        out.add_done_callback(lambda _: timer.cancel())
    started.add_done_callback(functools.partial(_settle, node, out, then))
    return out


def _expire(out: asyncio.Future[Any], message: str) -> None:
    if not out.done():
        out.set_exception(errors.TimeoutError(message))


def _settle(node: RaftNode, out: asyncio.Future[R], then: Callable[[T], R], started: asyncio.Future[T]) -> None:
    if out.done():  # timed out, or its caller gave up
        return
    if started.cancelled():
        out.cancel()
        return
    error = started.exception()
    if error is not None:
        out.set_exception(kv_error(node, error))
        return
    try:
        out.set_result(then(started.result()))
    except Exception as e:  # noqa: BLE001 - a refusal (InvalidArgumentError) or a failed read: the caller's
        out.set_exception(e)


async def node_call(node: RaftNode, start: Callable[[], Awaitable[T]], timeout: float | None,
                    timeout_message: str) -> T:
    """`begin_node_call` for any awaitable (a coroutine runs as a task), awaited."""
    return await begin_node_call(node, lambda: asyncio.ensure_future(start()), timeout, timeout_message,
                                 lambda result: result)
