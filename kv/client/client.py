"""The Python client of raftkv: finds the leader, follows "not leader" hints, retries within a
timeout, and tags every write with a client session the cluster issued (KV.RegisterClient) and a
sequence number, so that a retry is applied at most once. Those decisions are made without I/O in
router.py (endpoints, hints, retries), login.py (tokens) and session.py (sessions and sequence
numbers), which kv.aio.Client shares; a Client does their steps with blocking gRPC calls.

    with Client(["127.0.0.1:7001", "127.0.0.1:7002"], timeout=5.0) as c:
        c.put("user/1", "alice"); c.get("user/1")  # -> b"alice"
"""
from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

import grpc

from kv.client.auth_admin import AuthAdmin
from kv.client.changes import Changes
from kv.client.credentials import Credentials, Metadata
from kv.client.key_like import KeyLike, to_bytes
from kv.client.leader_hints import client_stub
from kv.client.lease import Leases
from kv.client.login import LogIn, Login, LoginResult
from kv.client.maintenance import Maintenance
from kv.client.members import Members
from kv.client.request_pipeline import HUB, Pipeline, fits
from kv.client.request_stream import RequestStream, StreamPool
from kv.client.retries import Attempts
from kv.client.revisions import Revisions
from kv.client.router import Method, Pause, Router, Send, run
from kv.client.session import ClientSession, Register, SessionWrites
from kv.client.tls import TLS, open_channel
from kv.client.watch import Watch, watch_range
from kv.errors import from_rpc_error
from raftkv_proto import etcd_rpc_pb2 as pb_etcd
from raftkv_proto import kv_pb2, kv_pb2_grpc
from raftkv_proto.key_ranges import prefix_end

CONSISTENCY = {
    "linearizable": kv_pb2.LINEARIZABLE,
    "lease": kv_pb2.LEASE,
    "stale": kv_pb2.STALE,
}

# A node that restarts should be reachable again within a few hundred ms, not grpc's default of
# seconds (the backoff after a refused connection); values up to the server's maximum times a scan
# page exceed grpc's 4 MiB default. Each Client keeps its own connections (grpc would otherwise
# share one per address across the process), so a node's several gRPC servers
# (kv/server/server_group.py) can accept from several clients at once.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 200),
    # gRPC also takes this as the time a connection attempt may take. At 100 ms, clients of a node
    # stalled for 3 s (SIGSTOP) dropped every half-open attempt and redialled; the node then had
    # to work through the pile, and 40 new clients were served 5-10 s after it resumed, or not
    # within their 10 s. At 1 s they were served 2-3 s after; an unreachable node that swallows
    # connections (a partition) still costs a client only 1 s before it tries another node.
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
)


