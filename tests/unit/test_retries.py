"""What a call that ran out of time says (kv/client/retries.py): each endpoint's answer, and the
error's kind. The attempts' errors are the ones kv.Client and kv.aio.Client record, in the order
a busy machine gives them."""
from __future__ import annotations

import time

from kv.client.retries import Attempts, running_out_error
from kv.errors import NotLeaderError, TimeoutError, UnavailableError

DOWN, UP = "127.0.0.1:7001", "127.0.0.1:7002"
REFUSED = UnavailableError("failed to connect to all addresses; last error: UNKNOWN: Connection refused")
TIMED_OUT = TimeoutError("Deadline Exceeded")


def attempts() -> Attempts:
    return Attempts(deadline=time.monotonic() + 5, target=DOWN)


def test_a_member_that_refused_and_then_ran_out_the_last_attempt_is_unavailable_not_slow() -> None:
    """Its last attempt had 10 ms left, spent reconnecting: the call never reached the member."""
    tried = attempts()
    tried.record(DOWN, REFUSED)
    tried.record(DOWN, TIMED_OUT)
    assert tried.unconnected
    error = running_out_error(TIMED_OUT, tried, 1.0, [DOWN])
    assert isinstance(error, UnavailableError)
    assert str(error) == ("no node served the request within 1s "
                          f"({DOWN}: no connection (refused or timed out: is the member running?))")


def test_a_timeout_at_a_member_that_answered_before_stays_a_timeout() -> None:
    """The request may have reached a member that answered once: it may still be applied later."""
    tried = attempts()
    tried.record(DOWN, REFUSED)
    tried.record(UP, NotLeaderError("not the leader"))
    tried.record(UP, TIMED_OUT)
    error = running_out_error(TIMED_OUT, tried, 2.0, [DOWN, UP])
    assert isinstance(error, TimeoutError)
    assert f"{UP}: no answer in time" in str(error) and f"{DOWN}: no connection" in str(error)


def test_a_call_that_only_ever_timed_out_is_a_timeout() -> None:
    tried = attempts()
    tried.record(DOWN, TIMED_OUT)
    assert not tried.unconnected
    assert isinstance(running_out_error(TIMED_OUT, tried, 1.0, [DOWN]), TimeoutError)
