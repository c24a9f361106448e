"""The checks etcd's gRPC layer makes before a KV request reaches its server (etcd 3.4's
etcdserver/api/v3rpc/key.go), with its errors: an etcd client matches on the code and message.
raftkv's own limits, which every face shares, come after them (kv/server/request_checks.py)."""
from __future__ import annotations

from collections.abc import Sequence

import grpc

from raftkv_proto import etcd_rpc_pb2 as pb

# etcd's --max-txn-ops default.
MAX_TXN_OPS = 128


class EtcdError(Exception):
    """A request refused with etcd's gRPC code and message (api/v3rpc/rpctypes/error.go)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


EMPTY_KEY = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")
KEY_NOT_FOUND = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key not found")
VALUE_PROVIDED = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: value is provided")
LEASE_PROVIDED = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: lease is provided")
TOO_MANY_OPS = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations in txn request")
DUPLICATE_KEY = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request")


def check_range(request: pb.RangeRequest) -> None:
    if not request.key:
        raise EMPTY_KEY


def check_put(request: pb.PutRequest) -> None:
    if not request.key:
        raise EMPTY_KEY
    if request.ignore_value and request.value:
        raise VALUE_PROVIDED
    if request.ignore_lease and request.lease:
        raise LEASE_PROVIDED


def check_delete_range(request: pb.DeleteRangeRequest) -> None:
    if not request.key:
        raise EMPTY_KEY


def check_txn(request: pb.TxnRequest, max_ops: int = MAX_TXN_OPS) -> None:
    """etcd's checkTxnRequest, then its put/delete overlap check on both branches."""
    _check_txn_ops(request, max_ops)
    _intervals(request.success)
    _intervals(request.failure)


def _check_txn_ops(request: pb.TxnRequest, max_ops: int) -> None:
    ops = max(len(request.compare), len(request.success), len(request.failure))
    if ops > max_ops:
        raise TOO_MANY_OPS
    if any(not compare.key for compare in request.compare):
        raise EMPTY_KEY
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind == "request_range":
            check_range(op.request_range)
        elif kind == "request_put":
            check_put(op.request_put)
        elif kind == "request_delete_range":
            check_delete_range(op.request_delete_range)
        elif kind == "request_txn":
            _check_txn_ops(op.request_txn, max_ops - ops)  # etcd's budget for nested txns
        else:
            raise KEY_NOT_FOUND  # etcd's answer to an empty op


# A deleted span [start, end): end None for a single key.
_Span = tuple[bytes, "bytes | None"]


def _deleted(spans: Sequence[_Span], key: bytes) -> bool:
    for start, end in spans:
        if key == start if end is None else start <= key < end:
            return True
    return False


def _intervals(ops: Sequence[pb.RequestOp]) -> tuple[set[bytes], list[_Span]]:
    """etcd's checkIntervals: no key put twice, or put and deleted, on any path through the ops."""
    dels: list[_Span] = [(op.request_delete_range.key, op.request_delete_range.range_end or None)
                         for op in ops if op.WhichOneof("request") == "request_delete_range"]
    puts: set[bytes] = set()
    for op in ops:
        if op.WhichOneof("request") != "request_txn":
            continue
        puts_then, dels_then = _intervals(op.request_txn.success)
        puts_else, dels_else = _intervals(op.request_txn.failure)
        for key in puts_then:
            if key in puts or _deleted(dels, key):
                raise DUPLICATE_KEY
            puts.add(key)
        for key in puts_else:
            if (key in puts and key not in puts_then) or _deleted(dels, key):
                raise DUPLICATE_KEY
            puts.add(key)
        dels += dels_then + dels_else
    for op in ops:
        if op.WhichOneof("request") != "request_put":
            continue
        key = op.request_put.key
        if key in puts or _deleted(dels, key):
            raise DUPLICATE_KEY
        puts.add(key)
    return puts, dels