class Client(AuthAdmin, Maintenance, Members, Revisions, Leases, Changes):
    """A thread-safe client of a raftkv cluster. See the module docstring.

    endpoints: "host:port,..." or a sequence of them (any members; the leader is found).
    timeout: seconds each call may take, retries included.
    client_id: a name for this client, sent when it registers a client session (default: random).
    It is only a label: the ids its writes carry are issued by the cluster, one session per writing
    thread, so clients given the same name never take each other's writes for retries.
    streams: send put, get and delete as messages on long-lived streams (kv/client/request_stream.py),
    which costs a node about half the CPU of a unary call; False: a unary call each.
    tls: connect with TLS (kv/client/tls.py), to nodes started with --cert-file; None: plaintext.
    Its files are read here, once; a file that cannot be read is a ValueError naming it.
    user, password: who the client is once the cluster has auth enabled (docs/security.md). With a
    password it logs in (KV.Authenticate) at its first call, sends the token with every call, and
    logs in again once when a token is refused (expired, or its password changed); a user with no
    password is for a client certificate that names it (the token-less identity).
    The admin methods (auth_enable, user_add, role_grant_permission, ...) are etcd clientv3's (AuthAdmin)."""

    def __init__(self, endpoints: Sequence[str] | str, timeout: float = 5.0, client_id: str | None = None,
                 streams: bool = True, tls: TLS | None = None, user: str | None = None,
                 password: str | None = None):
        self._router = Router(endpoints, timeout, tls)
        self._credentials = Credentials(user, password)
        self._login = Login(self._credentials, self._router)
        self.endpoints = self._router.endpoints
        self.timeout = timeout
        self.client_id = client_id or uuid.uuid4().hex
        self._writes = SessionWrites(self._login, self.client_id)
        self.tls = tls
        self._channel_credentials = tls.credentials() if tls is not None else None
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, kv_pb2_grpc.KVStub] = {}
        self._local = threading.local()  # the calling thread's ClientSession
        self._closed = False
        self._streams = StreamPool() if streams else None
        if self._streams is not None:
            # A client dropped without close() must not leave its streams' threads waiting forever.
            weakref.finalize(self, self._streams.close)
            self._pipelines = HUB.attach()
            weakref.finalize(self, self._pipelines.release_later)

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        if self._streams is not None:
            self._streams.close()
            HUB.forget(self._credentials.metadata)
            self._pipelines.release()
        for channel in channels:
            channel.close()

    # ---- the API ---------------------------------------------------------------------------

    def put(self, key: KeyLike, value: KeyLike, lease: int | None = None) -> int:
        """Write `value` under `key`; returns the raft index the write was committed at. With
        `lease` (an id: kv/client/lease.py), the key goes when the lease does, and the return is
        the store's revision after the write (an etcd put: applied at least once, as etcd's)."""
        if lease:
            put = pb_etcd.PutRequest(key=to_bytes(key), value=to_bytes(value, "value"), lease=lease)
            return self._call(lambda stub: stub.etcd.Put, put).header.revision
        request = kv_pb2.PutRequest(key=to_bytes(key), value=to_bytes(value, "value"))
        return self._write(lambda stub: stub.Put, request, "put").index

    def get(self, key: KeyLike, consistency: str = "linearizable", revision: int | None = None) -> bytes | None:
        """The value under `key`, or None when it is absent; with `revision`, as it was then
        (kv.errors.RevisionError for a compacted or future revision)."""
        if revision is not None:
            kv = self.get_kv(key, revision, consistency)
            return None if kv is None else kv.value
        request = kv_pb2.GetRequest(key=to_bytes(key), consistency=consistency_level(consistency))
        response = self._call(lambda stub: stub.Get, request, "get")
        return response.value if response.found else None

    def delete(self, key: KeyLike) -> bool:
        """Delete `key`; True when it existed."""
        request = kv_pb2.DeleteRequest(key=to_bytes(key))
        return self._write(lambda stub: stub.Delete, request, "delete").existed

    def scan(
        self,
        prefix: KeyLike | None = None,
        start: KeyLike | None = None,
        end: KeyLike | None = None,
        limit: int = 100,
        consistency: str = "linearizable",
        revision: int | None = None,
        keys_only: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """Up to `limit` (key, value) pairs in key order: those starting with `prefix`, or those
        in [start, end) (no end: to the last key). When the server cuts a page short of `limit`
        the client asks for the rest; each page is consistent on its own. With `revision`, the
        pairs as they were then, in one read (scan_at gives their revisions too). With
        `keys_only`, every value is b"" and no value crosses the network (etcd's --keys-only)."""
        if revision is not None:
            return [(kv.key, kv.value) for kv in self.scan_at(revision, prefix, start, end, limit, keys_only=keys_only)]
        return paged_scan(lambda request: self._call(lambda stub: stub.Scan, request),
                          prefix, start, end, limit, consistency, keys_only)

    def batch(
        self,
        puts: Mapping[KeyLike, KeyLike] | Iterable[tuple[KeyLike, KeyLike]] = (),
        deletes: Iterable[KeyLike] = (),
    ) -> list[bool]:
        """Apply the puts, then the deletes, atomically in one raft entry. Returns, per op in that
        order, whether its key existed just before that op."""
        request = batch_request(puts, deletes)
        return self._apply(request) if request.ops else []

    def watch(self, key: KeyLike | None = None, prefix: KeyLike | None = None, start: KeyLike | None = None,
              end: KeyLike | None = None, start_revision: int | None = None, prev_kv: bool = False) -> Watch:
        """Every change to `key`, to the keys starting with `prefix`, or to those in [start, end),
        from `start_revision` on (None: from now), as an iterator of WatchEvent that resumes by
        itself on another member when its stream breaks: each change exactly once, in revision
        order (kv/client/watch.py). Close it, or leave its `with`, to end it."""
        first, range_end = watch_range(key, prefix, start, end)
        self._log_in_once(time.monotonic() + self.timeout)
        return Watch(self.endpoints, lambda address: self._connection(address)[0], lambda: self._credentials.metadata,
                     first, range_end, start_revision or 0, prev_kv)

    def apply_ops(self, ops: Sequence[kv_pb2.Op]) -> list[bool]:
        """Apply `ops` (kv_pb2.Op: put, delete, delete_prefix, move_prefix) atomically in one raft
        entry, at most once however often it is retried. Returns per op whether its key existed."""
        return self._apply(kv_pb2.BatchRequest(ops=ops)) if ops else []

    def _apply(self, request: kv_pb2.BatchRequest) -> list[bool]:
        return list(self._write(lambda stub: stub.Batch, request).existed)

    # ---- the steps of a call, done with blocking I/O (kv/client/router.py) -------------------

    def _call(self, method: Method, request: Any, stream_field: str = "", attempts: Attempts | None = None) -> Any:
        """Send `request` until one node serves it or the timeout runs out (Login.call: logged in
        first, a refused token renewed once). With `stream_field` (its name in a
        kv_pb2.StreamRequest) it goes on a request stream when one is free."""
        return run(self._login.call(method, request, stream_field, attempts), self._perform)

    def _write(self, method: Method, request: Any, stream_field: str = "") -> Any:
        """`_call` for a write, in the calling thread's client session (SessionWrites.write)."""
        session: ClientSession | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = ClientSession()
        return run(self._writes.write(session, method, request, stream_field), self._perform)

    def _perform(self, step: Any) -> Any:
        """Do one step of a call; its answer."""
        if type(step) is Send:
            return self._send(step)
        if type(step) is Pause:
            return self._pause(step)
        if type(step) is LogIn:
            return self._log_in(step.stale, step.deadline)
        if type(step) is Register:  # the thread's own session: no other writer registers it
            return step.session.renew(run(self._writes.register(step.deadline), self._perform))
        raise TypeError(f"kv.Client cannot do {step!r}")

    def _send(self, step: Send) -> Any:
        """One attempt at the step's target: on the node's pipeline when this process has another
        request in flight there, else on a request stream when one is free, else as a unary call."""
        target, request, stream_field = step.target, step.request, step.stream_field
        channel, stub = self._connection(target)
        if stream_field and self._streams is not None:
            # A request too large to share a pipeline message goes alone: on a stream, or unary.
            busy = HUB.enter(target) and fits(_payload_bytes(stream_field, request))
            try:
                metadata = self._credentials.metadata
                carrier: Pipeline | RequestStream | None = (
                    HUB.pipeline(target, lambda: self._open_channel(target), self.tls, metadata) if busy
                    else self._streams.take(target, channel, metadata))
                if carrier is not None:
                    try:
                        return getattr(carrier.call(kv_pb2.StreamRequest(**{stream_field: request}), step.timeout),
                                       stream_field)
                    finally:
                        if isinstance(carrier, RequestStream):
                            self._streams.give_back(carrier)
            finally:
                HUB.leave(target)
        try:
            return step.method(stub)(request, timeout=step.timeout, metadata=self._credentials.metadata)
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None

    def _pause(self, pause: Pause) -> None:
        """The pause before the next attempt. After an attempt that found no connection, the pause
        is a Status call that waits for the next target's connection (wait_for_ready), so it ends
        early once the node is reachable, instead of a sleep: under gRPC's polling I/O manager
        (the CLI's, kv/tools/grpc_io.py) a channel in TRANSIENT_FAILURE reconnects only while some
        call polls it, and a sleeping client polls nothing. Seen: a CLI put to a cluster still
        starting reconnected after ~5 s in plaintext, and over TLS, whose handshake needs several
        polls, not within 15 s. (grpc.channel_ready_future would poll too, but its thread races
        the channel's close.)"""
        with self._lock:
            stub = self._stubs.get(pause.reconnect) if pause.reconnect and not self._closed else None
        if stub is None:
            time.sleep(pause.seconds)
            return
        try:
            stub.Status(kv_pb2.StatusRequest(), timeout=pause.seconds, wait_for_ready=True)
        except (grpc.RpcError, ValueError):  # not connected in time; ValueError: the client closed meanwhile
            pass

    # ---- connections -----------------------------------------------------------------------

    def _stub(self, address: str) -> kv_pb2_grpc.KVStub:
        return self._connection(address)[1]

    def _connection(self, address: str) -> tuple[grpc.Channel, kv_pb2_grpc.KVStub]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            stub = self._stubs.get(address)
            if stub is None:
                channel = self._channels[address] = self._open_channel(address)
                stub = self._stubs[address] = client_stub(channel)
            return self._channels[address], stub

    def _open_channel(self, address: str) -> grpc.Channel:
        """A new channel to `address`, with this client's TLS credentials when it has them."""
        return open_channel(address, self._channel_credentials, CHANNEL_OPTIONS)

    # ---- authentication ---------------------------------------------------------------------

    def call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The gRPC metadata this client sends with every call (its token; None without one),
        logged in first when it has a password and has not yet: for callers of raftkv's other
        services with the same user (kv/tools/spark/export_client.py)."""
        self._log_in_once(time.monotonic() + self.timeout)
        return self._credentials.metadata

    def renew_login(self, refused: tuple[tuple[str, str], ...] | None) -> bool:
        """Log in again after a call made with the metadata `refused` was UNAUTHENTICATED;
        False when the client has no password to do it with."""
        return self._log_in(refused, time.monotonic() + self.timeout)

    def _log_in_once(self, deadline: float) -> None:
        """Log in if the client has a password and no token yet (its first call)."""
        if self._login.due:
            self._log_in(None, deadline)

    def _log_in(self, stale: Metadata | None, deadline: float) -> bool:
        """Log in in place of the metadata `stale` (Login.log_in), one thread at a time; False
        when the client has no password to log in with."""
        with self._credentials.lock:
            old = self._credentials.metadata
            result = run(self._login.log_in(stale, deadline), self._perform)
        if result is LoginResult.LOGGED_IN and self._streams is not None:
            self._streams.reset()  # streams opened with the old token's metadata
            HUB.forget(old)
        return result is not LoginResult.NO_PASSWORD


MAX_PAGE_LIMIT = 2**32 - 1


def paged_scan(fetch: Callable[[kv_pb2.ScanRequest], kv_pb2.ScanResponse], prefix: KeyLike | None,
               start: KeyLike | None, end: KeyLike | None, limit: int, consistency: str,
               keys_only: bool = False) -> list[tuple[bytes, bytes]]:
    """A scan of up to `limit` pairs through `fetch`, asking for further pages when the server
    cuts one short, at its page limit or its byte budget (shared by the Client and the embedded
    node)."""
    pages = scan_pages(prefix, start, end, limit, consistency, keys_only)
    try:
        request = next(pages)
        while True:
            request = pages.send(fetch(request))
    except StopIteration as done:
        return done.value


def scan_pages(prefix: KeyLike | None, start: KeyLike | None, end: KeyLike | None, limit: int, consistency: str,
               keys_only: bool = False) -> Generator[kv_pb2.ScanRequest, kv_pb2.ScanResponse, list[tuple[bytes, bytes]]]:
    """A paged scan without its I/O: yields each page's request, is sent the page, and returns the
    pairs (paged_scan drives it with calls, kv.aio.Client with awaits)."""
    if prefix is not None and (start is not None or end is not None):
        raise ValueError("give either prefix or start/end, not both")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    lo = to_bytes(prefix if prefix is not None else start or b"", "start")
    hi = prefix_end(lo) if prefix is not None else to_bytes(end or b"", "end")
    level = consistency_level(consistency)
    items: list[tuple[bytes, bytes]] = []
    while len(items) < limit:
        # The node clamps a page to its own maximum; the request field is 32 bits wide.
        page_limit = min(limit - len(items), MAX_PAGE_LIMIT)
        response = yield kv_pb2.ScanRequest(start=lo, end=hi, limit=page_limit, consistency=level, keys_only=keys_only)
        items.extend((kv.key, kv.value) for kv in response.items)
        if not response.more or not response.items:
            break
        lo = items[-1][0] + b"\x00"  # the smallest key after the last one returned
    return items[:limit]


def _payload_bytes(kind: str, request: Any) -> int:
    """The key and value bytes a put, get or delete request carries."""
    return len(request.key) + len(request.value) if kind == "put" else len(request.key)


def batch_request(puts: Mapping[KeyLike, KeyLike] | Iterable[tuple[KeyLike, KeyLike]] = (),
                  deletes: Iterable[KeyLike] = ()) -> kv_pb2.BatchRequest:
    """The request of a batch: the puts, then the deletes. Each op is made in place in the
    request: an Op message made on its own is copied into the request's list, and with its
    KeyValue copied into it first that took 4x as long (2 us a put, the most of a bulk load's
    client CPU: docs/performance.md, Spark)."""
    request = kv_pb2.BatchRequest()
    add = request.ops.add
    for key, value in puts.items() if isinstance(puts, Mapping) else puts:
        put = add().put
        put.key, put.value = to_bytes(key), to_bytes(value, "value")
    for key in deletes:
        add().delete = to_bytes(key)
    return request


def consistency_level(name: str) -> int:
    try:
        return CONSISTENCY[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"consistency must be one of {', '.join(CONSISTENCY)}, not {name!r}") from None
