"""etcd's KV requests applied to the MVCC store, as etcd 3.4's applier does (etcdserver/apply.go):
a transaction's compares (its nested transactions' too) are judged against the store as it was
before the transaction, then the chosen branch's ops run in order, each seeing the ones before it.
A Put or DeleteRange through the etcd face travels as a transaction of one op, so one function
applies every etcd write; reads outside a transaction (Range) use `read_range` directly (statemachine/range_read.py).

Every replica reaches the same answer from the same entry: nothing here depends on a clock or on
configuration. A request that etcd refuses before changing anything (a put with ignore_value on a
missing key, a range at a compacted revision) raises EtcdRefusal, and nothing of it is applied."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import lmdb

from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb
from statemachine.commands import validate_key
from statemachine.errors import InvalidCommandError
from statemachine.key_record import KeyVersion
from statemachine.leases import LEASE_NOT_FOUND
from statemachine.mvcc import (
    CompactedError,
    FutureRevisionError,
    MvccTables,
    RevisionWriter,
    check_revision,
    range_at,
    store_revision,
)
from statemachine.range_read import (
    Allow, RangePlan, allow_any, fill_range, listed_range, plan_in_key_order, plan_range, read_key,
)

# etcd's messages (api/v3rpc/rpctypes/error.go), which clients match on, with kv.errors' kinds.
COMPACTED = "etcdserver: mvcc: required revision has been compacted"
FUTURE_REVISION = "etcdserver: mvcc: required revision is a future revision"
KEY_NOT_FOUND = "etcdserver: key not found"


class EtcdRefusal(Exception):
    """A request etcd refuses at apply: `kind` is kv.errors' kind, the message etcd's."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def refusal_of(exc: LookupError) -> EtcdRefusal:
    if isinstance(exc, CompactedError):
        return EtcdRefusal("OUT_OF_RANGE", COMPACTED)
    if isinstance(exc, FutureRevisionError):
        return EtcdRefusal("OUT_OF_RANGE", FUTURE_REVISION)
    raise exc


def range_end(key: bytes, end: bytes) -> bytes | None:
    """etcd's range conventions as [key, end) bounds: an empty end means the key alone, b"\\0"
    every key from `key` on (None: unbounded)."""
    if not end:
        return key + b"\x00"
    if end == b"\x00":
        return None
    return end


def to_proto(kv: KeyVersion, keys_only: bool = False) -> mvccpb.KeyValue:
    return mvccpb.KeyValue(key=kv.key, create_revision=kv.create_revision, mod_revision=kv.mod_revision,
                           version=kv.version, value=b"" if keys_only else kv.value, lease=kv.lease)


def check_read_revision(txn: lmdb.Transaction, tables: MvccTables, revision: int) -> None:
    """check_revision with etcd's refusal (EtcdRefusal) for a compacted or future revision."""
    try:
        check_revision(txn, tables, revision)
    except LookupError as exc:
        raise refusal_of(exc) from None


def plan_read(txn: lmdb.Transaction, tables: MvccTables, request: pb.RangeRequest,
              revision: int | None = None, max_bytes: int | None = None) -> RangePlan:
    """The plan of a Range served from `txn` (a read, or the write transaction of an apply, which
    sees its own changes; statemachine/range_read.py); `revision` is the header's (default: the
    store's). Raises EtcdRefusal for a compacted or future revision."""
    check_read_revision(txn, tables, request.revision)
    bounds = request.key, range_end(request.key, request.range_end)
    header_revision = store_revision(txn, tables) if revision is None else revision
    listing = plan_in_key_order(txn, tables, request, header_revision, bounds, max_bytes)
    if listing is not None:
        return listing
    listed = listed_range(txn, tables, *bounds, request.revision)
    return plan_range(listed, request, header_revision, bounds, max_bytes)


def read_range(txn: lmdb.Transaction, tables: MvccTables, request: pb.RangeRequest,
               revision: int | None = None, allow: Allow = allow_any,
               response: pb.RangeResponse | None = None) -> pb.RangeResponse:
    """A Range served from `txn` (plan_read), measured, passed to `allow` (which raises to refuse
    it), then read into `response` (a new one by default). One key is looked up at once
    (range_read.read_key): its reply is bounded by an entry's size."""
    if not request.range_end:
        out = pb.RangeResponse() if response is None else response
        check_read_revision(txn, tables, request.revision)
        read_key(txn, tables, request, store_revision(txn, tables) if revision is None else revision, out)
        return out
    plan = plan_read(txn, tables, request, revision, allow.max_bytes)
    allow(plan.wire_bytes)
    out = pb.RangeResponse() if response is None else response
    fill_range(txn, tables, plan, out)
    return out


def apply_txn(txn: lmdb.Transaction, tables: MvccTables, writer: RevisionWriter,
              request: pb.TxnRequest) -> pb.TxnResponse:
    """Apply an etcd transaction inside the apply's write transaction; the response without its
    header's member fields (the header's revision is the store's after it). The caller has called
    writer.begin() and calls writer.end() after."""
    path = _path(txn, tables, request)  # every compare judged before anything changes
    _check(txn, tables, request, path)
    response = pb.TxnResponse()
    _run(txn, tables, writer, request, path, response)
    response.header.revision = _read_revision(writer)
    return response


