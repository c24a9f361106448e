"""Random client traffic through etcd's v3 API, recorded call by call (records.py).

KV clients put, read and delete plain keys (PLAIN_PREFIX) and run multi-key transactions on them.
Lease clients grant leases (ids of their own choosing, so that a grant whose answer was lost
cannot leave a lease they do not know), put keys on them (LEASE_PREFIX/<lease id>/<n>: no client
ever deletes these, so each deletion of one is a revocation), keep some alive until the traffic
stops and abandon the others after a few keep-alives.

A client stays with a member while it answers and moves to the next on any failure; it never
resends a failed write (etcd writes carry no client id: a resent one could apply twice). Each
client is bounded by a count of calls as well as by the stop event."""
from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.robustness.endpoints import Endpoints
from tests.robustness.records import KeyOp, KvCall, LeaseCall, Outcome, Records, failed_write_outcome

PLAIN_PREFIX = b"k/"
LEASE_PREFIX = b"l/"
PLAIN_KEYS = [PLAIN_PREFIX + b"%02d" % i for i in range(10)]
CALL_TIMEOUT_S = 1.5
# After a failure, before the next call (etcd's clients back off so too): a member down is not
# spun on.
RETRY_PAUSE_S = 0.025
# What a KV client does, by weight.
KV_WEIGHTS = {"get": 3, "put": 4, "delete": 1, "txn": 2}
LEASE_TTLS_S = (2, 3)
LEASES_AT_ONCE = 3
LEASE_CLIENT_TICK_S = 0.1


def lease_key(lease: int, n: int) -> bytes:
    return LEASE_PREFIX + b"%016x/%d" % (lease, n)


class Stubs:
    """etcd's KV and Lease stubs of the member a client talks to; after a failure, the next
    member's (Endpoints.after: members added while the traffic runs included)."""

    def __init__(self, endpoints: Endpoints, first: int) -> None:
        members = endpoints.members()
        self._endpoints = endpoints
        self.member = members[first % len(members)]
        self._stubs: dict[str, tuple[etcd_rpc_pb2_grpc.KVStub, etcd_rpc_pb2_grpc.LeaseStub]] = {}

    @property
    def kv(self) -> etcd_rpc_pb2_grpc.KVStub:
        return self._of_member()[0]

    @property
    def lease(self) -> etcd_rpc_pb2_grpc.LeaseStub:
        return self._of_member()[1]

    def _of_member(self) -> tuple[etcd_rpc_pb2_grpc.KVStub, etcd_rpc_pb2_grpc.LeaseStub]:
        if self.member not in self._stubs:
            channel = self._endpoints.channel(self.member)
            self._stubs[self.member] = (etcd_rpc_pb2_grpc.KVStub(channel), etcd_rpc_pb2_grpc.LeaseStub(channel))
        return self._stubs[self.member]

    def move_on(self) -> None:
        self.member = self._endpoints.after(self.member)


def _request_op(op: KeyOp) -> pb.RequestOp:
    if op.kind == "put":
        return pb.RequestOp(request_put=pb.PutRequest(key=op.key, value=op.value, lease=op.lease))
    if op.kind == "get":
        return pb.RequestOp(request_range=pb.RangeRequest(key=op.key))
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=op.key))


def _answered(op: KeyOp, response: pb.ResponseOp) -> KeyOp:
    """`op` with what its answer said (a read's value, a delete's "existed")."""
    which = response.WhichOneof("response")
    if which == "response_range":
        kvs = response.response_range.kvs
        return KeyOp("get", op.key, kvs[0].value if kvs else None)
    if which == "response_delete_range":
        return KeyOp("delete", op.key, existed=response.response_delete_range.deleted > 0)
    return op


