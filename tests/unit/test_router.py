"""The decisions of a client call without I/O (kv/client/router.py, login.py, session.py): each
test plays the nodes' answers into a call's steps by hand and checks what the steps ask for next."""
from __future__ import annotations

import time
from typing import Any

import pytest

from kv.client.credentials import Credentials
from kv.client.login import LogIn, Login
from kv.client.retries import BACKOFF_BASE_S, ELECTION_BACKOFF_MAX_S, MAX_FREE_HOPS, Attempts, Backoff
from kv.client.router import Pause, Router, Send, Steps
from kv.client.session import ClientSession, Register, SessionWrites, SharedSession
from kv.client import session as client_session
from kv.errors import NotLeaderError, UnauthenticatedError, UnavailableError, UnknownSessionError
from raftkv_proto import kv_pb2

A, B, C = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"
REFUSED = UnavailableError("failed to connect to all addresses; last error: UNKNOWN: Connection refused")


def put(stub: Any) -> Any:
    return stub.Put


def first(steps: Steps[Any]) -> Any:
    return steps.send(None)


def finish(steps: Steps[Any], answer: Any) -> Any:
    with pytest.raises(StopIteration) as done:
        steps.send(answer)
    return done.value.value


def test_a_hint_is_followed_at_once_and_later_calls_start_at_the_leader() -> None:
    router = Router([A, B, C], timeout=5.0)
    steps = router.retried(put, kv_pb2.PutRequest(), "put", router.begin())
    assert first(steps).target == A
    assert steps.throw(NotLeaderError("n3", C)) == Pause(0.0, None)
    send = steps.send(None)
    assert isinstance(send, Send) and send.target == C
    assert finish(steps, "served") == "served"
    assert router.preferred == C


def test_hints_past_the_free_hops_back_off() -> None:
    router = Router([A, B], timeout=5.0)
    steps = router.retried(put, kv_pb2.PutRequest(), "put", router.begin())
    first(steps)
    pauses = []
    for hop in range(MAX_FREE_HOPS + 1):  # two nodes that name each other as the leader
        pauses.append(steps.throw(NotLeaderError("n", B if hop % 2 == 0 else A)))
        steps.send(None)
    assert [p.seconds for p in pauses[:MAX_FREE_HOPS]] == [0.0] * MAX_FREE_HOPS
    assert 0.0 <= pauses[MAX_FREE_HOPS].seconds <= BACKOFF_BASE_S * 2 ** MAX_FREE_HOPS


def test_an_unreachable_node_sends_this_call_and_later_ones_to_the_next_endpoint() -> None:
    router = Router([A, B], timeout=5.0)
    steps = router.retried(put, kv_pb2.PutRequest(), "put", router.begin())
    first(steps)
    pause = steps.throw(REFUSED)
    assert pause.reconnect == B  # the pause may end once B is reachable
    assert router.preferred == B and steps.send(None).target == B


def test_a_call_out_of_time_says_what_each_endpoint_answered() -> None:
    router = Router([A, B], timeout=1.0)
    steps = router.retried(put, kv_pb2.PutRequest(), "put", router.begin(time.monotonic() + 0.005))
    first(steps)
    with pytest.raises(UnavailableError, match=f"no node served the request within 1s \\({A}: no connection"):
        steps.throw(REFUSED)


def test_backoff_stays_within_its_window_the_election_cap_and_the_deadline() -> None:
    backoff = Backoff(Attempts(deadline=time.monotonic() + 60, target=A))
    windows = [min(0.5, BACKOFF_BASE_S * 2 ** n) for n in range(40)]
    pauses = [backoff.pause_after(REFUSED) for _ in windows]
    assert all(0.0 <= p <= w for p, w in zip(pauses, windows))
    assert backoff.pause_after(NotLeaderError()) <= ELECTION_BACKOFF_MAX_S
    late = Backoff(Attempts(deadline=time.monotonic() + 0.05, target=A), failed=10)  # a window of 0.5 s
    assert late.pause_after(REFUSED) <= 0.05 - 0.01  # one last attempt still fits
    assert Backoff(Attempts(deadline=time.monotonic(), target=A)).pause_after(REFUSED) is None


def test_a_refused_token_logs_in_again_once_and_without_a_password_stays_refused() -> None:
    router = Router([A], timeout=5.0)
    credentials = Credentials("bob", "secret")
    credentials.use_token("old")
    steps = Login(credentials, router).call(put, kv_pb2.PutRequest())
    first(steps)
    log_in = steps.throw(UnauthenticatedError("token expired"))
    assert isinstance(log_in, LogIn) and log_in.stale == (("token", "old"),)
    assert steps.send(True).target == A  # sent again with the new token
    with pytest.raises(UnauthenticatedError):  # a second refusal is the caller's
        steps.throw(UnauthenticatedError("still refused"))

    no_password = Login(Credentials("carol"), router).call(put, kv_pb2.PutRequest())
    first(no_password)
    assert isinstance(no_password.throw(UnauthenticatedError("no token")), LogIn)
    with pytest.raises(UnauthenticatedError):
        no_password.send(False)


def test_an_expired_session_is_renewed_for_a_first_attempt_and_is_an_unknown_outcome_after_a_retry() -> None:
    writes = SessionWrites(Login(Credentials(), Router([A], timeout=5.0)), "me")
    session = ClientSession()
    request = kv_pb2.PutRequest(key=b"k")
    steps = writes.write(session, put, request)
    register = first(steps)
    assert register == Register(session, register.deadline)
    session.renew("1.aa")
    assert steps.send(None).target == A and (request.header.client_id, request.header.seq) == ("1.aa", 1)
    assert isinstance(steps.throw(UnknownSessionError("expired")), Register)  # nothing was applied
    assert session.client_id is None
    session.renew("2.bb")
    steps.send(None)
    assert (request.header.client_id, request.header.seq) == ("2.bb", 1)
    assert finish(steps, "applied") == "applied"

    retried = writes.write(session, put, request)
    first(retried)
    retried.throw(REFUSED)
    retried.send(None)  # the second attempt: the first may have been applied
    with pytest.raises(UnknownSessionError, match="sent 2 times .* its outcome is unknown"):
        retried.throw(UnknownSessionError("expired"))
    assert session.client_id is None


def test_a_shared_session_keeps_its_writes_in_flight_within_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_session, "SESSION_WINDOW", 3)
    changes = []
    session = SharedSession(on_change=lambda: changes.append(1))
    session.renew("1.aa")
    assert [session.take_seq() for _ in range(4)] == [("1.aa", 1), ("1.aa", 2), ("1.aa", 3), None]
    session.done("1.aa", 2)
    assert session.take_seq() is None  # seq 1, the oldest, is still in flight
    session.done("1.aa", 1)
    assert session.take_seq() == ("1.aa", 4)
    assert len(changes) == 3  # the renewal and each finished write