def read_only(request: pb.TxnRequest) -> bool:
    """etcd's isTxnReadonly: no put and no delete in either branch, nested transactions included.
    Such a transaction is served as a read, by the member asked, never through the log."""
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind in ("request_put", "request_delete_range") or (kind == "request_txn" and not read_only(op.request_txn)):
            return False
    return True


def serializable(request: pb.TxnRequest) -> bool:
    """etcd's isTxnSerializable: every range of either branch (nested too) is serializable."""
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if (kind == "request_range" and not op.request_range.serializable) or (
                kind == "request_txn" and not serializable(op.request_txn)):
            return False
    return True


def read_txn(txn: lmdb.Transaction, tables: MvccTables, request: pb.TxnRequest,
             allow: Allow = allow_any) -> pb.TxnResponse:
    """A read-only transaction (read_only) judged and read from one read transaction, as etcd's
    applier runs it outside the log: the compares, then the chosen branch's ranges, every one
    measured before any is read, their sizes together passed to `allow` (which raises to refuse
    the reply). Raises EtcdRefusal for a range at a compacted or future revision, before anything
    is read."""
    path = _path(txn, tables, request)
    _check(txn, tables, request, path)
    revision = store_revision(txn, tables)
    plans = [plan_read(txn, tables, ranged, revision, allow.max_bytes) for ranged in _ranges_read(request, path)]
    allow(sum(plan.wire_bytes for plan in plans))
    response = pb.TxnResponse()
    _read(txn, tables, request, path, response, revision, iter(plans))
    response.header.revision = revision
    return response


def _ranges_read(request: pb.TxnRequest, path: list[bool]) -> list[pb.RangeRequest]:
    """The ranges a read-only transaction runs, in the order `_read` runs them."""
    ranges: list[pb.RangeRequest] = []

    def walk(txn: pb.TxnRequest, path: list[bool]) -> int:
        used = 1
        for op in _branch(txn, path[0]):
            if op.WhichOneof("request") == "request_range":
                ranges.append(op.request_range)
            else:
                used += walk(op.request_txn, path[used:])
        return used
    walk(request, path)
    return ranges


def _read(txn: lmdb.Transaction, tables: MvccTables, request: pb.TxnRequest, path: list[bool],
          response: pb.TxnResponse, revision: int, plans: Iterator[RangePlan]) -> int:
    """`_run` for a read-only transaction, filling its ranges' `plans`; how many entries of
    `path` it used."""
    used = 1
    response.succeeded = path[0]
    for op in _branch(request, path[0]):
        out = response.responses.add()
        if op.WhichOneof("request") == "request_range":
            fill_range(txn, tables, next(plans), out.response_range)
        else:
            nested = out.response_txn
            used += _read(txn, tables, op.request_txn, path[used:], nested, revision, plans)
            nested.header.revision = revision
    return used


def _path(txn: lmdb.Transaction, tables: MvccTables, request: pb.TxnRequest) -> list[bool]:
    """Whether each transaction (this one, then its nested ones in the order they run) succeeds."""
    succeeded = all(_compare(txn, tables, compare) for compare in request.compare)
    path = [succeeded]
    for op in request.success if succeeded else request.failure:
        if op.HasField("request_txn"):
            path += _path(txn, tables, op.request_txn)
    return path


def _compare(txn: lmdb.Transaction, tables: MvccTables, compare: pb.Compare) -> bool:
    if compare.range_end:
        end = None if compare.range_end == b"\x00" else compare.range_end
    else:
        end = compare.key + b"\x00"
    found = False
    for kv in range_at(txn, tables, compare.key, end, 0):  # one version at a time: a range may be the keyspace
        if not _holds(compare, kv):
            return False
        found = True
    if not found:
        if compare.target == pb.Compare.VALUE:
            return False  # etcd: a value compare on a missing key always fails
        return _holds(compare, KeyVersion(compare.key, b"", 0, 0, 0))
    return True


def _holds(compare: pb.Compare, kv: KeyVersion) -> bool:
    target = compare.target
    if target == pb.Compare.VALUE:
        ours, theirs = kv.value, compare.value
    elif target == pb.Compare.CREATE:
        ours, theirs = kv.create_revision, compare.create_revision
    elif target == pb.Compare.MOD:
        ours, theirs = kv.mod_revision, compare.mod_revision
    elif target == pb.Compare.VERSION:
        ours, theirs = kv.version, compare.version
    else:
        ours, theirs = kv.lease, compare.lease
    result = compare.result
    if result == pb.Compare.EQUAL:
        return ours == theirs
    if result == pb.Compare.NOT_EQUAL:
        return ours != theirs
    if result == pb.Compare.GREATER:
        return ours > theirs
    if result == pb.Compare.LESS:
        return ours < theirs
    return True


