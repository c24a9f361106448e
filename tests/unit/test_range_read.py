"""A Range measured before it is built (statemachine/range_read.py): the plan chooses the keys
etcd's Range answers with (checked against the one-pass model it replaced, over every sort, filter
and limit), its measure is what the reply takes on the wire, and a refused reply reads no value."""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftkv_proto import etcd_rpc_pb2 as pb
from statemachine.commands import delete_op, encode_command, put_op
from statemachine.kv_state import KVStateMachine
from statemachine.range_read import REPLY_FRAME_BYTES
from tests.unit.test_mvcc import Applier

KEYS = 40


def key(i: int) -> bytes:
    """Every fourth key long (over LMDB's 511 bytes), all of those sharing 602 bytes: stored by a
    digest, they must still come in full-key order among the short ones."""
    return b"k/" + b"L" * 600 + b"%02d" % i if i % 4 == 0 else b"k/%02d" % i


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[KVStateMachine]:
    with KVStateMachine(tmp_path / "state", map_size=64 << 20) as sm:
        rng = random.Random(7)
        apply = Applier(sm)
        for _ in range(3):  # versions, create and mod revisions that differ, values of every size
            puts = [put_op(key(i), bytes([rng.randrange(256)]) * rng.randrange(0, 300))
                    for i in rng.sample(range(KEYS), KEYS // 2)]
            apply.payload(encode_command(puts))
        apply.payload(encode_command([delete_op(b"k/03")]))
        yield sm


def model(sm: KVStateMachine, request: pb.RangeRequest) -> pb.RangeResponse:
    """etcd's Range as one pass over every version with its value (the code the plan replaced)."""
    every = pb.RangeRequest(key=request.key, range_end=request.range_end, revision=request.revision)
    kvs = list(sm.etcd_range(every).kvs)
    response = pb.RangeResponse(count=len(kvs))
    if request.count_only:
        return response
    if request.limit > 0 and request.sort_order == pb.RangeRequest.NONE and not (
            request.min_mod_revision or request.max_mod_revision or request.min_create_revision
            or request.max_create_revision):
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
        order = pb.RangeRequest.ASCEND
    if order != pb.RangeRequest.NONE:
        field = {pb.RangeRequest.KEY: "key", pb.RangeRequest.VERSION: "version", pb.RangeRequest.CREATE:
                 "create_revision", pb.RangeRequest.MOD: "mod_revision", pb.RangeRequest.VALUE: "value"}
        kvs.sort(key=lambda kv: getattr(kv, field[request.sort_target]), reverse=order == pb.RangeRequest.DESCEND)
    if 0 < request.limit < len(kvs):
        kvs = kvs[:request.limit]
        response.more = True
    for kv in kvs:
        response.kvs.add().CopyFrom(kv)
        if request.keys_only:
            response.kvs[-1].value = b""
    return response


def requests() -> Iterator[pb.RangeRequest]:
    targets = [pb.RangeRequest.KEY, pb.RangeRequest.VERSION, pb.RangeRequest.CREATE, pb.RangeRequest.MOD,
               pb.RangeRequest.VALUE]
    orders = [pb.RangeRequest.NONE, pb.RangeRequest.ASCEND, pb.RangeRequest.DESCEND]
    filters = [{}, {"min_mod_revision": 3}, {"max_create_revision": 2}, {"min_create_revision": 3, "max_mod_revision": 4}]
    for target, order, limit, extra, keys_only in itertools.product(targets, orders, (0, 1, 7, 100), filters,
                                                                      (False, True)):
        yield pb.RangeRequest(key=b"k/", range_end=b"k0", sort_target=target, sort_order=order, limit=limit,
                              keys_only=keys_only, **extra)
    yield pb.RangeRequest(key=b"k/", range_end=b"k0", count_only=True, limit=3)
    yield pb.RangeRequest(key=b"k/", range_end=b"k0", revision=2, sort_order=pb.RangeRequest.DESCEND, limit=5)


def is_list(request: pb.RangeRequest) -> bool:
    """In key order at the newest revision, unfiltered: planned by range_read.plan_in_key_order."""
    return (request.sort_order == pb.RangeRequest.NONE and request.sort_target == pb.RangeRequest.KEY
            and not request.revision and not (request.min_mod_revision or request.max_mod_revision
                                              or request.min_create_revision or request.max_create_revision))


class Measured:
    """An allowance that records the size it was shown."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.sizes: list[int] = []

    def __call__(self, size: int) -> None:
        self.sizes.append(size)


def test_the_plan_answers_as_etcds_range_and_measures_the_reply(machine: KVStateMachine) -> None:
    listed = [kv.key for kv in machine.etcd_range(pb.RangeRequest(key=b"k/", range_end=b"k0")).kvs]
    assert listed == sorted(listed) and sum(len(k) > 511 for k in listed) > 1  # long keys in full-key order
    for request in requests():
        allow = Measured()
        response = machine.etcd_range(request, allow)
        expected = model(machine, request)
        response.ClearField("header")
        assert response == expected, request
        (size,) = allow.sizes
        kvs_bytes = pb.RangeResponse(kvs=response.kvs).ByteSize()
        if request.sort_target == pb.RangeRequest.VALUE and 0 < request.limit:
            assert kvs_bytes <= size - REPLY_FRAME_BYTES, request  # an upper bound: the values choose
        elif is_list(request):  # bounded by lengths alone: at most 32 bytes a key over
            assert kvs_bytes <= size - REPLY_FRAME_BYTES <= kvs_bytes + 32 * len(response.kvs), request
        else:
            assert kvs_bytes == size - REPLY_FRAME_BYTES, request  # protobuf's own size, exactly
        # The frame holds the largest header a member fills, with count and more.
        full = pb.RangeResponse(count=1 << 62, more=True, header=pb.ResponseHeader(
            cluster_id=(1 << 64) - 1, member_id=(1 << 64) - 1, revision=1 << 62, raft_term=1 << 62))
        assert full.ByteSize() <= REPLY_FRAME_BYTES


def test_one_key_is_answered_as_the_range_of_that_key_alone(machine: KVStateMachine) -> None:
    """A Range with no range end takes a lookup of its own (range_read.read_key): the same reply
    as the planned range [key, key + "\\0"), for live, deleted and absent keys, at past
    revisions, with filters, count_only, keys_only and limits."""
    filters = [{}, {"min_mod_revision": 3}, {"max_create_revision": 2}, {"min_create_revision": 3, "max_mod_revision": 4}]
    for i, revision, extra, flags in itertools.product(
            range(KEYS + 2), (0, 2, 3), filters,
            ({}, {"count_only": True}, {"keys_only": True}, {"limit": 1}, {"limit": 5, "sort_order": pb.RangeRequest.DESCEND})):
        one = pb.RangeRequest(key=key(i), revision=revision, **extra, **flags)
        as_range = pb.RangeRequest()
        as_range.CopyFrom(one)
        as_range.range_end = key(i) + b"\0"
        assert machine.etcd_range(one) == machine.etcd_range(as_range), one


class Refused(Exception):
    pass


def test_a_reply_refused_on_its_measure_reads_no_value(machine: KVStateMachine,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import statemachine.range_read as range_read
    read: list[bytes] = []
    version_at, listed = range_read.version_at, range_read.listed
    monkeypatch.setattr(range_read, "version_at", lambda txn, tables, key, revision: read.append(key) or
                        version_at(txn, tables, key, revision))
    monkeypatch.setattr(range_read, "listed", lambda key, record, keys_only: read.append(key) or
                        listed(key, record, keys_only))

    def refuse(size: int) -> None:
        raise Refused(size)
    refuse.max_bytes = 1000  # type: ignore[attr-defined]
    with pytest.raises(Refused) as refused:
        machine.etcd_range(pb.RangeRequest(key=b"\0", range_end=b"\0"), refuse)  # type: ignore[arg-type]
    assert not read
    # The size it was refused at is the whole reply's, exactly (past max_bytes a list is measured
    # from its records, not bounded), and no key was held to find it.
    whole = machine.etcd_range(pb.RangeRequest(key=b"\0", range_end=b"\0"))
    assert refused.value.args[0] == pb.RangeResponse(kvs=whole.kvs).ByteSize() + REPLY_FRAME_BYTES > 1000
    assert read  # the check above reads values: it would see a read
    # Sorted, the same: measured and refused before any value is read.
    read.clear()
    with pytest.raises(Refused) as refused:
        machine.etcd_range(pb.RangeRequest(key=b"\0", range_end=b"\0", sort_order=pb.RangeRequest.DESCEND), refuse)  # type: ignore[arg-type]
    assert not read and refused.value.args[0] > 1000


def test_a_read_only_txn_is_measured_as_one_reply(machine: KVStateMachine) -> None:
    everything = pb.RequestOp(request_range=pb.RangeRequest(key=b"\0", range_end=b"\0"))
    one = Measured()
    machine.etcd_range(everything.request_range, one)
    nested = pb.RequestOp(request_txn=pb.TxnRequest(success=[everything, everything]))
    together = Measured()
    response = machine.etcd_read_txn(pb.TxnRequest(success=[everything, nested]), together)
    assert together.sizes == [3 * one.sizes[0]]
    assert [len(r.response_range.kvs) for r in response.responses[1].response_txn.responses] == \
        [len(response.responses[0].response_range.kvs)] * 2
