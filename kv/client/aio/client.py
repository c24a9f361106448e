"""kv.aio.Client: kv.Client on asyncio (grpc.aio). The same methods, arguments, answers and
kv.errors, awaited; the same retries (tenacity's backoff within the timeout, leader hints, the next
endpoint after a failure); the same exactly-once writes through a client session the cluster
issues. Each call is a unary gRPC call (kv.Client's request streams and pipelines are for threads).

    async with Client(["127.0.0.1:7001", "127.0.0.1:7002"], timeout=5.0) as c:
        await c.put("user/1", "alice"); await c.get("user/1")  # -> b"alice"

What is the same logic as kv.Client's is kv.Client's: request building and answer decoding
(kv/client/client.py, revisions.py, lease.py, status.py), the retry policy and routing
(retries.py, Client._reroute), error mapping (kv.errors.from_rpc_error). A Client belongs to the
event loop it is first used on."""
from __future__ import annotations

import asyncio
import heapq
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
from tenacity import AsyncRetrying

from kv.client.leader_hints import LeaderHinted
from kv.client.aio.lease import Lease, Leases
from kv.client.aio.members import Members
from kv.client.aio.revisions import Changes, Revisions
from kv.client.aio.watch import Watch
from kv.client.client import (
    CHANNEL_OPTIONS,
    batch_request,
    consistency_level,
    parse_endpoints,
    scan_pages,
    unknown_outcome,
)
from kv.client.client import Client as _SyncClient
from kv.client.credentials import Credentials, Metadata
from kv.client.key_like import KeyLike, to_bytes
from kv.client.retries import MIN_ATTEMPT_S, Attempts, retry_policy, running_out_error
from kv.client.status import alarm_dicts, status_dict
from kv.client.tls import TLS, with_hint
from kv.client.watch import watch_range
from kv.errors import (
    FailedPreconditionError,
    RaftKVError,
    UnauthenticatedError,
    UnknownSessionError,
    from_rpc_error,
)
from kv.errors import TimeoutError as KVTimeoutError
from raftkv_proto import etcd_rpc_pb2 as pb_etcd
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2, kv_pb2_grpc

# The cluster checks a retried write by (client id, seq) among the last 1,024 seqs of its session
# (statemachine/client_sessions.py, session_window); an older seq is refused as expired, its
# outcome unknown. The tasks of one Client share one session, so a write takes its seq only while
# that seq stays within the window of the oldest write still in flight.
SESSION_WINDOW = 1024

Method = Callable[[kv_pb2_grpc.KVStub], Callable[..., Awaitable[Any]]]


