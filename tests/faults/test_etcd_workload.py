"""The etcd client of the fault suite (workload.EtcdTarget) against scripted stubs, and how the
checker takes what it records: seconds, no nodes (like test_proxy.py, not marked `faults`)."""
from __future__ import annotations

from typing import Any

import grpc
import pytest

from raftkv_proto.member_ids import member_number
from raftkv_proto import etcd_rpc_pb2 as pb
from tests.faults.history import Kind, Op, Outcome
from tests.faults.linearizability import Verdict, check
from tests.faults import workload
from tests.faults.workload import NOT_SENT, EtcdTarget


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ScriptedStub:
    """A member's etcd KV stub whose calls answer, in turn, from `script` (an exception is raised)."""

    def __init__(self, member: str, script: list[object]) -> None:
        self.script = script
        self.header = pb.ResponseHeader(member_id=member_number(member))
        self.calls: list[object] = []

    def _next(self, request: object, response: Any) -> Any:
        self.calls.append(request)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        response.header.CopyFrom(self.header)
        return response

    def Put(self, request: pb.PutRequest, timeout: float) -> pb.PutResponse:
        return self._next(request, pb.PutResponse())

    def Range(self, request: pb.RangeRequest, timeout: float) -> pb.RangeResponse:
        response = pb.RangeResponse()
        value = self.script[0] if isinstance(self.script[0], bytes) else None
        if value is not None:
            response.kvs.add(key=request.key, value=value)
        return self._next(request, response)

    def DeleteRange(self, request: pb.DeleteRangeRequest, timeout: float) -> pb.DeleteRangeResponse:
        return self._next(request, pb.DeleteRangeResponse(deleted=1))


RESET = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
REFUSED = FakeRpcError(grpc.StatusCode.UNAVAILABLE, f"{NOT_SENT}; last error: UNKNOWN: Connection refused")
LATE = FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
LEADER_CHANGED = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed")
INVALID = FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "ETCD_RETRY_PAUSE_S", 0.0)


def target(*stubs: ScriptedStub, **kwargs: Any) -> EtcdTarget:
    return EtcdTarget([(f"n{i + 1}", stub) for i, stub in enumerate(stubs)], **kwargs)


def test_a_write_whose_attempt_may_have_landed_is_unknown_and_its_retry_an_op_of_its_own() -> None:
    n1, n2, n3 = ScriptedStub("n1", [RESET]), ScriptedStub("n2", [LATE]), ScriptedStub("n3", ["ok"])
    client = target(n1, n2, n3)
    ops = client.attempts("c", Kind.PUT, b"k", b"c-1")
    assert [op.outcome for op in ops] == [Outcome.UNKNOWN, Outcome.UNKNOWN, Outcome.OK]
    assert [op.value for op in ops] == [b"c-1"] * 3  # the same request sent again, as etcd clients do
    assert ops[0].return_ns is None and ops[0].ended_ns is not None and "n1" in (ops[0].error or "")
    assert ops[0].call_ns < ops[1].call_ns < ops[2].call_ns
    assert client.stats.retried_unknown == 2 and client.stats.answered == {"n3": 1}
    # It stays with the member that answered.
    n3.script.append("ok")
    assert [op.outcome for op in client.attempts("c", Kind.PUT, b"k", b"c-2")] == [Outcome.OK]
    assert len(n3.calls) == 2 and len(n1.calls) == 1


def test_a_write_that_found_no_connection_failed_and_moves_on() -> None:
    n1, n2 = ScriptedStub("n1", [REFUSED]), ScriptedStub("n2", ["ok"])
    ops = target(n1, n2).attempts("c", Kind.DELETE, b"k")
    assert [(op.outcome, op.existed) for op in ops] == [(Outcome.FAIL, None), (Outcome.OK, True)]


def test_etcd_errors_that_may_follow_a_proposal_are_unknown() -> None:
    n1, n2 = ScriptedStub("n1", [LEADER_CHANGED]), ScriptedStub("n2", [INVALID])
    ops = target(n1, n2).attempts("c", Kind.PUT, b"k", b"v")
    # INVALID_ARGUMENT is not retried; conservatively unknown too (the workload never sends it).
    assert [op.outcome for op in ops] == [Outcome.UNKNOWN, Outcome.UNKNOWN]


