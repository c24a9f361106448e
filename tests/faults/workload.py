"""Client threads that put / get / delete random keys with unique values and record every op in
a History.

Each worker owns a client with a short timeout (so a fault turns into an unknown outcome
quickly, not a stalled worker). Outcomes, from what the client can know for certain:
- a write that returned is ok; one refused as invalid is a failure (never proposed);
- any other write error is unknown: "not leader", unavailable and timeout may all come after
  some attempt was proposed (the client retries inside its timeout, and a leader that loses its
  term fails requests whose entries may still commit under the next leader);
- a read that returned is ok; a read that did not has no effect, and the checker drops it.

`EtcdTarget` is the second kind of client: etcd's v3 API (unary KV.Put, KV.Range, KV.DeleteRange)
over plain gRPC channels, one member at a time, retrying on the next member.
etcd requests carry no client id, so each attempt is an op of its own in the history (see there).
"""
from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from kv import Client
from kv.errors import InvalidArgumentError, RaftKVError, UnavailableError, from_rpc_error
from raftkv_proto import etcd_rpc_pb2, etcd_rpc_pb2_grpc, kv_pb2, kv_pb2_grpc
from tests.faults.history import History, Kind, Op, Outcome, now_ns

# Reads dominate as in most stores, deletes are rare enough that keys usually hold a value.
KIND_WEIGHTS = {Kind.GET: 5, Kind.PUT: 4, Kind.DELETE: 1}
DEFAULT_TIMEOUT_S = 1.5
# How long a pinned target pauses after UNAVAILABLE (see PinnedTarget._call).
UNAVAILABLE_PAUSE_S = 0.02


class Target(Protocol):
    """Something that performs single ops and raises kv.errors on failure."""

    def put(self, key: bytes, value: bytes) -> object: ...
    def get(self, key: bytes) -> bytes | None: ...
    def delete(self, key: bytes) -> bool: ...


class PinnedTarget:
    """Ops sent to one node only, over a raw stub: no retries, no following of leader hints.
    Used to watch what one particular node (an isolated leader, say) completes."""

    def __init__(self, stub: kv_pb2_grpc.KVStub, timeout_s: float, consistency: int = kv_pb2.LINEARIZABLE) -> None:
        self._stub = stub
        self._timeout_s = timeout_s
        self._consistency = consistency
        self._client_id = ""  # issued by the cluster (RegisterClient) before the first write
        self._seq = itertools.count(1)

    def _header(self) -> kv_pb2.WriteHeader:
        if not self._client_id:
            registered = self._call(self._stub.RegisterClient, kv_pb2.RegisterClientRequest(name="pinned"))
            self._client_id = registered.client_id  # type: ignore[attr-defined]
        return kv_pb2.WriteHeader(client_id=self._client_id, seq=next(self._seq))

    def _call(self, method: grpc.UnaryUnaryMultiCallable, request: object) -> object:
        try:
            return method(request, timeout=self._timeout_s)
        except grpc.RpcError as error:
            failure = from_rpc_error(error)
            if isinstance(failure, UnavailableError):
                # Between two connection attempts a channel fails every call at once. A pinned
                # client spinning through that window (up to 2 s when a connection attempt to a
                # node resumed from SIGSTOP timed out) wrote thousands of unknown-outcome writes,
                # each a branch for the linearizability checker, which then ran out of time. Real
                # clients back off here; so does this one.
                time.sleep(UNAVAILABLE_PAUSE_S)
            raise failure from None

    def put(self, key: bytes, value: bytes) -> object:
        return self._call(self._stub.Put, kv_pb2.PutRequest(key=key, value=value, header=self._header()))

    def get(self, key: bytes) -> bytes | None:
        response = self._call(self._stub.Get, kv_pb2.GetRequest(key=key, consistency=self._consistency))
        return response.value if response.found else None  # type: ignore[attr-defined]

    def delete(self, key: bytes) -> bool:
        response = self._call(self._stub.Delete, kv_pb2.DeleteRequest(key=key, header=self._header()))
        return response.existed  # type: ignore[attr-defined]


