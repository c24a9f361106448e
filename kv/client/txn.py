"""A small builder for etcd transactions on kv.Client.txn: compares written as comparisons, ops as
calls.

    from kv.txn import Value, Version, CreateRevision, ModRevision, put, delete, get
    c.txn(compare=[Value("cfg") == b"v1", ModRevision("cfg") < 10, Version("lock") == 0],
          success=[put("cfg", "v2"), delete("old/", prefix=True)],
          failure=[get("cfg")])

A compare on a missing key sees version, create and mod revision 0; a Value compare on a missing
key is false, whatever the operator (etcd's rule)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kv.client.key_like import KeyLike, to_bytes
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.key_ranges import prefix_end

_RESULTS = {"==": pb.Compare.EQUAL, "!=": pb.Compare.NOT_EQUAL, ">": pb.Compare.GREATER, "<": pb.Compare.LESS}


@dataclass(frozen=True, slots=True)
class Compare:
    """One compare of a transaction: `target` of `key` `op` `operand`."""

    key: bytes
    target: int  # pb.Compare.VALUE, VERSION, CREATE, MOD, LEASE
    op: str
    operand: Any

    def to_proto(self) -> pb.Compare:
        compare = pb.Compare(key=self.key, target=self.target, result=_RESULTS[self.op])
        field = {pb.Compare.VALUE: "value", pb.Compare.VERSION: "version", pb.Compare.CREATE: "create_revision",
                 pb.Compare.MOD: "mod_revision", pb.Compare.LEASE: "lease"}[self.target]
        setattr(compare, field, self.operand)
        return compare


class _Target:
    """What a compare looks at, for one key; comparing it with a value makes a Compare."""

    target: int

    def __init__(self, key: KeyLike) -> None:
        self.key = to_bytes(key)

    def _operand(self, other: Any) -> Any:
        return int(other)

    def _make(self, op: str, other: Any) -> Compare:
        return Compare(self.key, self.target, op, self._operand(other))

    def __eq__(self, other: object) -> Compare:  # type: ignore[override]
        return self._make("==", other)

    def __ne__(self, other: object) -> Compare:  # type: ignore[override]
        return self._make("!=", other)

    def __gt__(self, other: Any) -> Compare:
        return self._make(">", other)

    def __lt__(self, other: Any) -> Compare:
        return self._make("<", other)

    __hash__ = None  # type: ignore[assignment]


class Value(_Target):
    target = pb.Compare.VALUE

    def _operand(self, other: Any) -> Any:
        return to_bytes(other, "value")


class Version(_Target):
    target = pb.Compare.VERSION


class CreateRevision(_Target):
    target = pb.Compare.CREATE


class ModRevision(_Target):
    target = pb.Compare.MOD


class Lease(_Target):
    """The id of the lease a key is attached to (0: none)."""

    target = pb.Compare.LEASE


@dataclass(frozen=True, slots=True)
class Op:
    """One op of a transaction's branch."""

    request: pb.RequestOp

    def to_proto(self) -> pb.RequestOp:
        return self.request


def put(key: KeyLike, value: KeyLike, prev_kv: bool = False, lease: int = 0) -> Op:
    return Op(pb.RequestOp(request_put=pb.PutRequest(key=to_bytes(key), value=to_bytes(value, "value"),
                                                     prev_kv=prev_kv, lease=lease)))


def delete(key: KeyLike, prefix: bool = False) -> Op:
    """Delete `key`, or with `prefix` every key starting with it."""
    first = to_bytes(key)
    end = (prefix_end(first) or b"\0") if prefix else b""  # etcd's "\0": every key from `key` on
    return Op(pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=first, range_end=end)))


def get(key: KeyLike, prefix: bool = False, first_created: bool = False) -> Op:
    """Read `key`, or with `prefix` every key starting with it, inside the transaction; with
    `first_created`, only the oldest key under the prefix (etcd's WithFirstCreate)."""
    first = to_bytes(key)
    end = (prefix_end(first) or b"\0") if prefix or first_created else b""  # etcd's "\0": from `key` on
    request = pb.RangeRequest(key=first, range_end=end)
    if first_created:
        request.sort_target, request.sort_order, request.limit = pb.RangeRequest.CREATE, pb.RangeRequest.ASCEND, 1
    return Op(pb.RequestOp(request_range=request))


def txn(compare: list[Compare], success: list[Op] = (), failure: list[Op] = ()) -> Op:  # type: ignore[assignment]
    """A nested transaction, as an op of an outer one's branch."""
    return Op(pb.RequestOp(request_txn=pb.TxnRequest(compare=[c.to_proto() for c in compare],
                                                      success=[op.request for op in success],
                                                      failure=[op.request for op in failure])))

