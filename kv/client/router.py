"""Where a client's calls go, and what a refusal means for the next attempt: the one router of
kv.Client and kv.aio.Client, without I/O.

A call's attempts are a generator of steps (`retried`), as scan_pages is a scan's: it yields
`Send` (one attempt at one node) and `Pause` (the wait before the next), is sent each answer or
thrown each RaftKVError, and returns the response or raises the call's error. login.py and
session.py build on these steps, so every decision of a call is made once; `run` drives them with
kv.Client's blocking gRPC calls, `run_async` with kv.aio.Client's awaited grpc.aio ones."""
from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from kv.client.retries import MAX_FREE_HOPS, MIN_ATTEMPT_S, Attempts, Backoff, running_out_error
from kv.client.tls import TLS, with_hint
from kv.errors import NotLeaderError, RaftKVError, UnavailableError
from kv.errors import TimeoutError as KVTimeoutError

T = TypeVar("T")
# How a stub's method is chosen for a call: `lambda stub: stub.Put`. The stub is a kv_pb2_grpc.KVStub
# (sync or grpc.aio) with etcd's stubs beside it (leader_hints.client_stub).
Method = Callable[[Any], Callable[..., Any]]


@dataclass(frozen=True, slots=True)
class Send:
    """Send `request` to `target` once, allowing `timeout` s; answer with the response, or throw
    the RaftKVError it failed with. With `stream_field` (its name in a kv_pb2.StreamRequest) it may
    go on a request stream (kv.Client's; kv.aio.Client makes every call unary)."""

    target: str
    method: Method
    request: Any
    stream_field: str
    timeout: float


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait `seconds` before the next attempt. `reconnect`: the next attempt's node, which the last
    attempt found no connection to; waiting for its connection may end the pause early."""

    seconds: float
    reconnect: str | None


# The steps of every generator of the client's calls (login.py and session.py add theirs).
Step = Union[Send, Pause, Any]
Steps = Generator[Step, Any, T]


def parse_endpoints(endpoints: Sequence[str] | str) -> list[str]:
    """"a:1,b:2" or ["a:1", "b:2"] -> ["a:1", "b:2"] (order kept, duplicates dropped)."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    cleaned = list(dict.fromkeys(e.strip() for e in items if e and e.strip()))
    if not cleaned:
        raise ValueError("at least one endpoint (host:port) is needed")
    for endpoint in cleaned:
        if ":" not in endpoint:
            raise ValueError(f"bad endpoint {endpoint!r}: expected host:port")
    return cleaned


class Router:
    """A client's endpoints and the one it prefers (the last that served a request, or the leader
    a refusal named): each call starts there, follows "not leader" hints, and moves on to the next
    endpoint after a failure. Shared by the threads (or tasks) of one client."""

    def __init__(self, endpoints: Sequence[str] | str, timeout: float, tls: TLS | None = None) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.endpoints = parse_endpoints(endpoints)
        self.timeout = timeout
        self.tls = tls
        self.preferred = self.endpoints[0]
        self._lock = threading.Lock()  # never held across I/O (nor an await)

    def begin(self, deadline: float | None = None) -> Attempts:
        """A new call's attempts, until `deadline` (default: the client's timeout from now)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        return Attempts(deadline=deadline, target=self.preferred)

    def retried(self, method: Method, request: Any, stream_field: str, attempts: Attempts) -> Steps[Any]:
        """Attempts at `request` until one node serves it, a node refuses it for good, or the
        deadline comes: then the last error, saying what every endpoint answered. The request
        object is the same on every attempt, so a write keeps its (client id, seq)."""
        backoff: Backoff | None = None  # most calls succeed at once and never need one
        while True:
            target = attempts.target
            attempts.sent += 1
            try:
                response = yield Send(target, method, request, stream_field,
                                      max(attempts.remaining(), MIN_ATTEMPT_S))
            except RaftKVError as error:
                self.hinted(error)
                attempts.record(target, error)
                self._reroute(attempts, error)
                if not error.retryable:
                    raise
                if backoff is None:
                    backoff = Backoff(attempts)
                pause = backoff.pause_after(error)
                if pause is None:
                    raise running_out_error(error, attempts, self.timeout, self.endpoints) from None
            else:
                with self._lock:
                    self.preferred = target
                return response
            yield Pause(pause, attempts.target if attempts.unconnected else None)

    def next_endpoint(self, after: str) -> str:
        """The configured endpoint after `after`, round robin."""
        if after not in self.endpoints:
            return self.endpoints[0]
        return self.endpoints[(self.endpoints.index(after) + 1) % len(self.endpoints)]

    def hinted(self, error: RaftKVError) -> RaftKVError:
        """`error`, its message followed by what to check when a failed connection looks like a TLS
        mismatch (kv/client/tls.py): otherwise a wrong CA reads as a node that is down."""
        if isinstance(error, UnavailableError):
            error.args = (with_hint(str(error), self.tls),)
        return error

    def _reroute(self, attempts: Attempts, error: RaftKVError) -> None:
        """Pick the next target after `error` from attempts.target."""
        hint = error.leader_address if isinstance(error, NotLeaderError) else None
        if hint and hint != attempts.target:
            attempts.follow_now = attempts.free_hops < MAX_FREE_HOPS
            attempts.free_hops += 1
            attempts.target = hint
            with self._lock:
                self.preferred = hint
            return
        attempts.follow_now = False
        if isinstance(error, (NotLeaderError, UnavailableError, KVTimeoutError)):
            failed, attempts.target = attempts.target, self.next_endpoint(attempts.target)
            with self._lock:
                # Later calls should not start at a node that just failed (it may hang on each).
                if self.preferred == failed:
                    self.preferred = attempts.target


def run(steps: Steps[T], perform: Callable[[Any], Any]) -> T:
    """Drive `steps` with blocking I/O (kv.Client): `perform(step)` does one step and returns its
    answer, or raises what it failed with, which is thrown into the steps to decide what it means.
    Whatever ends the run, the steps are closed (their `finally` clauses run at once)."""
    answer: Any = None
    failure: Exception | None = None
    try:
        while True:
            try:
                step = steps.send(answer) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            try:
                answer, failure = perform(step), None
            except Exception as error:  # noqa: BLE001 - the steps re-raise what they do not handle
                answer, failure = None, error
    finally:
        steps.close()


async def run_async(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """`run` with awaited I/O (kv.aio.Client): a cancelled task closes the steps too."""
    answer: Any = None
    failure: Exception | None = None
    try:
        while True:
            try:
                step = steps.send(answer) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            try:
                answer, failure = await perform(step), None
            except Exception as error:  # noqa: BLE001 - the steps re-raise what they do not handle
                answer, failure = None, error
    finally:
        steps.close()
