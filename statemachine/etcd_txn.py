"""etcd's KV requests applied to the MVCC store, as etcd 3.4's applier does (etcdserver/apply.go):
a transaction's compares (its nested transactions' too) are judged against the store as it was
before the transaction, then the chosen branch's ops run in order, each seeing the ones before it.
A Put or DeleteRange through the etcd face travels as a transaction of one op, so one function
applies every etcd write; reads outside a transaction (Range) use `range_response` directly.

Every replica reaches the same answer from the same entry: nothing here depends on a clock or on
configuration. A request that etcd refuses before changing anything (a put with ignore_value on a
missing key, a range at a compacted revision) raises EtcdRefusal, and nothing of it is applied."""
from __future__ import annotations

from collections.abc import Iterable

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


_SORT_KEYS = {
    pb.RangeRequest.KEY: lambda kv: kv.key,
    pb.RangeRequest.VERSION: lambda kv: kv.version,
    pb.RangeRequest.CREATE: lambda kv: kv.create_revision,
    pb.RangeRequest.MOD: lambda kv: kv.mod_revision,
    pb.RangeRequest.VALUE: lambda kv: kv.value,
}


def range_response(versions: Iterable[KeyVersion], request: pb.RangeRequest, revision: int) -> pb.RangeResponse:
    """etcd's Range over the key versions a read found (in key order), for a store at `revision`:
    count before the revision filters, then filters, sort, limit and keys_only as etcd applies them."""
    kvs = list(versions)
    response = pb.RangeResponse(count=len(kvs))
    response.header.revision = revision
    if request.count_only:
        return response
    if request.limit > 0 and request.sort_order == pb.RangeRequest.NONE and not (
            request.min_mod_revision or request.max_mod_revision or request.min_create_revision
            or request.max_create_revision):
        # etcd reads limit + 1 keys in key order, then sorts those by a target other than the key
        kvs = kvs[:request.limit + 1]
    if request.max_mod_revision:
        kvs = [kv for kv in kvs if kv.mod_revision <= request.max_mod_revision]
    if request.min_mod_revision:
        kvs = [kv for kv in kvs if kv.mod_revision >= request.min_mod_revision]
    if request.max_create_revision:
        kvs = [kv for kv in kvs if kv.create_revision <= request.max_create_revision]
    if request.min_create_revision:
        kvs = [kv for kv in kvs if kv.create_revision >= request.min_create_revision]
    order = request.sort_order
    if request.sort_target != pb.RangeRequest.KEY and order == pb.RangeRequest.NONE:
        order = pb.RangeRequest.ASCEND  # etcd: a sort target other than the key sorts ascending
    if order != pb.RangeRequest.NONE:
        # Stable, as etcd's Go sort is on the few keys a test compares; ties keep key order.
        kvs.sort(key=_SORT_KEYS[request.sort_target], reverse=order == pb.RangeRequest.DESCEND)
    if 0 < request.limit < len(kvs):
        kvs = kvs[:request.limit]
        response.more = True
    response.kvs.extend(to_proto(kv, request.keys_only) for kv in kvs)
    return response


def read_range(txn: lmdb.Transaction, tables: MvccTables, request: pb.RangeRequest,
               revision: int | None = None) -> pb.RangeResponse:
    """A Range served from `txn` (a read, or the write transaction of an apply, which sees its own
    changes); `revision` is the header's (default: the store's)."""
    try:
        check_revision(txn, tables, request.revision)
    except LookupError as exc:
        raise refusal_of(exc) from None
    versions = range_at(txn, tables, request.key, range_end(request.key, request.range_end), request.revision)
    return range_response(versions, request, store_revision(txn, tables) if revision is None else revision)


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


def read_txn(txn: lmdb.Transaction, tables: MvccTables, request: pb.TxnRequest) -> pb.TxnResponse:
    """A read-only transaction (read_only) judged and read from one read transaction, as etcd's
    applier runs it outside the log: the compares, then the chosen branch's ranges. Raises
    EtcdRefusal for a range at a compacted or future revision, before anything is read."""
    path = _path(txn, tables, request)
    _check(txn, tables, request, path)
    revision = store_revision(txn, tables)
    response = pb.TxnResponse()
    _read(txn, tables, request, path, response, revision)
    response.header.revision = revision
    return response


def _read(txn: lmdb.Transaction, tables: MvccTables, request: pb.TxnRequest, path: list[bool],
          response: pb.TxnResponse, revision: int) -> int:
    """`_run` for a read-only transaction; how many entries of `path` it used."""
    used = 1
    response.succeeded = path[0]
    for op in _branch(request, path[0]):
        out = response.responses.add()
        if op.WhichOneof("request") == "request_range":
            out.response_range.CopyFrom(read_range(txn, tables, op.request_range, revision))
        else:
            nested = out.response_txn
            used += _read(txn, tables, op.request_txn, path[used:], nested, revision)
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
    kvs = list(range_at(txn, tables, compare.key, end, 0))
    if not kvs:
        if compare.target == pb.Compare.VALUE:
            return False  # etcd: a value compare on a missing key always fails
        return _holds(compare, KeyVersion(compare.key, b"", 0, 0, 0))
    return all(_holds(compare, kv) for kv in kvs)


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
            try:
                check_revision(txn, tables, op.request_range.revision)
            except LookupError as exc:
                raise refusal_of(exc) from None
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
            out.response_range.CopyFrom(read_range(txn, tables, op.request_range, _read_revision(writer)))
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
