"""Client threads that put / get / delete random keys with unique values and record every op in
a History.

Each worker owns a client with a short timeout (so a fault turns into an unknown outcome
quickly, not a stalled worker). Outcomes, from what the client can know for certain:
- a write that returned is ok; one refused as invalid is a failure (never proposed);
- any other write error is unknown: "not leader", unavailable and timeout may all come after
  some attempt was proposed (the client retries inside its timeout, and a leader that loses its
  term fails requests whose entries may still commit under the next leader);
- a read that returned is ok; a read that did not has no effect, and the checker drops it.
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
from raftkv_proto import kv_pb2, kv_pb2_grpc
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


def key_names(count: int) -> list[bytes]:
    return [f"k{i:02d}".encode() for i in range(count)]


@dataclass
class Worker:
    """One client thread: random ops until stopped, each recorded in the history."""

    name: str
    target: Target | Client
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
                self.history.append(perform(self.target, self.name, kind, self.rng.choice(self.keys), value))
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
