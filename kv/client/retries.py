"""How one client call is retried: where its next attempt goes (a leader hint, else the next
endpoint), how long it waits before it (tenacity's random exponential backoff, shorter while an
election is under way, never past the deadline), and what each endpoint answered, for the error of a call that
runs out of time. Plain objects without I/O: kv/client/router.py drives them for both clients."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tenacity import RetryCallState, wait_random_exponential

from kv.client.tls import HINT_MARK
from kv.errors import NotLeaderError, RaftKVError, UnavailableError
from kv.errors import TimeoutError as KVTimeoutError

# Backoff between attempts: random exponential from ~15 ms, capped so the client notices a new
# leader soon after an election.
BACKOFF_BASE_S = 0.015
BACKOFF_MAX_S = 0.5
# While no node knows a leader (an election is under way) the cap is lower: an election is over
# in well under a second and the cluster is idle meanwhile, so waiting up to BACKOFF_MAX_S after
# it would only add to the failover time (W7, 10 trials: p50 1.64 -> 1.48 s).
ELECTION_BACKOFF_MAX_S = 0.1
# Do not start an attempt with less time than this left: it could only end in DEADLINE_EXCEEDED,
# hiding the more useful error of the attempt before.
MIN_ATTEMPT_S = 0.01
# How an endpoint's answer starts when the call never connected to it.
NO_CONNECTION = "no connection"
# Consecutive "not leader" hints followed without backoff, so two nodes pointing at each other
# during a leader change do not spin.
MAX_FREE_HOPS = 3


@dataclass(slots=True)
class Attempts:
    """Where one call goes next, how long it has left, and how many attempts were sent."""

    deadline: float
    target: str
    free_hops: int = 0
    follow_now: bool = False
    # The last attempt found no connection to its node (refused, unreachable, a failed handshake).
    unconnected: bool = False
    sent: int = 0
    # What each endpoint tried last answered, for the error of a call that runs out of time.
    answers: dict[str, str] = field(default_factory=dict)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, target: str, error: RaftKVError) -> None:
        """Note how the attempt at `target` failed. A timeout at an endpoint this call found no
        connection to before is still no connection: the attempt spent its time connecting (the
        last attempt of a call has what time is left, on a busy machine less than a reconnect)."""
        earlier = self.answers.get(target, "")
        if isinstance(error, KVTimeoutError) and earlier.startswith(NO_CONNECTION):
            self.unconnected = True
            return
        self.answers[target] = answer_of(error)
        self.unconnected = isinstance(error, UnavailableError) and "failed to connect" in str(error).lower()

    def reached_no_endpoint(self) -> bool:
        """Every endpoint tried answered "no connection": the request reached no member."""
        return bool(self.answers) and all(a.startswith(NO_CONNECTION) for a in self.answers.values())

    def summary(self, endpoints: Sequence[str]) -> str:
        """What happened at each endpoint: "A: refused the connection; B: not the leader ..." """
        return "; ".join(f"{e}: {self.answers.get(e, 'not tried')}" for e in [*endpoints, *sorted(
            set(self.answers) - set(endpoints))])


def answer_of(error: RaftKVError) -> str:
    """One endpoint's failure in a few words."""
    if isinstance(error, NotLeaderError):
        return f"not the leader (leader: {error.leader_id} at {error.leader_address})" if error.leader_address \
            else "not the leader, and knows no leader"
    text = str(error)
    if isinstance(error, UnavailableError) and HINT_MARK in text:  # a TLS mismatch, not a member down
        return f"{NO_CONNECTION} {text[text.index(HINT_MARK):]}"
    if isinstance(error, UnavailableError) and ("failed to connect" in text.lower() or "refused" in text.lower()):
        return f"{NO_CONNECTION} (refused or timed out: is the member running?)"
    if isinstance(error, KVTimeoutError):
        return "no answer in time"
    return f"{error.kind}: {text}"


@dataclass(slots=True)
class Backoff:
    """The pauses of one run of attempts (a run after a new login starts again from the first):
    none to follow a fresh leader hint, else tenacity's random exponential backoff (uniform up to
    a window that doubles from BACKOFF_BASE_S to BACKOFF_MAX_S), never past the point where one
    last attempt still fits before the deadline. The router (router.py) asks it between attempts,
    so that one object serves the blocking and the asyncio client alike."""

    attempts: Attempts
    failed: int = 0  # the run's failed attempts so far
    backoff: wait_random_exponential = field(
        default_factory=lambda: wait_random_exponential(multiplier=BACKOFF_BASE_S, max=BACKOFF_MAX_S))

    def pause_after(self, error: RaftKVError) -> float | None:
        """The pause before the next attempt after the retryable `error`; None when not even one
        more attempt fits before the deadline (the pause always leaves MIN_ATTEMPT_S for it)."""
        self.failed += 1
        if self.attempts.remaining() < 2 * MIN_ATTEMPT_S:
            return None
        if self.attempts.follow_now:
            return 0.0
        pause = self.backoff(_attempt(self.failed))
        if isinstance(error, NotLeaderError) and error.leader_address is None:
            pause = min(pause, ELECTION_BACKOFF_MAX_S)
        # Keep the last attempt: sleep at most until just before the deadline.
        return max(0.0, min(pause, self.attempts.remaining() - MIN_ATTEMPT_S))


def _attempt(number: int) -> RetryCallState:
    """What tenacity's wait strategies read: the number of the attempt that failed."""
    state = RetryCallState(None, None, (), {})
    state.attempt_number = number
    return state


def running_out_error(error: RaftKVError, attempts: Attempts, timeout: float, endpoints: Sequence[str]) -> RaftKVError:
    """The error of a call that ran out of time with the retryable `error`, saying what every
    endpoint answered (the last node's error alone blames that node). When the request reached no
    member it is UnavailableError, whatever the last attempt ended with: a member that is down is
    unavailable, not slow, however little time the last attempt had to find that out."""
    if not (error.retryable and attempts.answers):
        return error
    message = f"no node served the request within {timeout:g}s ({attempts.summary(endpoints)})"
    if isinstance(error, KVTimeoutError) and attempts.reached_no_endpoint():
        return UnavailableError(message)
    error.args = (message,)
    return error
