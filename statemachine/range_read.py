"""etcd's Range read in two passes over one read transaction, so that a reply is measured before
it is built: `plan_range` walks the range reading only each version's revisions and the length of
its value (no value is copied out), chooses the keys etcd would answer with (count before the
revision filters, then filters, sort, limit), and adds up the bytes their KeyValues take on the
wire; `fill_range` then reads the values of the reply's keys alone, straight into the response.
Between the two the caller may refuse the reply (too large, no room on the member: `Allow`), before
any memory is spent on values.

A reply in key order (no sort: the usual list) holds no key between the passes: `fill_range` reads
the range again and takes the first keys that pass the filters. A sorted one holds each candidate
key with its revisions (what the sort needs), never a value; sorted by value, it keeps them
unsorted, sizes the reply as the largest `limit` of them could be, and `fill_range` keeps only the
`limit` first values as it reads them.

Two shortcuts: a Range of one key is one lookup (`read_key`: its reply is bounded by one entry);
a list (in key order, no filter, at the newest revision: what Kubernetes and `etcdctl get
--prefix` ask) is planned and filled straight from the stored records, with no version decoded
between (`plan_in_key_order`, `_fill_listed`): its plan bounds the reply by the keys' and
records' lengths (exact only when the bound is over the caller's limit), and a page of one or a
count measures only its first `limit` keys and counts the rest by key alone."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import lmdb

from raftkv_proto import etcd_rpc_pb2 as pb
from statemachine.key_record import HEADER_BYTES, KeyVersion, listed, revisions_of
from statemachine.mvcc import MvccTables, range_at, store_revision, version_at
from statemachine.value_checksum import CHECKSUM_BYTES

# A Range reply's bytes beside its KeyValues: the header (filled by the face: cluster and member
# ids, revision, term), count and more. An upper bound, so that a measured size never falls short.
REPLY_FRAME_BYTES = 64
_RECORD_OVERHEAD = CHECKSUM_BYTES + HEADER_BYTES  # a record's bytes beside its value

class Allow(Protocol):
    """Called with a reply's measured size before its values are read; raises to refuse it.
    `max_bytes` (None: no bound) lets a plan stop holding keys once the reply is sure to be over."""

    max_bytes: int | None

    def __call__(self, size: int) -> None: ...


class _AllowAny:
    max_bytes = None

    def __call__(self, size: int) -> None:
        pass


allow_any: Allow = _AllowAny()  # a read no one bounds (a Range inside a transaction applied from the log)


class _Versioned(Protocol):
    key: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class Listed:
    """A key version as a plan sees it: its revisions and the length of its value, not the value."""

    key: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int
    value_bytes: int


@dataclass(slots=True)
class RangePlan:
    request: pb.RangeRequest
    bounds: tuple[bytes, bytes | None]  # [start, end) of the keys read
    count: int  # keys in range, before the revision filters (etcd's count)
    # The reply's keys in reply order (by value: unsorted, every candidate); None: the first
    # `taken` keys in key order that pass the filters.
    chosen: list[Listed] | None
    taken: int  # keys in the reply
    more: bool
    wire_bytes: int  # the reply's size on the wire, at most (exact unless sorted by value or a list's bound)
    revision: int  # the header's revision
    by_value: bool  # sorted by value: `chosen` holds every candidate, unsorted
    listing: bool = False  # a list (plan_in_key_order): filled from the records as they are stored


def kv_wire_bytes(key: int, value: int, create: int, mod: int, version: int, lease: int) -> int:
    """Bytes of one mvccpb.KeyValue as an entry of a repeated field (tag, length, fields):
    protobuf's own arithmetic, so a reply's measure matches what SerializeToString writes. Run
    once per key of every list: the varints of the positive numbers are sized inline."""
    body = 0
    if key:
        body += 1 + (key.bit_length() + 6) // 7 + key
    if value:
        body += 1 + (value.bit_length() + 6) // 7 + value
    if create:
        body += 1 + (create.bit_length() + 6) // 7
    if mod:
        body += 1 + (mod.bit_length() + 6) // 7
    if version:
        body += 1 + (version.bit_length() + 6) // 7
    if lease:
        body += 1 + _varint_bytes(lease)  # an int64: a negative one takes ten bytes
    return 1 + (body.bit_length() + 6) // 7 + body


def _varint_bytes(n: int) -> int:
    return 10 if n < 0 else max(1, (n.bit_length() + 6) // 7)


def listed_range(txn: lmdb.Transaction, tables: MvccTables, start: bytes, end: bytes | None,
                 revision: int) -> Iterator[Listed]:
    """The versions in [start, end) at `revision` (0: the newest), in key order, without values:
    at the newest revision straight from each record's header and length."""
    if revision > 0 and revision < store_revision(txn, tables):
        for kv in range_at(txn, tables, start, end, revision):
            yield Listed(kv.key, kv.create_revision, kv.mod_revision, kv.version, kv.lease, len(kv.value))
        return
    for key, record in tables.data.ordered(txn, start, end):  # long keys merged in, by full key
        create, mod, _, version, lease = revisions_of(record)
        yield Listed(key, create, mod, version, lease, len(record) - _RECORD_OVERHEAD)