def call_kv(stubs: Stubs, records: Records, client: str, ops: tuple[KeyOp, ...]) -> KvCall:
    """One call: a single op as Put / Range / DeleteRange, several as a Txn. Recorded."""
    member, stub = stubs.member, stubs.kv
    call_ns = time.monotonic_ns()
    try:
        if len(ops) > 1:
            txn = stub.Txn(pb.TxnRequest(success=[_request_op(op) for op in ops]), timeout=CALL_TIMEOUT_S)
            answered = tuple(_answered(op, r) for op, r in zip(ops, txn.responses))
            header = txn.header
        else:
            (op,) = ops
            if op.kind == "put":
                header = stub.Put(pb.PutRequest(key=op.key, value=op.value, lease=op.lease),
                                  timeout=CALL_TIMEOUT_S).header
                answered = ops
            elif op.kind == "get":
                read = stub.Range(pb.RangeRequest(key=op.key), timeout=CALL_TIMEOUT_S)
                header, answered = read.header, (KeyOp("get", op.key, read.kvs[0].value if read.kvs else None),)
            else:
                deleted = stub.DeleteRange(pb.DeleteRangeRequest(key=op.key), timeout=CALL_TIMEOUT_S)
                header, answered = deleted.header, (KeyOp("delete", op.key, existed=deleted.deleted > 0),)
        call = KvCall(client, member, answered, call_ns, time.monotonic_ns(), Outcome.OK, header.revision)
    except grpc.RpcError as error:
        writes = any(op.writes for op in ops)
        outcome = failed_write_outcome(error) if writes else Outcome.FAIL
        call = KvCall(client, member, ops, call_ns, None, outcome,
                      error=f"{error.code().name}: {(error.details() or '')[:80]}")
    records.add_kv(call)
    return call


@dataclass
class Client:
    """A traffic thread's common parts."""

    name: str
    stubs: Stubs
    records: Records
    rng: random.Random
    max_calls: int
    error: BaseException | None = None
    calls: int = 0

    def failed(self) -> None:
        self.stubs.move_on()
        time.sleep(RETRY_PAUSE_S)

    def kv(self, ops: tuple[KeyOp, ...]) -> KvCall:
        self.calls += 1
        call = call_kv(self.stubs, self.records, self.name, ops)
        if call.outcome is not Outcome.OK:
            self.failed()
        return call


@dataclass
class KvClient(Client):
    """Puts, reads, deletes and transactions on the plain keys; unique values (<name>-<n>)."""

    def run(self, stop: threading.Event) -> None:
        kinds, weights = list(KV_WEIGHTS), list(KV_WEIGHTS.values())
        for n in itertools.count():
            if stop.is_set() or self.calls >= self.max_calls:
                return
            value = f"{self.name}-{n}".encode()
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "txn":
                keys = self.rng.sample(PLAIN_KEYS, self.rng.randint(2, 3))
                ops = tuple(self._op(self.rng.choices(["get", "put", "delete"], [2, 3, 1])[0], key, value)
                            for key in keys)
            else:
                ops = (self._op(kind, self.rng.choice(PLAIN_KEYS), value),)
            self.kv(ops)

    @staticmethod
    def _op(kind: str, key: bytes, value: bytes) -> KeyOp:
        return KeyOp(kind, key, value if kind == "put" else None)


@dataclass
class HeldLease:
    lease: int
    ttl: int
    kept: bool  # kept alive until the traffic stops; else abandoned after `keepalives_left`
    keepalives_left: int
    next_keepalive_ns: int
    keys: int = 0