def perform(target: Target | Client, client: str, kind: Kind, key: bytes, value: bytes | None = None) -> Op:
    """Run one op and return it as recorded: call and return times, outcome, result."""
    call = now_ns()
    try:
        if kind is Kind.PUT:
            assert value is not None
            target.put(key, value)
            return Op(client, kind, key, call, now_ns(), Outcome.OK, value=value)
        if kind is Kind.GET:
            read = target.get(key)
            return Op(client, kind, key, call, now_ns(), Outcome.OK, value=read)
        existed = target.delete(key)
        return Op(client, kind, key, call, now_ns(), Outcome.OK, existed=existed)
    except RaftKVError as error:
        return Op(client, kind, key, call, None, _failure_outcome(kind, error), value=value if kind is Kind.PUT else None,
                  ended_ns=now_ns(), error=type(error).__name__)


def _failure_outcome(kind: Kind, error: RaftKVError) -> Outcome:
    if kind is Kind.GET:
        return Outcome.FAIL  # no effect either way
    # The server also says INVALID_ARGUMENT for a write whose fate is unknown (an expired session
    # sequence); its message says so.
    if isinstance(error, InvalidArgumentError) and "unknown" not in str(error):
        return Outcome.FAIL
    return Outcome.UNKNOWN


# An etcd attempt that failed with these is tried again on the next member. etcd 3.4's clientv3
# retries a Range so, but a Put only when it was never sent; retrying writes too (as applications
# around etcd clients do) is the harder case for the history: a write may then be applied twice.
ETCD_RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# How long one etcd op may take, all its attempts together (etcdctl's default --command-timeout).
ETCD_OP_TIMEOUT_S = 5.0
# The pause before trying the next member (etcd 3.4 clientv3's defaultBackoffWaitBetween).
ETCD_RETRY_PAUSE_S = 0.025
# gRPC's account of a call that found no connection to its member: failed at the client's pick,
# never written to a socket, so certainly not applied. Any other failure of a write may come
# after the member (or the leader it forwarded to) proposed it.
NOT_SENT = "failed to connect to all addresses"


@dataclass
class EtcdStats:
    """What etcd clients saw, to assert that a scenario exercised what it means to."""

    answered: dict[str, int] = field(default_factory=dict)  # attempts answered, by the member called
    retried_unknown: int = 0  # writes sent again after an attempt with an unknown outcome
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_answer(self, member: str) -> None:
        with self.lock:
            self.answered[member] = self.answered.get(member, 0) + 1

    def add_retried_unknown(self) -> None:
        with self.lock:
            self.retried_unknown += 1

    def describe(self) -> str:
        with self.lock:
            by_member = ", ".join(f"{member} {count}" for member, count in sorted(self.answered.items()))
            return f"answers by the member called: {by_member or 'none'}; " \
                   f"{self.retried_unknown} writes sent again after an unknown outcome"