class _Session:
    """The Client's client session, shared by its tasks: its id (issued by the cluster) and the
    seqs of its writes in flight."""

    def __init__(self) -> None:
        self.client_id: str | None = None
        self._next_seq = 1
        self._in_flight: set[int] = set()
        self._oldest: list[int] = []  # a heap of the seqs in flight (finished ones are dropped lazily)
        self._changed = asyncio.Event()

    def renew(self, client_id: str) -> None:
        self.client_id, self._next_seq, self._in_flight, self._oldest = client_id, 1, set(), []
        self._wake()

    def forget(self, client_id: str) -> None:
        """The cluster no longer knows `client_id`: the next write registers a new session."""
        if self.client_id == client_id:
            self.client_id = None
            self._wake()

    def take_seq(self) -> tuple[str, int] | None:
        """(client id, seq) for a write, or None while the next seq would leave the window of the
        oldest write in flight (then wait for `changed`)."""
        assert self.client_id is not None
        while self._oldest and self._oldest[0] not in self._in_flight:
            heapq.heappop(self._oldest)
        if self._oldest and self._next_seq - self._oldest[0] >= SESSION_WINDOW:
            return None
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        self._in_flight.add(seq)
        heapq.heappush(self._oldest, seq)
        return self.client_id, seq

    def done(self, client_id: str, seq: int) -> None:
        """The write (client_id, seq) has its answer (or never will)."""
        if client_id == self.client_id:
            self._in_flight.discard(seq)
            self._wake()

    async def changed(self) -> None:
        await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class Client(Revisions, Changes, Leases, Members):
    """An asyncio client of a raftkv cluster; its arguments are kv.Client's (no `streams`: every
    call is unary). Use it in `async with`, or await close(). Its tasks share one client session,
    registered at the first write; a user with a password logs in at the first call.

    Beside kv.Client's data calls it has status and the alarms; the operator's snapshot and auth
    admin calls are kv.Client's only."""

    def __init__(self, endpoints: Sequence[str] | str, timeout: float = 5.0, client_id: str | None = None,
                 tls: TLS | None = None, user: str | None = None, password: str | None = None):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._credentials = Credentials(user, password)
        self.endpoints = parse_endpoints(endpoints)
        self.timeout = timeout
        self.client_id = client_id or uuid.uuid4().hex
        self.tls = tls
        self._channel_credentials = tls.credentials() if tls is not None else None
        self._lock = threading.Lock()  # _reroute's (kv.Client's); never held across an await
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, kv_pb2_grpc.KVStub] = {}
        self._preferred = self.endpoints[0]  # the last endpoint that served a request
        self._session = _Session()
        self._registering = asyncio.Lock()
        self._logging_in = asyncio.Lock()
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()
        self._closed = False

    # ---- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections; leases still kept alive stop being renewed (not revoked)."""
        self._closed = True
        for lease in list(self._leases):
            await lease.close(revoke=False)
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            await channel.close()

    # ---- the native API --------------------------------------------------------------------

    async def put(self, key: KeyLike, value: KeyLike, lease: int | None = None) -> int:
        """Write `value` under `key`; the raft index the write was committed at. With `lease`,
        the key goes when the lease does, and the return is the store's revision after the write
        (an etcd put: applied at least once, as etcd's)."""
        if lease:
            put = pb_etcd.PutRequest(key=to_bytes(key), value=to_bytes(value, "value"), lease=lease)
            return (await self._call(lambda stub: stub.etcd.Put, put)).header.revision
        request = kv_pb2.PutRequest(key=to_bytes(key), value=to_bytes(value, "value"))
        return (await self._write(lambda stub: stub.Put, request)).index

    async def get(self, key: KeyLike, consistency: str = "linearizable", revision: int | None = None) -> bytes | None:
        """The value under `key`, or None when it is absent; with `revision`, as it was then."""
        if revision is not None:
            kv = await self.get_kv(key, revision, consistency)
            return None if kv is None else kv.value
        request = kv_pb2.GetRequest(key=to_bytes(key), consistency=consistency_level(consistency))
        response = await self._call(lambda stub: stub.Get, request)
        return response.value if response.found else None

    async def delete(self, key: KeyLike) -> bool:
        """Delete `key`; True when it existed."""
        return (await self._write(lambda stub: stub.Delete, kv_pb2.DeleteRequest(key=to_bytes(key)))).existed

    async def scan(self, prefix: KeyLike | None = None, start: KeyLike | None = None, end: KeyLike | None = None,
                   limit: int = 100, consistency: str = "linearizable",
                   revision: int | None = None) -> list[tuple[bytes, bytes]]:
        """Up to `limit` (key, value) pairs in key order, by `prefix` or in [start, end), page
        after page; with `revision`, as they were then (kv.Client.scan)."""
        if revision is not None:
            return [(kv.key, kv.value) for kv in await self.scan_at(revision, prefix, start, end, limit)]
        pages = scan_pages(prefix, start, end, limit, consistency)
        try:
            request = next(pages)
            while True:
                request = pages.send(await self._call(lambda stub: stub.Scan, request))
        except StopIteration as done:
            return done.value

    async def batch(self, puts: Mapping[KeyLike, KeyLike] | Iterable[tuple[KeyLike, KeyLike]] = (),
                    deletes: Iterable[KeyLike] = ()) -> list[bool]:
        """Apply the puts, then the deletes, atomically in one raft entry; per op, whether its key
        existed just before it."""
        request = batch_request(puts, deletes)
        return await self._apply(request) if request.ops else []

    async def apply_ops(self, ops: Sequence[kv_pb2.Op]) -> list[bool]:
        """Apply `ops` (kv_pb2.Op) atomically in one raft entry, at most once however often it is
        retried; per op, whether its key existed."""
        return await self._apply(kv_pb2.BatchRequest(ops=ops)) if ops else []

    async def _apply(self, request: kv_pb2.BatchRequest) -> list[bool]:
        return list((await self._write(lambda stub: stub.Batch, request)).existed)

    def watch(self, key: KeyLike | None = None, prefix: KeyLike | None = None, start: KeyLike | None = None,
              end: KeyLike | None = None, start_revision: int | None = None, prev_kv: bool = False) -> Watch:
        """Every change to `key`, to the keys starting with `prefix`, or to those in [start, end),
        from `start_revision` on (None: from now), as an async iterator of WatchEvent that resumes
        by itself on another member when its stream breaks: each change once, in revision order
        (kv/client/aio/watch.py). Leave its `async with`, or close it, to end it."""
        first, range_end = watch_range(key, prefix, start, end)
        return Watch(self.endpoints, self._channel, self._metadata, first, range_end, start_revision or 0, prev_kv)

    # ---- the operator's calls (kv/client/maintenance.py) ------------------------------------

    async def status(self) -> list[dict[str, Any]]:
        """One dict per configured endpoint (asked at once); an endpoint that does not answer
        gives {"address": ..., "error": ...}."""
        async def one(address: str) -> dict[str, Any]:
            try:
                response = await self._stub(address).Status(kv_pb2.StatusRequest(), timeout=self.timeout,
                                                             metadata=self._credentials.metadata)
            except grpc.RpcError as rpc_error:
                return {"address": address, "error": with_hint(str(from_rpc_error(rpc_error)), self.tls)}
            return status_dict(response, address)
        return list(await asyncio.gather(*(one(address) for address in self.endpoints)))

    async def alarm_list(self) -> list[dict[str, str]]:
        """The raised alarms: [{"member_id": "n2", "alarm": "NOSPACE"}, ...]."""
        return alarm_dicts((await self._call(lambda stub: stub.Alarm, kv_pb2.AlarmRequest())).alarms)

    async def alarm_disarm(self, member_id: str = "", alarm: str = "") -> list[dict[str, str]]:
        """Clear `member_id`'s `alarm` (with neither, every alarm); the alarms still raised."""
        request = kv_pb2.AlarmRequest(action=kv_pb2.AlarmRequest.DEACTIVATE, member_id=member_id,
                                      alarm=kv_pb2.AlarmType.Value(alarm) if alarm else kv_pb2.NONE)
        return alarm_dicts((await self._call(lambda stub: stub.Alarm, request)).alarms)

    # ---- exactly-once writes ----------------------------------------------------------------

    async def _write(self, method: Method, request: Any) -> Any:
        """`_call` for a write, in the client session (registered first if it has none), with the
        rule of kv.Client._write: an UNKNOWN_SESSION answer to the write's first attempt means
        nothing of it was applied, so it is sent again, once, in a new session; after a later
        attempt the outcome is unknown: UnknownSessionError."""
        deadline = time.monotonic() + self.timeout
        for last_chance in (False, True):
            client_id, seq = await self._take_seq(deadline)
            request.header.client_id, request.header.seq = client_id, seq
            attempts = Attempts(deadline=deadline, target=self._preferred)
            try:
                return await self._call(method, request, attempts)
            except UnknownSessionError as error:
                self._session.forget(client_id)
                if attempts.sent > 1:
                    raise unknown_outcome(error, attempts.sent) from None
                if last_chance:
                    raise
            finally:
                self._session.done(client_id, seq)
        raise AssertionError("unreachable")

    async def _take_seq(self, deadline: float) -> tuple[str, int]:
        """The (client id, seq) of a write: in the session, registered first if there is none."""
        session = self._session
        while True:
            if session.client_id is None:
                async with self._registering:  # one task registers; the others find its session
                    if session.client_id is None:
                        session.renew(await self._register(deadline))
                continue
            taken = session.take_seq()
            if taken is not None:
                return taken
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    await session.changed()
            except TimeoutError:
                raise KVTimeoutError(f"{SESSION_WINDOW} writes of this client were in flight for the whole "
                                     f"{self.timeout:g}s timeout: no more could be sent") from None

    async def _register(self, deadline: float) -> str:
        """A new client session's id, issued by the cluster."""
        request = kv_pb2.RegisterClientRequest(name=self.client_id)
        attempts = Attempts(deadline=deadline, target=self._preferred)
        return (await self._call(lambda stub: stub.RegisterClient, request, attempts)).client_id

    # ---- authentication ---------------------------------------------------------------------

    async def _metadata(self) -> Metadata | None:
        """The metadata of a call, logged in first when the client has a password and has not yet."""
        await self._log_in_once(time.monotonic() + self.timeout)
        return self._credentials.metadata

    async def _log_in_once(self, deadline: float) -> None:
        if self._credentials.needs_login:
            await self._log_in(None, deadline)

    async def _log_in(self, stale: Metadata | None, deadline: float) -> bool:
        """Get a token in place of the metadata `stale` (kv.Client._log_in); False without a password."""
        credentials = self._credentials
        async with self._logging_in:
            if credentials.password is None:
                return False
            if credentials.metadata != stale and credentials.logged_in:
                return True  # another task logged in meanwhile
            request = kv_pb2.AuthenticateRequest(name=credentials.user or "", password=credentials.password)
            attempts = Attempts(deadline=deadline, target=self._preferred)
            try:
                token = (await self._retrying_call(lambda stub: stub.Authenticate, request, attempts)).token
            except FailedPreconditionError:
                token = None  # auth is not enabled: calls go without a token until it is
            credentials.use_token(token)
        return True

    # ---- routing and retries ----------------------------------------------------------------

    async def _call(self, method: Method, request: Any, attempts: Attempts | None = None) -> Any:
        """Send `request` until one node serves it or the timeout runs out (kv.Client._call): the
        same request object on every attempt, a refused token renewed once."""
        if attempts is None:
            attempts = Attempts(deadline=time.monotonic() + self.timeout, target=self._preferred)
        await self._log_in_once(attempts.deadline)
        sent_with = self._credentials.metadata
        try:
            return await self._retrying_call(method, request, attempts)
        except UnauthenticatedError:
            if not await self._log_in(sent_with, attempts.deadline):
                raise
        return await self._retrying_call(method, request, attempts)

    async def _retrying_call(self, method: Method, request: Any, attempts: Attempts) -> Any:
        try:
            return await self._attempt(method, request, attempts)
        except RaftKVError as error:
            if not error.retryable:
                raise
            first_failure = error
        # As kv.Client: only a failed call pays for the retry machinery, which starts from that failure.
        failures = [first_failure]

        async def attempt() -> Any:
            if failures:
                raise failures.pop()
            return await self._attempt(method, request, attempts)

        retrying = AsyncRetrying(**retry_policy(attempts), sleep=lambda seconds: self._pause(attempts, seconds))
        try:
            return await retrying(attempt)
        except RaftKVError as error:
            raise running_out_error(error, attempts, self.timeout, self.endpoints) from None

    async def _attempt(self, method: Method, request: Any, attempts: Attempts) -> Any:
        target = attempts.target
        attempts.sent += 1
        try:
            try:
                response = await method(self._stub(target))(request, timeout=max(attempts.remaining(), MIN_ATTEMPT_S),
                                                            metadata=self._credentials.metadata)
            except grpc.RpcError as rpc_error:
                raise from_rpc_error(rpc_error) from None
        except RaftKVError as error:
            self._hinted(error)
            attempts.record(target, error)
            self._reroute(attempts, error)
            raise
        self._preferred = target
        return response

    async def _pause(self, attempts: Attempts, seconds: float) -> None:
        """The pause before the next attempt; after one that found no connection, a Status call
        that waits for the next target's connection, so that it ends once the node is reachable
        (kv.Client._pause)."""
        stub = self._stubs.get(attempts.target) if attempts.unconnected and not self._closed else None
        if stub is None:
            await asyncio.sleep(seconds)
            return
        try:
            await stub.Status(kv_pb2.StatusRequest(), timeout=seconds, wait_for_ready=True)
        except (grpc.RpcError, grpc.aio.UsageError):  # not connected in time, or the client closed meanwhile
            pass

    # The same rules as kv.Client's: where the next attempt goes (a hint, else the next endpoint,
    # and later calls start there), and the TLS hint on a failed connection.
    _reroute = _SyncClient._reroute
    _next_endpoint = _SyncClient._next_endpoint
    _hinted = _SyncClient._hinted

    # ---- connections ------------------------------------------------------------------------

    def _stub(self, address: str) -> kv_pb2_grpc.KVStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channel(address)
            stub = self._stubs[address] = kv_pb2_grpc.KVStub(channel)
            # etcd's KV and Lease services on the same channel, found on the stub as kv.Client's are.
            stub.etcd = LeaderHinted(etcd_rpc_pb2_grpc.KVStub(channel))  # type: ignore[attr-defined]
            stub.etcd_lease = LeaderHinted(etcd_rpc_pb2_grpc.LeaseStub(channel))  # type: ignore[attr-defined]
            # etcd's Cluster and Maintenance services, for kv.client.aio.members' calls.
            stub.etcd_members = (etcd_rpc_pb2_grpc.ClusterStub(channel),  # type: ignore[attr-defined]
                                 etcd_rpc_pb2_grpc.MaintenanceStub(channel))
        return stub

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self._closed:
            raise RuntimeError("the client is closed")
        channel = self._channels.get(address)
        if channel is None:
            if self._channel_credentials is None:
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.secure_channel(address, self._channel_credentials, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

