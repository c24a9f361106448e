"""kv.aio.Client: kv.Client on asyncio (grpc.aio). The same methods, arguments, answers and
kv.errors, awaited; the same retries (random exponential backoff within the timeout, leader
hints, the next endpoint after a failure); the same exactly-once writes through a client session
the cluster issues. Each call is a unary gRPC call (kv.Client's request streams and pipelines are
for threads).

    async with Client(["127.0.0.1:7001", "127.0.0.1:7002"], timeout=5.0) as c:
        await c.put("user/1", "alice"); await c.get("user/1")  # -> b"alice"

What is the same logic as kv.Client's is kv.Client's: request building and answer decoding
(kv/client/client.py, revisions.py, lease.py, status.py), every decision of a call - routing and
retries (router.py), login (login.py), client sessions (session.py), made without I/O - and error
mapping (kv.errors.from_rpc_error); this client does their steps with awaited grpc.aio calls. A
Client belongs to the event loop it is first used on."""
from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from kv.client.aio.lease import Lease, Leases
from kv.client.aio.members import Members
from kv.client.aio.revisions import Changes, Revisions
from kv.client.aio.watch import Watch
from kv.client.client import CHANNEL_OPTIONS, batch_request, consistency_level, scan_pages
from kv.client.credentials import Credentials, Metadata
from kv.client.key_like import KeyLike, to_bytes
from kv.client.leader_hints import client_stub
from kv.client.login import LogIn, Login, LoginResult
from kv.client.retries import Attempts
from kv.client.router import Pause, Router, Send, run_async
from kv.client.session import AwaitSeq, Register, SessionWrites, SharedSession
from kv.client.status import alarm_dicts, status_dict
from kv.client.tls import TLS, with_hint
from kv.client.watch import watch_range
from kv.errors import from_rpc_error
from raftkv_proto import etcd_rpc_pb2 as pb_etcd
from raftkv_proto import kv_pb2, kv_pb2_grpc

Method = Callable[[kv_pb2_grpc.KVStub], Callable[..., Awaitable[Any]]]


class Client(Revisions, Changes, Leases, Members):
    """An asyncio client of a raftkv cluster; its arguments are kv.Client's (no `streams`: every
    call is unary). Use it in `async with`, or await close(). Its tasks share one client session,
    registered at the first write; a user with a password logs in at the first call.

    Beside kv.Client's data calls it has status and the alarms; the operator's snapshot and auth
    admin calls are kv.Client's only."""

    def __init__(self, endpoints: Sequence[str] | str, timeout: float = 5.0, client_id: str | None = None,
                 tls: TLS | None = None, user: str | None = None, password: str | None = None):
        self._router = Router(endpoints, timeout, tls)
        self._credentials = Credentials(user, password)
        self._login = Login(self._credentials, self._router)
        self.endpoints = self._router.endpoints
        self.timeout = timeout
        self.client_id = client_id or uuid.uuid4().hex
        self._writes = SessionWrites(self._login, self.client_id)
        self.tls = tls
        self._channel_credentials = tls.credentials() if tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, kv_pb2_grpc.KVStub] = {}
        self._session_changed = asyncio.Event()  # replaced after each change (_wake_seq_waiters)
        self._session = SharedSession(on_change=self._wake_seq_waiters)
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
                   revision: int | None = None, keys_only: bool = False) -> list[tuple[bytes, bytes]]:
        """Up to `limit` (key, value) pairs in key order, by `prefix` or in [start, end), page
        after page; with `revision`, as they were then; with `keys_only`, values b"" (kv.Client.scan)."""
        if revision is not None:
            return [(kv.key, kv.value)
                    for kv in await self.scan_at(revision, prefix, start, end, limit, keys_only=keys_only)]
        pages = scan_pages(prefix, start, end, limit, consistency, keys_only)
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

    # ---- the steps of a call, done with awaited I/O (kv/client/router.py) ---------------------

    async def _call(self, method: Method, request: Any, attempts: Attempts | None = None) -> Any:
        """Send `request` until one node serves it or the timeout runs out (Login.call: logged in
        first, a refused token renewed once)."""
        return await run_async(self._login.call(method, request, "", attempts), self._perform)

    async def _write(self, method: Method, request: Any) -> Any:
        """`_call` for a write, in the client session its tasks share (SessionWrites.write)."""
        return await run_async(self._writes.write(self._session, method, request), self._perform)

    async def _perform(self, step: Any) -> Any:
        """Do one step of a call; its answer."""
        if type(step) is Send:
            return await self._send(step)
        if type(step) is Pause:
            return await self._pause(step)
        if type(step) is LogIn:
            return await self._log_in(step.stale, step.deadline)
        if type(step) is Register:
            async with self._registering:  # one task registers; the others find its session
                if step.session.client_id is None:
                    step.session.renew(await run_async(self._writes.register(step.deadline), self._perform))
            return None
        if type(step) is AwaitSeq:
            return await self._await_seq(step.deadline)
        raise TypeError(f"kv.aio.Client cannot do {step!r}")

    async def _send(self, step: Send) -> Any:
        try:
            return await step.method(self._stub(step.target))(step.request, timeout=step.timeout,
                                                              metadata=self._credentials.metadata)
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None

    async def _pause(self, pause: Pause) -> None:
        """The pause before the next attempt; after one that found no connection, a Status call
        that waits for the next target's connection, so that it ends once the node is reachable
        (kv.Client._pause)."""
        stub = self._stubs.get(pause.reconnect) if pause.reconnect and not self._closed else None
        if stub is None:
            await asyncio.sleep(pause.seconds)
            return
        try:
            await stub.Status(kv_pb2.StatusRequest(), timeout=pause.seconds, wait_for_ready=True)
        except (grpc.RpcError, grpc.aio.UsageError):  # not connected in time, or the client closed meanwhile
            pass

    async def _await_seq(self, deadline: float) -> bool:
        """Wait until the client session changes; False when `deadline` comes first."""
        changed = self._session_changed
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await changed.wait()
        except TimeoutError:
            return False
        return True

    def _wake_seq_waiters(self) -> None:
        self._session_changed.set()
        self._session_changed = asyncio.Event()

    # ---- authentication ---------------------------------------------------------------------

    async def _metadata(self) -> Metadata | None:
        """The metadata of a call, logged in first when the client has a password and has not yet."""
        if self._login.due:
            await self._log_in(None, time.monotonic() + self.timeout)
        return self._credentials.metadata

    async def _log_in(self, stale: Metadata | None, deadline: float) -> bool:
        """Log in in place of the metadata `stale` (Login.log_in), one task at a time; False
        without a password."""
        async with self._logging_in:
            result = await run_async(self._login.log_in(stale, deadline), self._perform)
        return result is not LoginResult.NO_PASSWORD

    # ---- connections ------------------------------------------------------------------------

    def _stub(self, address: str) -> kv_pb2_grpc.KVStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = client_stub(self._channel(address))
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