class EtcdTarget:
    """An etcd v3 client: unary KV.Put / KV.Range / KV.DeleteRange, linearizable reads (etcd's
    default; `serializable=True` for the stale-read self-test), over a plain gRPC channel to one
    member at a time, starting at the first of `members` (a follower forwards writes and
    linearizable reads to the leader). Like etcd's clients it stays with a member while that member
    answers, and on UNAVAILABLE or DEADLINE_EXCEEDED tries the next one (reads and writes alike,
    see ETCD_RETRIED_CODES), until ETCD_OP_TIMEOUT_S has passed; `retry=False` (a probe pinned to
    one member) never moves.

    An etcd write carries no client id, so a retried write whose first attempt did reach a member
    may be applied twice (as with etcd). `attempts` therefore returns one op per attempt, each
    with its own call and return: an attempt that failed other than by finding no connection is
    an unknown write (it may take effect at any time after its call, or never) and the retry is
    a new op writing the same value (etcd clients resend the same request). The checker then
    allows both applications, and a read between them, without weakening anything else.
    """

    def __init__(self, members: list[tuple[str, etcd_rpc_pb2_grpc.KVStub]], timeout_s: float = DEFAULT_TIMEOUT_S,
                 op_timeout_s: float = ETCD_OP_TIMEOUT_S, retry: bool = True, serializable: bool = False,
                 stats: EtcdStats | None = None) -> None:
        assert members
        self._members = members
        self._timeout_s = timeout_s
        self._op_timeout_s = op_timeout_s
        self._retry = retry
        self._serializable = serializable
        self.stats = stats if stats is not None else EtcdStats()
        self._at = 0  # the member in use

    def attempts(self, client: str, kind: Kind, key: bytes, value: bytes | None = None) -> list[Op]:
        """Run one op, retried as etcd's clients do; every attempt as recorded."""
        ops: list[Op] = []
        deadline = time.monotonic() + self._op_timeout_s
        while True:
            member, stub = self._members[self._at]
            timeout = max(0.05, min(self._timeout_s, deadline - time.monotonic()))
            op, code = self._attempt(stub, member, client, kind, key, value, timeout)
            ops.append(op)
            if op.outcome is Outcome.OK or code not in ETCD_RETRIED_CODES:
                return ops
            # Between two connection attempts a channel fails every call at once: pause, as
            # etcd's clients (and PinnedTarget) do, so that a member down is not spun on.
            time.sleep(ETCD_RETRY_PAUSE_S)
            if not self._retry or time.monotonic() + ETCD_RETRY_PAUSE_S >= deadline:
                return ops
            if op.outcome is Outcome.UNKNOWN:
                self.stats.add_retried_unknown()
            self._at = (self._at + 1) % len(self._members)

    def _attempt(self, stub: etcd_rpc_pb2_grpc.KVStub, member: str, client: str, kind: Kind, key: bytes,
                 value: bytes | None, timeout: float) -> tuple[Op, grpc.StatusCode | None]:
        call = now_ns()
        try:
            if kind is Kind.PUT:
                assert value is not None
                stub.Put(etcd_rpc_pb2.PutRequest(key=key, value=value), timeout=timeout)
                op = Op(client, kind, key, call, now_ns(), Outcome.OK, value=value)
            elif kind is Kind.GET:
                read = stub.Range(etcd_rpc_pb2.RangeRequest(key=key, serializable=self._serializable), timeout=timeout)
                op = Op(client, kind, key, call, now_ns(), Outcome.OK, value=read.kvs[0].value if read.kvs else None)
            else:
                deleted = stub.DeleteRange(etcd_rpc_pb2.DeleteRangeRequest(key=key), timeout=timeout).deleted
                op = Op(client, kind, key, call, now_ns(), Outcome.OK, existed=deleted > 0)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
            if kind is Kind.GET or (code == grpc.StatusCode.UNAVAILABLE and details.startswith(NOT_SENT)):
                outcome = Outcome.FAIL
            else:
                outcome = Outcome.UNKNOWN
            return Op(client, kind, key, call, None, outcome, value=value if kind is Kind.PUT else None,
                      ended_ns=now_ns(), error=f"{code.name} at {member}: {details[:80]}"), code
        self.stats.add_answer(member)
        return op, None


def perform_all(target: Target | Client | EtcdTarget, client: str, kind: Kind, key: bytes,
                value: bytes | None = None) -> list[Op]:
    """One op as recorded: a single Op, or (an etcd client) one per attempt."""
    if isinstance(target, EtcdTarget):
        return target.attempts(client, kind, key, value)
    return [perform(target, client, kind, key, value)]


def key_names(count: int) -> list[bytes]:
    return [f"k{i:02d}".encode() for i in range(count)]


@dataclass
class Worker:
    """One client thread: random ops until stopped, each recorded in the history."""

    name: str
    target: Target | Client | EtcdTarget
    keys: list[bytes]
    history: History
    rng: random.Random
    error: BaseException | None = None

    def run(self, stop: threading.Event) -> None:
        kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
        try:
            for n in itertools.count():
                if stop.is_set():
                    return
                kind = self.rng.choices(kinds, weights)[0]
                value = f"{self.name}-{n}".encode() if kind is Kind.PUT else None
                for op in perform_all(self.target, self.name, kind, self.rng.choice(self.keys), value):
                    self.history.append(op)
        except BaseException as error:  # noqa: BLE001 - surfaced by Workload.stop
            self.error = error


@dataclass
class Workload:
    """Worker threads over a set of targets; `stop()` joins them and raises a worker's crash."""

    workers: list[Worker]
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Workload:
        for worker in self.workers:
            thread = threading.Thread(target=worker.run, args=(self.stop_event,), name=worker.name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout_s)
            assert not thread.is_alive(), f"worker {thread.name} did not stop within {timeout_s}s"
        crashed = [w for w in self.workers if w.error is not None]
        if crashed:
            raise AssertionError(f"worker {crashed[0].name} crashed") from crashed[0].error