def _branch(request: pb.TxnRequest, succeeded: bool) -> Iterable[pb.RequestOp]:
    return request.success if succeeded else request.failure


def _check(txn: lmdb.Transaction, tables: MvccTables, request: pb.TxnRequest, path: list[bool]) -> int:
    """etcd's checkRequests: the ops that will run, checked against the store before any runs.
    Returns how many entries of `path` this transaction and its nested ones used."""
    used = 1
    for op in _branch(request, path[0]):
        kind = op.WhichOneof("request")
        if kind == "request_txn":
            used += _check(txn, tables, op.request_txn, path[used:])
        elif kind == "request_put":
            put = op.request_put
            try:
                validate_key(put.key)  # the store's key limit: a face checks first, a replica never relies on it
            except InvalidCommandError as exc:
                raise EtcdRefusal("INVALID_ARGUMENT", str(exc)) from None
            if (put.ignore_value or put.ignore_lease) and tables.data.get(txn, put.key) is None:
                raise EtcdRefusal("INVALID_ARGUMENT", KEY_NOT_FOUND)
            if put.lease and not tables.leases.exists(txn, put.lease):
                raise EtcdRefusal("NOT_FOUND", LEASE_NOT_FOUND)
        elif kind == "request_range":
            check_read_revision(txn, tables, op.request_range.revision)
    return used


def _run(txn: lmdb.Transaction, tables: MvccTables, writer: RevisionWriter, request: pb.TxnRequest,
         path: list[bool], response: pb.TxnResponse) -> int:
    """Run the chosen branch of `request` into `response`; how many entries of `path` it used."""
    used = 1
    response.succeeded = path[0]
    for op in _branch(request, path[0]):
        kind = op.WhichOneof("request")
        out = response.responses.add()
        if kind == "request_range":
            read_range(txn, tables, op.request_range, _read_revision(writer), response=out.response_range)
        elif kind == "request_put":
            _put(writer, op.request_put, out.response_put)
        elif kind == "request_delete_range":
            _delete_range(writer, op.request_delete_range, out.response_delete_range)
        elif kind == "request_txn":
            nested = out.response_txn
            used += _run(txn, tables, writer, op.request_txn, path[used:], nested)
            nested.header.revision = _read_revision(writer)
    return used


def _read_revision(writer: RevisionWriter) -> int:
    """The revision a read inside the transaction reports: etcd's write transaction counts its own
    changes once it has made one."""
    return writer.pending if writer.changed else writer.revision


def _put(writer: RevisionWriter, request: pb.PutRequest, response: pb.PutResponse) -> None:
    value, lease = request.value, request.lease
    if request.ignore_value or request.ignore_lease or request.prev_kv:
        current = writer.current(request.key)
        if current is not None:
            value = current.value if request.ignore_value else value
            lease = current.lease if request.ignore_lease else lease
            if request.prev_kv:
                response.prev_kv.CopyFrom(to_proto(current))
    writer.put(request.key, value, lease)
    response.header.revision = writer.pending


def _delete_range(writer: RevisionWriter, request: pb.DeleteRangeRequest,
                  response: pb.DeleteRangeResponse) -> None:
    deleted = writer.delete_range(request.key, range_end(request.key, request.range_end))
    response.deleted = len(deleted)
    if request.prev_kv:
        response.prev_kvs.extend(to_proto(kv) for kv in deleted)
    response.header.revision = _read_revision(writer)


def txn_spans(request: pb.TxnRequest) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """The (key, range_end) pairs a transaction reads and writes, in both branches and its nested
    transactions, as etcd's permission check takes them: compares read, and so does a put or a
    delete that returns the previous version (prev_kv). (etcd 3.4 checks neither a put's prev_kv
    inside a transaction nor nested transactions; raftkv does: docs/etcd-compatibility.md.)"""
    reads = [(compare.key, compare.range_end) for compare in request.compare]
    writes: list[tuple[bytes, bytes]] = []
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind == "request_range":
            reads.append((op.request_range.key, op.request_range.range_end))
        elif kind == "request_put":
            writes.append((op.request_put.key, b""))
            if op.request_put.prev_kv:
                reads.append((op.request_put.key, b""))
        elif kind == "request_delete_range":
            delete = op.request_delete_range
            writes.append((delete.key, delete.range_end))
            if delete.prev_kv:
                reads.append((delete.key, delete.range_end))
        elif kind == "request_txn":
            nested_reads, nested_writes = txn_spans(op.request_txn)
            reads += nested_reads
            writes += nested_writes
    return reads, writes


def txn_leases(request: pb.TxnRequest) -> set[int]:
    """The leases the puts of a transaction (both branches, nested ones too) attach keys to: a
    user may attach a key only to a lease whose keys it may all write (etcd's checkLeasePuts), as
    it could not revoke the lease otherwise."""
    leases: set[int] = set()
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put" and op.request_put.lease:
            leases.add(op.request_put.lease)
        elif kind == "request_txn":
            leases |= txn_leases(op.request_txn)
    return leases