_SORT_KEYS: dict[int, Callable[[_Versioned], object]] = {
    pb.RangeRequest.KEY: lambda kv: kv.key,
    pb.RangeRequest.VERSION: lambda kv: kv.version,
    pb.RangeRequest.CREATE: lambda kv: kv.create_revision,
    pb.RangeRequest.MOD: lambda kv: kv.mod_revision,
}


def plan_in_key_order(txn: lmdb.Transaction, tables: MvccTables, request: pb.RangeRequest, revision: int,
                      bounds: tuple[bytes, bytes | None], max_bytes: int | None = None) -> RangePlan | None:
    """plan_range's plan for a list: a range at the newest revision, in key order, with no
    filter (Kubernetes' lists and their pages, `etcdctl get --prefix`), in one walk of the
    records as they are stored. The reply is bounded by its keys' and records' lengths alone
    (`_list_bound`: at most 32 bytes a key over protobuf's size, no record read); only a reply whose
    bound is over `max_bytes` is measured exactly, from each record's header, so that a refusal
    names its true size. With a limit (or count_only) only the first `limit` keys are measured,
    the rest counted by key alone (etcd's count covers the whole range; etcd counts from its
    in-memory index). None when the request is not such a range."""
    newest = store_revision(txn, tables)
    if (request.sort_order != pb.RangeRequest.NONE or request.sort_target != pb.RangeRequest.KEY
            or _filtered(request) or 0 < request.revision < newest):
        return None
    plan = RangePlan(request, bounds, 0, None, 0, False, REPLY_FRAME_BYTES, revision, False, listing=True)
    if request.count_only:
        plan.count = tables.data.count_range(txn, *bounds)
        return plan
    keys_only = request.keys_only
    records = tables.data.ordered(txn, *bounds)
    if request.limit > 0:
        records = itertools.islice(records, request.limit)
    size = taken = 0
    for key, record in records:
        size += len(key) if keys_only else len(key) + len(record)
        taken += 1
    size += taken * _list_bound(newest + 1, keys_only)  # a transaction's own writes carry the next revision
    if max_bytes is not None and size > max_bytes:
        size = _measured(tables.data.ordered(txn, *bounds), taken, keys_only)
    plan.taken = taken
    plan.wire_bytes += size
    plan.count = tables.data.count_range(txn, *bounds) if request.limit > 0 else taken
    plan.more = plan.count > taken
    return plan


# Bytes of any length below 2^35 as a varint: every key, value and KeyValue a member can hold.
_LENGTH_VARINT_BYTES = 5


def _list_bound(revision: int, keys_only: bool) -> int:
    """What one KeyValue of a list at the newest revision takes on the wire beyond len(key) (with
    `keys_only`) or len(key) + len(record): its entry's tag and length, the key's tag and length,
    three revisions (create, mod and version, none above `revision`), a lease (an
    int64: at most ten bytes) and, with its value, the value's tag and length, less the record's
    own bytes beside the value. At most 32 bytes a key over protobuf's size (every length taken as
    five bytes, a lease always), 2-3% of a list of 1 KiB values."""
    fields = (1 + _LENGTH_VARINT_BYTES) * 2 + 3 * (1 + _varint_bytes(revision)) + 1 + 10
    return fields if keys_only else fields + 1 + _LENGTH_VARINT_BYTES - _RECORD_OVERHEAD