def test_reads_that_failed_are_failures_and_retried() -> None:
    n1, n2 = ScriptedStub("n1", [RESET]), ScriptedStub("n2", [b"v"])
    client = target(n1, n2)
    ops = client.attempts("c", Kind.GET, b"k")
    assert [(op.outcome, op.value) for op in ops] == [(Outcome.FAIL, None), (Outcome.OK, b"v")]
    assert not n2.calls[0].serializable  # type: ignore[attr-defined]  # linearizable, etcd's default
    assert client.stats.answered == {"n2": 1} and client.stats.retried_unknown == 0


def test_a_pinned_client_never_moves() -> None:
    n1, n2 = ScriptedStub("n1", [LATE]), ScriptedStub("n2", [])
    ops = target(n1, n2, retry=False).attempts("c", Kind.PUT, b"k", b"v")
    assert [op.outcome for op in ops] == [Outcome.UNKNOWN] and not n2.calls


def test_an_op_gives_up_after_its_time() -> None:
    n1 = ScriptedStub("n1", [RESET] * 1000)
    ops = target(n1, op_timeout_s=0.0).attempts("c", Kind.GET, b"k")
    assert [op.outcome for op in ops] == [Outcome.FAIL]


def op(client: str, kind: Kind, call: int, ret: int | None, value: bytes | None = None,
       outcome: Outcome = Outcome.OK) -> Op:
    return Op(client, kind, b"k", call, ret, outcome, value=value)


def test_a_write_applied_twice_is_linearizable_only_as_two_attempts() -> None:
    """etcd applies a retried Put twice when its first attempt landed: reads see v, then another
    client's w, then v again. One op per attempt (the first unknown) explains it; one op for the
    whole retried write cannot, so recording it so would make the checker fail a correct server."""
    first = op("a", Kind.PUT, 0, None, b"v", Outcome.UNKNOWN)
    retry = op("a", Kind.PUT, 10, 60, b"v")
    others = [op("b", Kind.GET, 20, 22, b"v"), op("c", Kind.PUT, 30, 32, b"w"), op("b", Kind.GET, 40, 42, b"w"),
              op("b", Kind.GET, 70, 72, b"v")]
    assert check([first, retry, *others]).verdict is Verdict.LINEARIZABLE
    assert check([op("a", Kind.PUT, 0, 60, b"v"), *others]).verdict is Verdict.NOT_LINEARIZABLE
    # And a value nobody wrote is still caught.
    assert check([first, retry, *others, op("b", Kind.GET, 80, 82, b"x")]).verdict is Verdict.NOT_LINEARIZABLE


def test_many_unknown_attempts_of_one_write_keep_the_check_fast() -> None:
    """An etcd write retried through an election leaves dozens of unknown attempts of one value
    (54 in one leader-churn run). Once that value is read, none of them can be dropped; they are
    interchangeable, and the checker orders them by call. Before, 20 of them made a
    non-linearizable history run out of a 20 s budget (a "timed out" failure that names nothing)."""
    attempts = 40
    ops = [op("a", Kind.PUT, i * 10, None, b"v", Outcome.UNKNOWN) for i in range(attempts)]
    for i in range(attempts):
        ops += [op("b", Kind.PUT, i * 10 + 1, i * 10 + 2, f"w{i}".encode()),
                op("c", Kind.GET, i * 10 + 3, i * 10 + 4, f"w{i}".encode())]
    ops.append(op("c", Kind.GET, attempts * 10 + 5, attempts * 10 + 6, b"v"))
    assert check(ops, budget_s=5.0).verdict is Verdict.LINEARIZABLE
    stale = op("c", Kind.GET, attempts * 10 + 7, attempts * 10 + 8, b"w0")  # w0 was overwritten long ago
    result = check([*ops, stale], budget_s=5.0)
    assert result.verdict is Verdict.NOT_LINEARIZABLE, result.report()
