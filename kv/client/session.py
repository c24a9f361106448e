"""A client's writes in client sessions the cluster issues (KV.RegisterClient), without I/O: the
session's sequence numbers, when to register, and what UNKNOWN_SESSION means for a write (the Raft
thesis, section 6.3; docs/architecture.md, Client sessions). Steps for kv/client/router.py's
drivers: kv.Client keeps a `ClientSession` per writing thread, kv.aio.Client one `SharedSession`
for all its tasks."""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kv.client.login import Login
from kv.client.router import Method, Steps
from kv.errors import TimeoutError as KVTimeoutError
from kv.errors import UnknownSessionError
from raftkv_proto import kv_pb2

# The cluster checks a retried write by (client id, seq) among the last 1,024 seqs of its session
# (statemachine/client_sessions.py, session_window); an older seq is refused as expired, its
# outcome unknown. A session shared by concurrent writers gives a write its seq only while that
# seq stays within the window of the oldest write still in flight.
SESSION_WINDOW = 1024


class ClientSession:
    """A session whose writes go one at a time and in order (kv.Client keeps one per writing
    thread), so however many threads write, no retry can fall out of the cluster's window. Its id
    is issued by the cluster at its first write; seqs count from 1."""

    __slots__ = ("client_id", "next_seq")

    def __init__(self) -> None:
        self.client_id: str | None = None
        self.next_seq = 1  # the seq of the session's next write

    def renew(self, client_id: str) -> None:
        self.client_id, self.next_seq = client_id, 1

    def forget(self, client_id: str) -> None:
        """The cluster no longer knows `client_id`: the next write registers a new session."""
        if self.client_id == client_id:
            self.client_id = None

    def take_seq(self) -> tuple[str, int] | None:
        """(client id, seq) for a write in the registered session."""
        assert self.client_id is not None
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return self.client_id, seq

    def done(self, client_id: str, seq: int) -> None:
        """The write (client_id, seq) has its answer (or never will)."""


class SharedSession(ClientSession):
    """A session shared by concurrent writers (kv.aio.Client's tasks), which keeps their seqs in
    flight within the cluster's window. `on_change` is called whenever a writer waiting for a seq
    (`AwaitSeq`) may find one: the session was renewed or forgotten, or a write finished."""

    __slots__ = ("_in_flight", "_oldest", "_on_change")

    def __init__(self, on_change: Callable[[], None]) -> None:
        super().__init__()
        self._in_flight: set[int] = set()
        self._oldest: list[int] = []  # a heap of the seqs in flight (finished ones are dropped lazily)
        self._on_change = on_change

    def renew(self, client_id: str) -> None:
        super().renew(client_id)
        self._in_flight, self._oldest = set(), []
        self._on_change()

    def forget(self, client_id: str) -> None:
        if self.client_id == client_id:
            self.client_id = None
            self._on_change()

    def take_seq(self) -> tuple[str, int] | None:
        """(client id, seq) for a write, or None while the next seq would leave the window of the
        oldest write in flight."""
        while self._oldest and self._oldest[0] not in self._in_flight:
            heapq.heappop(self._oldest)
        if self._oldest and self.next_seq - self._oldest[0] >= SESSION_WINDOW:
            return None
        taken = super().take_seq()
        assert taken is not None
        self._in_flight.add(taken[1])
        heapq.heappush(self._oldest, taken[1])
        return taken

    def done(self, client_id: str, seq: int) -> None:
        if client_id == self.client_id:
            self._in_flight.discard(seq)
            self._on_change()


@dataclass(frozen=True, slots=True)
class Register:
    """Give `session` an id from the cluster (`SessionWrites.register`) unless another writer has
    meanwhile: one writer of a shared session registers, the others find its id."""

    session: ClientSession
    deadline: float


@dataclass(frozen=True, slots=True)
class AwaitSeq:
    """Wait until `session` changes (SharedSession's `on_change`); answer True, or False when
    `deadline` came first."""

    session: ClientSession
    deadline: float


class SessionWrites:
    """A client's writes, each tagged with (client id, seq) of a session, so that however often
    one is retried it is applied at most once. `name` labels the sessions it registers."""

    def __init__(self, login: Login, name: str) -> None:
        self.login = login
        self.name = name

    def write(self, session: ClientSession, method: Method, request: Any, stream_field: str = "") -> Steps[Any]:
        """The steps of a write: `request.header` is set from `session`, which is registered first
        if it has no id. When the cluster answers UNKNOWN_SESSION (the session expired) to the
        write's first attempt, nothing of the write was applied: it is sent again, once, in a new
        session. After a later attempt an earlier one may have been applied, and a new session
        cannot tell: UnknownSessionError is raised (the outcome is unknown), and the next write
        registers a new session."""
        router = self.login.router
        deadline = time.monotonic() + router.timeout
        for last_chance in (False, True):
            client_id, seq = yield from self._take_seq(session, deadline)
            header = request.header
            header.client_id, header.seq = client_id, seq
            attempts = router.begin(deadline)
            try:
                return (yield from self.login.call(method, request, stream_field, attempts))
            except UnknownSessionError as error:
                session.forget(client_id)
                if attempts.sent > 1:
                    raise unknown_outcome(error, attempts.sent) from None
                if last_chance:
                    raise
            finally:
                session.done(client_id, seq)
        raise AssertionError("unreachable")

    def register(self, deadline: float) -> Steps[str]:
        """The steps of a registration: a new client session's id, issued by the cluster."""
        request = kv_pb2.RegisterClientRequest(name=self.name)
        attempts = self.login.router.begin(deadline)
        return (yield from self.login.call(lambda stub: stub.RegisterClient, request, "", attempts)).client_id

    def _take_seq(self, session: ClientSession, deadline: float) -> Steps[tuple[str, int]]:
        """(client id, seq) for a write: in the session, registered first if there is none."""
        while True:
            if session.client_id is None:
                yield Register(session, deadline)
                continue
            taken = session.take_seq()
            if taken is not None:
                return taken
            if not (yield AwaitSeq(session, deadline)):
                raise KVTimeoutError(f"{SESSION_WINDOW} writes of this client were in flight for the whole "
                                     f"{self.login.router.timeout:g}s timeout: no more could be sent")


def unknown_outcome(error: UnknownSessionError, sent: int) -> UnknownSessionError:
    """The error of a write whose session expired after it was sent `sent` (> 1) times."""
    return UnknownSessionError(
        f"{error}. This write was sent {sent} times and its client session expired meanwhile: an earlier "
        "attempt may have been applied (once), or not; its outcome is unknown")