def _measured(records: Iterable[tuple[bytes, bytes]], taken: int, keys_only: bool) -> int:
    """The exact wire size of the first `taken` records' KeyValues, from their headers."""
    size = 0
    for key, record in itertools.islice(records, taken):
        create, mod, _, version, lease = revisions_of(record)
        size += kv_wire_bytes(len(key), 0 if keys_only else len(record) - _RECORD_OVERHEAD, create, mod,
                              version, lease)
    return size


def plan_range(listed: Iterable[Listed], request: pb.RangeRequest, revision: int,
               bounds: tuple[bytes, bytes | None], max_bytes: int | None = None) -> RangePlan:
    """etcd's choice of keys for `request` over the versions a read found in [bounds) (in key
    order), as its Range applies them: count before the revision filters, then filters, sort,
    limit, keys_only. A reply in key order holds no key: `fill_range` reads the range again and
    takes the first `taken` that pass the filters. A sorted one holds its keys, unless it has no
    limit and is sure to exceed `max_bytes` (then it is only counted and measured)."""
    filtered = _filtered(request)
    order = request.sort_order
    if request.sort_target != pb.RangeRequest.KEY and order == pb.RangeRequest.NONE:
        order = pb.RangeRequest.ASCEND  # etcd: a sort target other than the key sorts ascending
    by_value = order != pb.RangeRequest.NONE and request.sort_target == pb.RangeRequest.VALUE
    plan = RangePlan(request, bounds, 0, None, 0, False, REPLY_FRAME_BYTES, revision, by_value)
    limit = request.limit if request.limit > 0 else None
    in_key_order = order == pb.RangeRequest.NONE
    # etcd reads limit + 1 keys in key order, then sorts those by a target other than the key.
    keep = limit + 1 if limit is not None and request.sort_order == pb.RangeRequest.NONE and not filtered else None
    kvs: list[Listed] = []
    passed = size = 0
    for kv in listed:
        plan.count += 1
        if request.count_only or (keep is not None and passed >= keep) or (filtered and not _passes(kv, request)):
            continue
        passed += 1
        if in_key_order or limit is None:  # this key is in the reply: measured as it comes
            if limit is not None and passed > limit:
                continue  # counted for `more` only
            size += _wire_bytes(kv, request.keys_only)
            if in_key_order:
                continue  # nothing to hold: fill_range reads the range again
            if max_bytes is not None and size > max_bytes:
                kvs.clear()  # too large whatever follows: measure on, hold nothing
                continue
        kvs.append(kv)
    if request.count_only:
        return plan
    plan.more = limit is not None and passed > limit
    if in_key_order:
        plan.taken = min(passed, limit or passed)
        plan.wire_bytes += size
        return plan
    if limit is None and max_bytes is not None and size > max_bytes:
        plan.chosen = []  # for the allowance to refuse (its max_bytes): no key was kept to fill
        plan.wire_bytes += size
        return plan
    if not by_value:
        # Stable, as etcd's Go sort is on the few keys a test compares; ties keep key order.
        kvs.sort(key=_SORT_KEYS[request.sort_target], reverse=order == pb.RangeRequest.DESCEND)
        kvs = kvs[:limit]
    plan.chosen = kvs
    plan.taken = min(len(kvs), limit or len(kvs))
    sizes = [_wire_bytes(kv, request.keys_only) for kv in kvs]
    if by_value and limit is not None:
        sizes = heapq.nlargest(limit, sizes)  # whichever keys the values choose, at most these
    plan.wire_bytes += sum(sizes)
    return plan


def _filtered(request: pb.RangeRequest) -> bool:
    return bool(request.max_mod_revision or request.min_mod_revision or request.max_create_revision
                or request.min_create_revision)