@dataclass
class LeaseClient(Client):
    """Grants leases, puts keys on them, keeps some alive and abandons the others."""

    held: dict[int, HeldLease] = field(default_factory=dict)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and self.calls < self.max_calls:
            if len(self.held) < LEASES_AT_ONCE:
                self._grant()
            now = time.monotonic_ns()
            for held in list(self.held.values()):
                if held.next_keepalive_ns <= now:
                    self._keep_alive(held)
            if self.held and self.rng.random() < 0.3:
                held = self.rng.choice(list(self.held.values()))
                self._put_on(held, self.rng.randrange(held.keys + 1))  # a new key, or overwrite one
            stop.wait(LEASE_CLIENT_TICK_S)  # the pace of a client's keep-alives, not a wait for an event

    def _grant(self) -> None:
        lease, ttl = self.rng.randrange(1, 1 << 62), self.rng.choice(LEASE_TTLS_S)
        granted = self._lease_call("grant", lease, lambda stub: stub.LeaseGrant(pb.LeaseGrantRequest(ID=lease, TTL=ttl),
                                                                               timeout=CALL_TIMEOUT_S))
        if granted is None:
            return
        kept = self.rng.random() < 0.5
        held = HeldLease(lease, granted.ttl, kept, self.rng.randint(0, 2), self._next_keepalive(granted.ttl))
        self.held[lease] = held
        for n in range(self.rng.randint(1, 2)):
            self._put_on(held, n)

    def _next_keepalive(self, ttl: int) -> int:
        return time.monotonic_ns() + int(ttl * 1e9 / 3)  # etcd's clients: a third of the TTL

    def _put_on(self, held: HeldLease, n: int) -> None:
        call = self.kv((KeyOp("put", lease_key(held.lease, n), f"{self.name}-{self.calls}".encode(), lease=held.lease),))
        if call.outcome is Outcome.OK and n == held.keys:
            held.keys += 1

    def _keep_alive(self, held: HeldLease) -> None:
        def once(stub: etcd_rpc_pb2_grpc.LeaseStub) -> pb.LeaseKeepAliveResponse:
            # One keep-alive on a stream of its own, as `etcdctl lease keep-alive --once`: its deadline
            # then bounds it when the member is paused or cut off.
            return next(iter(stub.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=held.lease)]), timeout=CALL_TIMEOUT_S)))
        answer = self._lease_call("keepalive", held.lease, once)
        held.next_keepalive_ns = self._next_keepalive(held.ttl)
        if answer is None:
            return
        if answer.ttl == 0:
            del self.held[held.lease]  # gone (the checks judge whether it went too soon)
        elif not held.kept:
            held.keepalives_left -= 1
            if held.keepalives_left <= 0:
                del self.held[held.lease]  # abandoned: no keep-alive from here on

    def _lease_call(self, kind: str, lease: int, send: Callable[[etcd_rpc_pb2_grpc.LeaseStub], object]) -> LeaseCall | None:
        self.calls += 1
        member = self.stubs.member
        call_ns = time.monotonic_ns()
        try:
            answer = send(self.stubs.lease)
        except (grpc.RpcError, StopIteration) as error:
            outcome = failed_write_outcome(error) if isinstance(error, grpc.RpcError) else Outcome.UNKNOWN
            self.records.add_lease(LeaseCall(self.name, member, kind, lease, call_ns, None, outcome,
                                             error=repr(error)[:120]))
            self.failed()
            return None
        call = LeaseCall(self.name, member, kind, lease, call_ns, time.monotonic_ns(), Outcome.OK,
                         ttl=answer.TTL, revision=answer.header.revision)  # type: ignore[attr-defined]
        self.records.add_lease(call)
        return call


@dataclass
class Traffic:
    """The client threads of a run; `stop()` ends them and raises a client's crash."""

    clients: list[Client]
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Traffic:
        for client in self.clients:
            thread = threading.Thread(target=self._run, args=(client,), name=client.name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _run(self, client: Client) -> None:
        try:
            client.run(self.stop_event)  # type: ignore[attr-defined]
        except BaseException as error:  # noqa: BLE001 - raised by stop()
            client.error = error

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout_s)
            assert not thread.is_alive(), f"traffic client {thread.name} did not stop within {timeout_s}s"
        crashed = [c for c in self.clients if c.error is not None]
        if crashed:
            raise AssertionError(f"traffic client {crashed[0].name} crashed") from crashed[0].error


def make_traffic(endpoints: Endpoints, records: Records, rng: random.Random,
                 kv_clients: int = 3, lease_clients: int = 2, max_calls: int = 600) -> Traffic:
    clients: list[Client] = []
    for i in range(kv_clients):
        clients.append(KvClient(f"kv{i}", Stubs(endpoints, i), records, random.Random(rng.random()), max_calls))
    for i in range(lease_clients):
        clients.append(LeaseClient(f"lease{i}", Stubs(endpoints, i + kv_clients), records, random.Random(rng.random()),
                                   max_calls))
    return Traffic(clients)
