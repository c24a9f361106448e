"""Revisions and transactions on kv.Client: reads at a past revision, a key's revisions and
version, etcd's transactions (compare, then one branch of ops) and compaction. Mixed into Client
as Maintenance is. These calls travel as etcd's KV requests on the same connection (the node
serves etcd's API beside the native one), so a transaction here and one from etcdctl are the
same thing; like etcd's, they are applied at least once: a retry after an unknown outcome may
apply a transaction twice (its compares usually make the second a no-op).

    from kv import Client
    from kv.txn import Value, Version, put, delete, get
    with Client(["127.0.0.1:7001"]) as c:
        result = c.txn(compare=[Value("cfg") == b"v1"], success=[put("cfg", "v2")], failure=[get("cfg")])
        result.succeeded
        c.compare_and_swap("cfg", b"v2", b"v3")
        c.put_if_absent("lock", "me")
        c.get_kv("cfg").mod_revision
        c.get("cfg", revision=2)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kv.client.key_like import KeyLike, to_bytes
from kv.client.txn import Compare, Op, Value, Version, put
from raftkv_proto import etcd_mvcc_pb2, etcd_rpc_pb2 as pb
from raftkv_proto.key_ranges import prefix_end


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key with its revisions, as etcd's mvccpb.KeyValue."""

    key: bytes
    value: bytes
    create_revision: int  # the revision that created the key (its current life)
    mod_revision: int  # the revision of its last change
    version: int  # puts since it was created: 1 at creation
    lease: int = 0

    @classmethod
    def of(cls, kv: etcd_mvcc_pb2.KeyValue) -> KeyValue:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a transaction did: which branch ran, the store's revision after it, and for each op
    of that branch its answer (a get's list of KeyValue, a delete's count, a put's previous
    KeyValue or None)."""

    succeeded: bool
    revision: int
    responses: list[Any]


class Revisions:
    """Mixed into kv.Client: what these calls use of it."""

    _call: Callable[..., Any]

    def get_kv(self, key: KeyLike, revision: int | None = None, consistency: str = "linearizable") -> KeyValue | None:
        """`key` with its revisions and version, as of `revision` (None: now); None when absent.
        RevisionError for a compacted or future revision."""
        return first_kv(self._range(get_kv_request(key, revision, consistency)))

    def revision(self) -> int:
        """The store's revision now: 1 when empty, up by one for every write that changed it."""
        return self._range(revision_request()).header.revision

    def scan_at(self, revision: int, prefix: KeyLike | None = None, start: KeyLike | None = None,
                end: KeyLike | None = None, limit: int = 100, consistency: str = "linearizable",
                keys_only: bool = False) -> list[KeyValue]:
        """The keys (with their revisions) as they were at `revision`: those starting with
        `prefix`, or in [start, end); at most `limit` of them (0: all). "stale" reads the
        member's own state (etcd's serializable); `keys_only` leaves every value b""."""
        response = self._range(scan_at_request(revision, prefix, start, end, limit, consistency, keys_only))
        return [KeyValue.of(kv) for kv in response.kvs]

    def get_range(self, prefix: KeyLike, sort_by: str = "key", descending: bool = False, limit: int = 0,
                  max_create_revision: int = 0, consistency: str = "linearizable") -> tuple[list[KeyValue], int]:
        """etcd's Get with options on the keys starting with `prefix`: sorted by "key", "version",
        "create", "mod" or "value", at most `limit` (0: all), created at or before
        `max_create_revision` (0: any); (the keys, the store's revision of the read)."""
        response = self._range(get_range_request(prefix, sort_by, descending, limit, max_create_revision, consistency))
        return [KeyValue.of(kv) for kv in response.kvs], response.header.revision

    def txn(self, compare: Sequence[Compare] = (), success: Sequence[Op] = (),
            failure: Sequence[Op] = ()) -> TxnResult:
        """etcd's transaction: if every compare holds, the success ops run, else the failure ops,
        all in one revision (kv.txn builds them). At most 128 of each."""
        return txn_result(self._call(lambda stub: stub.etcd.Txn, txn_request(compare, success, failure)))

    def compare_and_swap(self, key: KeyLike, expected: KeyLike, new: KeyLike) -> bool:
        """Write `new` under `key` if its value is `expected` now; whether it did."""
        return self.txn(*compare_and_swap_ops(key, expected, new)).succeeded

    def put_if_absent(self, key: KeyLike, value: KeyLike) -> bool:
        """Write `value` under `key` if the key does not exist; whether it did."""
        return self.txn(*put_if_absent_ops(key, value)).succeeded

    def compact(self, revision: int) -> None:
        """Drop the history below `revision`: reads at older revisions fail from then on (etcd's
        Compact). RevisionError for a revision already compacted or in the future."""
        self._call(lambda stub: stub.etcd.Compact, pb.CompactionRequest(revision=revision))

    def _range(self, request: pb.RangeRequest) -> pb.RangeResponse:
        return self._call(lambda stub: stub.etcd.Range, request)