def _passes(kv: _Versioned, request: pb.RangeRequest) -> bool:
    return ((not request.max_mod_revision or kv.mod_revision <= request.max_mod_revision)
            and (not request.min_mod_revision or kv.mod_revision >= request.min_mod_revision)
            and (not request.max_create_revision or kv.create_revision <= request.max_create_revision)
            and (not request.min_create_revision or kv.create_revision >= request.min_create_revision))


def _wire_bytes(kv: Listed, keys_only: bool) -> int:
    return kv_wire_bytes(len(kv.key), 0 if keys_only else kv.value_bytes, kv.create_revision, kv.mod_revision,
                         kv.version, kv.lease)


def fill_range(txn: lmdb.Transaction, tables: MvccTables, plan: RangePlan, response: pb.RangeResponse) -> None:
    """`plan`'s reply into `response`, reading its keys' values from `txn` (the transaction the
    plan was made in: the same versions)."""
    request = plan.request
    response.count = plan.count
    response.more = plan.more
    response.header.revision = plan.revision
    if request.count_only or not plan.taken:
        return
    if plan.listing:
        _fill_listed(txn, tables, plan, response)
        return
    versions: Iterable[KeyVersion]
    if plan.chosen is None:  # in key order: the first that pass the filters, read again
        versions = range_at(txn, tables, plan.bounds[0], plan.bounds[1], request.revision)
        if _filtered(request):
            versions = (kv for kv in versions if _passes(kv, request))
        versions = itertools.islice(versions, plan.taken)
    else:
        versions = (_version(txn, tables, kv.key, request.revision) for kv in plan.chosen)
        if plan.by_value:
            versions = _by_value(versions, request)
    add = response.kvs.add
    keys_only = request.keys_only
    for kv in versions:
        add(key=kv.key, create_revision=kv.create_revision, mod_revision=kv.mod_revision, version=kv.version,
            value=b"" if keys_only else kv.value, lease=kv.lease)


def _fill_listed(txn: lmdb.Transaction, tables: MvccTables, plan: RangePlan, response: pb.RangeResponse) -> None:
    """The first `plan.taken` keys of a list at the newest revision, from their records as they
    are stored (key_record.listed: checked, no KeyVersion made): the per-key work of a list."""
    add = response.kvs.add
    keys_only = plan.request.keys_only
    for key, record in tables.data.first(txn, plan.bounds[0], plan.taken):  # counted by the plan
        create, mod, version, lease, value = listed(key, record, keys_only)
        add(key=key, create_revision=create, mod_revision=mod, version=version, value=value, lease=lease)


def read_key(txn: lmdb.Transaction, tables: MvccTables, request: pb.RangeRequest, revision: int,
             response: pb.RangeResponse) -> None:
    """A Range of one key (no range end) into `response`, in one lookup: plan_range and fill_range
    would agree on it (counted before the filters; no sort, limit or `more` can change one key),
    and its size is bounded by one entry's, so there is nothing to measure first. The caller
    checked the request's revision; `revision` is the header's."""
    response.header.revision = revision
    kv = version_at(txn, tables, request.key, request.revision)
    if kv is None:
        return
    response.count = 1
    if request.count_only or not _passes(kv, request):
        return
    response.kvs.add(key=kv.key, create_revision=kv.create_revision, mod_revision=kv.mod_revision,
                     version=kv.version, value=b"" if request.keys_only else kv.value, lease=kv.lease)


def _by_value(versions: Iterable[KeyVersion], request: pb.RangeRequest) -> list[KeyVersion]:
    """The versions sorted by value as etcd's Range does (ascending unless DESCEND), cut to the
    limit while they are read (heapq's nsmallest and nlargest equal a stable sort's first n)."""
    descend = request.sort_order == pb.RangeRequest.DESCEND
    if request.limit > 0:
        pick = heapq.nlargest if descend else heapq.nsmallest
        return pick(request.limit, versions, key=lambda kv: kv.value)
    return sorted(versions, key=lambda kv: kv.value, reverse=descend)


def _version(txn: lmdb.Transaction, tables: MvccTables, key: bytes, revision: int) -> KeyVersion:
    kv = version_at(txn, tables, key, revision)
    assert kv is not None, "a planned key is read in the transaction that listed it"
    return kv
