"""What the clients of a robustness run saw, as plain records: each KV call (its ops, outcome and
the revision its answer's header named), each lease call, and each watch response with the moment
it arrived. The checks (checks_*.py) judge these records against the history the members agree on.

Times are time.monotonic_ns(): the members run on this machine and count lease deadlines on the
same clock (CLOCK_MONOTONIC is system-wide), so a client's times bound the server's."""
from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

import grpc

from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb


class Outcome(str, Enum):
    OK = "ok"
    FAIL = "fail"  # certainly without effect
    UNKNOWN = "unknown"  # a write that may take effect at any time after its call, or never


# Codes an etcd member answers only for a request it refused before proposing anything.
REFUSED_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE})
# gRPC's account of a call that found no connection: never sent.
NOT_SENT = "failed to connect to all addresses"


def failed_write_outcome(error: grpc.RpcError) -> Outcome:
    code, details = error.code(), error.details() or ""
    if code in REFUSED_CODES or (code == grpc.StatusCode.UNAVAILABLE and details.startswith(NOT_SENT)):
        return Outcome.FAIL
    return Outcome.UNKNOWN


@dataclass(frozen=True)
class KeyOp:
    """One op of a KV call on one key. `value`: what a put wrote, or what a read returned (None:
    absent). `existed`: a delete's answer. `lease`: a put's lease (0: none)."""

    kind: str  # "put", "get", "delete"
    key: bytes
    value: bytes | None = None
    existed: bool | None = None
    lease: int = 0

    @property
    def writes(self) -> bool:
        return self.kind != "get"


@dataclass(frozen=True)
class KvCall:
    """A Put, Range, DeleteRange or Txn (of several KeyOps, on distinct keys)."""

    client: str
    member: str
    ops: tuple[KeyOp, ...]
    call_ns: int
    return_ns: int | None
    outcome: Outcome
    revision: int = 0  # the answer's header revision (ok calls)
    error: str = ""

    @property
    def writes(self) -> bool:
        return any(op.writes for op in self.ops)


@dataclass(frozen=True)
class LeaseCall:
    """A LeaseGrant or one keep-alive. `ttl`: the TTL the answer gave (0: the lease is gone)."""

    client: str
    member: str
    kind: str  # "grant", "keepalive"
    lease: int
    call_ns: int
    return_ns: int | None
    outcome: Outcome
    ttl: int = 0
    revision: int = 0
    error: str = ""


@dataclass(frozen=True)
class KvRecord:
    """A key's version as etcd's mvccpb.KeyValue carries it (a deletion: value empty, version 0)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def of(cls, kv: mvccpb.KeyValue) -> KvRecord:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass(frozen=True)
class EventRecord:
    deleted: bool
    kv: KvRecord
    prev: KvRecord | None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision

    @classmethod
    def of(cls, event: mvccpb.Event) -> EventRecord:
        return cls(event.type == mvccpb.Event.DELETE, KvRecord.of(event.kv),
                   KvRecord.of(event.prev_kv) if event.HasField("prev_kv") else None)

    def without_prev(self) -> EventRecord:
        return EventRecord(self.deleted, self.kv, None)


@dataclass(frozen=True)
class WatchResponseRecord:
    """One response on a watch stream; `stream`: which of the watch's streams (0, 1, ...)."""

    stream: int
    member: str
    received_ns: int
    revision: int  # header
    watch_id: int
    created: bool
    canceled: bool
    compact_revision: int
    fragment: bool
    events: tuple[EventRecord, ...]

    @classmethod
    def of(cls, stream: int, member: str, received_ns: int, response: pb.WatchResponse) -> WatchResponseRecord:
        return cls(stream, member, received_ns, response.header.revision, response.watch_id, response.created,
                   response.canceled, response.compact_revision, response.fragment,
                   tuple(EventRecord.of(e) for e in response.events))

    @property
    def is_progress(self) -> bool:
        """A progress notification: no events, not a creation or cancellation."""
        return not self.events and not self.created and not self.canceled


@dataclass(frozen=True)
class WatchSpec:
    """What a watch asked for: [key, range_end) as etcd's conventions give it, from
    `start_revision` (0: from the next revision), with or without previous versions."""

    name: str
    key: bytes
    range_end: bytes
    start_revision: int
    prev_kv: bool

    def covers(self, key: bytes) -> bool:
        if self.range_end == b"\0":
            return key >= self.key
        if not self.range_end:
            return key == self.key
        return self.key <= key < self.range_end


@dataclass
class WatchLog:
    """Everything one logical watch received, over all its streams (it is resumed on another
    member when a stream breaks). `starts`: the start revision each stream asked for."""

    spec: WatchSpec
    responses: list[WatchResponseRecord] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)  # why each stream ended early
    finished: bool = False  # saw the run's final revision


class Records:
    """Every record of a run, appended from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.kv: list[KvCall] = []
        self.leases: list[LeaseCall] = []
        self.watches: list[WatchLog] = []

    def add_kv(self, call: KvCall) -> None:
        with self._lock:
            self.kv.append(call)

    def add_lease(self, call: LeaseCall) -> None:
        with self._lock:
            self.leases.append(call)

    def add_watch(self, log: WatchLog) -> None:
        with self._lock:
            self.watches.append(log)

    def kv_calls(self) -> list[KvCall]:
        with self._lock:
            return list(self.kv)

    def lease_calls(self) -> list[LeaseCall]:
        with self._lock:
            return list(self.leases)

    def summary(self) -> str:
        kv, leases = self.kv_calls(), self.lease_calls()
        count = {o: sum(1 for c in kv if c.outcome is o) for o in Outcome}
        grants = sum(1 for c in leases if c.kind == "grant" and c.outcome is Outcome.OK)
        keepalives = sum(1 for c in leases if c.kind == "keepalive" and c.outcome is Outcome.OK)
        events = sum(len(r.events) for w in self.watches for r in w.responses)
        resumed = sum(len(w.starts) - 1 for w in self.watches)
        return (f"kv calls ok={count[Outcome.OK]} unknown={count[Outcome.UNKNOWN]} fail={count[Outcome.FAIL]}; "
                f"leases granted={grants} keep-alives answered={keepalives}; "
                f"{len(self.watches)} watches, {events} events, {resumed} resumptions")

    def dump(self, path: Path) -> None:
        """JSON lines, for reading after a failure (bytes as Python reprs)."""
        def line(kind: str, record: object) -> str:
            return json.dumps({"record": kind, **asdict(record)}, default=repr) + "\n"  # type: ignore[call-overload]
        with open(path, "w") as out:
            for call in self.kv_calls():
                out.write(line("kv", call))
            for lease in self.lease_calls():
                out.write(line("lease", lease))
            for watch in self.watches:
                out.write(line("watch", watch))