# The requests and answers of these calls, without their I/O: shared with kv.aio.Client.

def get_kv_request(key: KeyLike, revision: int | None, consistency: str) -> pb.RangeRequest:
    return pb.RangeRequest(key=to_bytes(key), revision=revision or 0, serializable=consistency == "stale")


def first_kv(response: pb.RangeResponse) -> KeyValue | None:
    return KeyValue.of(response.kvs[0]) if response.kvs else None


def revision_request() -> pb.RangeRequest:
    """A read of nothing, for its header's revision."""
    return pb.RangeRequest(key=b"\0", count_only=True)


def scan_at_request(revision: int, prefix: KeyLike | None, start: KeyLike | None, end: KeyLike | None,
                    limit: int, consistency: str, keys_only: bool = False) -> pb.RangeRequest:
    if prefix is not None:
        first = to_bytes(prefix)
        last = prefix_end(first) or b"\0"
    else:
        first = to_bytes(start) if start is not None else b"\0"
        last = to_bytes(end) if end is not None else b"\0"
    return pb.RangeRequest(key=first or b"\0", range_end=last, revision=revision, limit=limit,
                           serializable=consistency == "stale", keys_only=keys_only)


def get_range_request(prefix: KeyLike, sort_by: str, descending: bool, limit: int, max_create_revision: int,
                      consistency: str) -> pb.RangeRequest:
    first = to_bytes(prefix)
    return pb.RangeRequest(
        key=first or b"\0", range_end=prefix_end(first) or b"\0", limit=limit,
        sort_target=_SORT_TARGETS[sort_by],
        sort_order=pb.RangeRequest.DESCEND if descending else pb.RangeRequest.ASCEND,
        max_create_revision=max_create_revision, serializable=consistency == "stale")


def txn_request(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> pb.TxnRequest:
    return pb.TxnRequest(compare=[c.to_proto() for c in compare], success=[op.to_proto() for op in success],
                         failure=[op.to_proto() for op in failure])


def txn_result(response: pb.TxnResponse) -> TxnResult:
    return TxnResult(response.succeeded, response.header.revision, [_answer(r) for r in response.responses])


def compare_and_swap_ops(key: KeyLike, expected: KeyLike, new: KeyLike) -> tuple[list[Compare], list[Op]]:
    return [Value(key) == to_bytes(expected, "value")], [put(key, new)]


def put_if_absent_ops(key: KeyLike, value: KeyLike) -> tuple[list[Compare], list[Op]]:
    return [Version(key) == 0], [put(key, value)]


_SORT_TARGETS = {"key": pb.RangeRequest.KEY, "version": pb.RangeRequest.VERSION, "create": pb.RangeRequest.CREATE,
                 "mod": pb.RangeRequest.MOD, "value": pb.RangeRequest.VALUE}


def _answer(response: pb.ResponseOp) -> Any:
    kind = response.WhichOneof("response")
    if kind == "response_range":
        return [KeyValue.of(kv) for kv in response.response_range.kvs]
    if kind == "response_delete_range":
        return response.response_delete_range.deleted
    if kind == "response_put":
        put_response = response.response_put
        return KeyValue.of(put_response.prev_kv) if put_response.HasField("prev_kv") else None
    nested = response.response_txn
    return TxnResult(nested.succeeded, nested.header.revision, [_answer(r) for r in nested.responses])
