"""Revisions (statemachine/mvcc.py) through the state machine: every read at every kept revision
equals a model that remembers each revision's whole store, across compactions."""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raft.core import Entry, EntryType
from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import kv_pb2
from statemachine import KVStateMachine
from statemachine.commands import (
    delete_op,
    encode_command,
    encode_compaction,
    encode_etcd_txn,
    encode_lease_checkpoints,
    encode_lease_grant,
    encode_lease_revoke,
    put_op,
)
from statemachine.etcd_txn import COMPACTED, FUTURE_REVISION, EtcdRefusal, read_only
from statemachine.mvcc import changes_between


@dataclass(frozen=True)
class Version:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


class Model:
    """The store at every revision, as plain dicts."""

    def __init__(self) -> None:
        self.revisions: dict[int, dict[bytes, Version]] = {1: {}}
        self.revision = 1
        self.compacted = 0

    def apply(self, ops: list[tuple[str, bytes, bytes]]) -> int:
        store = dict(self.revisions[self.revision])
        pending, changed = self.revision + 1, False
        for kind, key, value in ops:
            if kind == "put":
                old = store.get(key)
                store[key] = Version(value, old.create_revision if old else pending, pending,
                                     old.version + 1 if old else 1)
                changed = True
            elif key in store:
                del store[key]
                changed = True
        if changed:
            self.revision = pending
            self.revisions[pending] = store
        return self.revision


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[KVStateMachine]:
    with KVStateMachine(tmp_path / "state", map_size=64 << 20) as sm:
        yield sm


class Applier:
    def __init__(self, sm: KVStateMachine) -> None:
        self.sm = sm
        self.index = 0

    def payload(self, payload: bytes) -> kv_pb2.CommandResult:
        self.index += 1
        (outcome,) = self.sm.apply([Entry(self.index, 1, EntryType.NORMAL, payload)])
        assert outcome is not None
        return outcome.result

    def ops(self, ops: list[kv_pb2.Op]) -> kv_pb2.CommandResult:
        return self.payload(encode_command(ops))

    def txn(self, request: pb.TxnRequest) -> tuple[kv_pb2.CommandResult, pb.TxnResponse]:
        result = self.payload(encode_etcd_txn(request.SerializeToString()))
        return result, pb.TxnResponse.FromString(result.etcd_txn_response)


def read_all(sm: KVStateMachine, revision: int) -> dict[bytes, Version]:
    every_key = pb.RangeRequest(key=b"\0", range_end=b"\0", revision=revision)
    return {kv.key: Version(kv.value, kv.create_revision, kv.mod_revision, kv.version)
            for kv in sm.etcd_range(every_key).kvs}


def version_of(sm: KVStateMachine, key: bytes, revision: int = 0) -> mvccpb.KeyValue | None:
    """`key` as a Range at `revision` (0: the newest) finds it."""
    kvs = sm.etcd_range(pb.RangeRequest(key=key, revision=revision)).kvs
    return kvs[0] if kvs else None


def test_an_empty_store_is_at_revision_1_and_each_changing_command_adds_one(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    assert machine.revision == 1
    assert apply.ops([put_op(b"a", b"1"), put_op(b"b", b"2")]).revision == 2  # one command, one revision
    assert apply.ops([delete_op(b"missing")]).revision == 2  # changed nothing
    assert apply.ops([put_op(b"a", b"3")]).revision == 3
    a = version_of(machine, b"a")
    assert (a.create_revision, a.mod_revision, a.version, a.value) == (2, 3, 2, b"3")
    assert apply.ops([delete_op(b"a")]).revision == 4
    assert apply.ops([put_op(b"a", b"4")]).revision == 5
    a = version_of(machine, b"a")
    assert (a.create_revision, a.mod_revision, a.version) == (5, 5, 1)  # a new life: version from 1
    assert version_of(machine, b"a", 3).value == b"3"
    assert version_of(machine, b"a", 4) is None
    assert version_of(machine, b"a", 1) is None


def test_reads_at_every_revision_match_the_model_across_compactions(machine: KVStateMachine) -> None:
    rng = random.Random(7)
    apply, model = Applier(machine), Model()
    keys = [b"k%d" % i for i in range(12)] + [b"x" * 511, b"x" * 510 + b"y"]  # LMDB's longest keys too
    for step in range(300):
        ops = []
        for _ in range(rng.randint(1, 4)):
            key = rng.choice(keys)
            if rng.random() < 0.7:
                ops.append(("put", key, b"v%d" % step))
            else:
                ops.append(("delete", key, b""))
        native = [put_op(k, v) if kind == "put" else delete_op(k) for kind, k, v in ops]
        assert apply.ops(native).revision == model.apply(ops)
        if step % 60 == 59:
            target = rng.randint(model.compacted + 1, model.revision)
            assert not apply.payload(encode_compaction(target)).refusal
            model.compacted = target
    assert machine.revision == model.revision
    for revision in range(model.compacted, model.revision + 1):
        expected = model.revisions[max(r for r in model.revisions if r <= revision)]
        assert read_all(machine, revision) == expected, revision
    with pytest.raises(EtcdRefusal, match="compacted"):
        read_all(machine, model.compacted - 1)
    with pytest.raises(EtcdRefusal, match="future revision"):
        version_of(machine, b"k1", model.revision + 1)


def test_compaction_drops_what_no_kept_revision_can_see(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    for i in range(50):
        apply.ops([put_op(b"hot", b"%d" % i)])
    apply.ops([delete_op(b"hot")])
    history = machine._mvcc.history
    with machine._env.begin() as txn:
        assert txn.stat(history)["entries"] == 51  # every version the key had, and its tombstone
    apply.payload(encode_compaction(machine.revision))
    with machine._env.begin() as txn:
        # The delete at the compacted revision stays, and its tombstone with it: a watch from the
        # compacted revision replays that change.
        assert txn.stat(history)["entries"] == 1
        assert txn.stat(machine._mvcc.history_index.short)["entries"] == 1
        assert txn.stat(machine._mvcc.changes)["entries"] == 1
    apply.ops([put_op(b"other", b"x")])
    apply.payload(encode_compaction(machine.revision))  # a later compaction takes the tombstone
    with machine._env.begin() as txn:
        assert txn.stat(history)["entries"] == 0 and txn.stat(machine._mvcc.history_index.short)["entries"] == 0


def test_a_watch_from_the_compacted_revision_replays_a_delete_at_that_revision(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    apply.ops([put_op(b"k", b"1")])  # revision 2
    apply.ops([delete_op(b"k")])  # 3
    apply.payload(encode_compaction(3))
    apply.ops([put_op(b"k", b"2")])  # 4: k lives again, so the live record is not the change at 3
    replayed = [(c.kv.key, c.kv.mod_revision, c.kv.tombstone, c.kv.value) for c in machine.changes(3, 4)]
    assert replayed == [(b"k", 3, True, b""), (b"k", 4, False, b"2")]


def test_compaction_refusals_are_etcds(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    apply.ops([put_op(b"a", b"1")])
    apply.ops([put_op(b"a", b"2")])
    future = apply.payload(encode_compaction(10))
    assert (future.refusal_kind, future.refusal) == ("OUT_OF_RANGE", "etcdserver: mvcc: required revision is a future revision")
    assert not apply.payload(encode_compaction(2)).refusal
    again = apply.payload(encode_compaction(1))
    assert again.refusal == "etcdserver: mvcc: required revision has been compacted"


def _put(key: bytes, value: bytes, **kwargs: object) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, **kwargs))


def test_a_txn_judges_every_compare_before_its_ops_and_its_ops_share_a_revision(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    apply.ops([put_op(b"a", b"1")])  # revision 2
    request = pb.TxnRequest(
        compare=[pb.Compare(key=b"a", target=pb.Compare.VALUE, result=pb.Compare.EQUAL, value=b"1"),
                 pb.Compare(key=b"b", target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=0)],
        success=[_put(b"a", b"2", prev_kv=True), _put(b"b", b"1"),
                 pb.RequestOp(request_range=pb.RangeRequest(key=b"a", range_end=b"c")),
                 # A nested txn's compare sees the store before the outer ops: b is still absent.
                 pb.RequestOp(request_txn=pb.TxnRequest(
                     compare=[pb.Compare(key=b"b", target=pb.Compare.CREATE, result=pb.Compare.EQUAL,
                                         create_revision=0)],
                     success=[_put(b"c", b"yes")], failure=[_put(b"c", b"no")]))])
    result, response = apply.txn(request)
    assert result.revision == 3 and response.succeeded and response.header.revision == 3
    assert response.responses[0].response_put.prev_kv.value == b"1"
    reads = response.responses[2].response_range
    assert [(kv.key, kv.value, kv.mod_revision) for kv in reads.kvs] == [(b"a", b"2", 3), (b"b", b"1", 3)]
    assert response.responses[3].response_txn.succeeded
    assert machine.get(b"c") == b"yes"
    assert {kv.mod_revision for kv in machine.etcd_range(pb.RangeRequest(key=b"\0", range_end=b"\0")).kvs} == {3}
    # The failure branch, and a txn that only reads moves no revision.
    result, response = apply.txn(pb.TxnRequest(
        compare=[pb.Compare(key=b"a", target=pb.Compare.MOD, result=pb.Compare.LESS, mod_revision=3)],
        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=b"a"))]))
    assert not response.succeeded and result.revision == 3
    assert response.responses[0].response_range.kvs[0].value == b"2"


def test_a_value_compare_on_a_missing_key_fails_as_etcds(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    _, response = apply.txn(pb.TxnRequest(
        compare=[pb.Compare(key=b"nope", target=pb.Compare.VALUE, result=pb.Compare.NOT_EQUAL, value=b"x")],
        success=[_put(b"k", b"v")]))
    assert not response.succeeded and machine.get(b"k") is None


def test_a_put_with_ignore_value_on_a_missing_key_is_refused_and_changes_nothing(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    result, _ = apply.txn(pb.TxnRequest(success=[_put(b"a", b"1"), _put(b"z", b"", ignore_value=True)]))
    assert (result.refusal_kind, result.refusal) == ("INVALID_ARGUMENT", "etcdserver: key not found")
    assert machine.get(b"a") is None and machine.revision == 1


def test_a_delete_range_reports_what_it_deleted(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    apply.ops([put_op(b"p/1", b"1"), put_op(b"p/2", b"2"), put_op(b"q", b"3")])
    result, response = apply.txn(pb.TxnRequest(success=[pb.RequestOp(
        request_delete_range=pb.DeleteRangeRequest(key=b"p/", range_end=b"p0", prev_kv=True))]))
    deleted = response.responses[0].response_delete_range
    assert deleted.deleted == 2 and [kv.key for kv in deleted.prev_kvs] == [b"p/1", b"p/2"]
    assert result.revision == 3 and version_of(machine, b"p/1", 2).value == b"1"


def test_move_prefix_keeps_the_old_keys_history(machine: KVStateMachine) -> None:
    apply = Applier(machine)
    apply.ops([put_op(b"stage/a", b"1"), put_op(b"live/a", b"0")])
    apply.ops([kv_pb2.Op(move_prefix=kv_pb2.MovePrefix(source=b"stage/", target=b"live/"))])
    assert machine.get(b"stage/a") is None and machine.get(b"live/a") == b"1"
    assert version_of(machine, b"live/a").version == 2
    assert version_of(machine, b"stage/a", 2).value == b"1"


def test_changes_between_replays_every_change_with_the_version_it_replaced(machine: KVStateMachine) -> None:
    rng = random.Random(11)
    apply, model = Applier(machine), Model()
    keys = [b"w/%d" % i for i in range(8)] + [b"other"]
    expected: list[tuple[int, bytes, Version | None, Version | None]] = []  # (revision, key, version, prev)
    for step in range(150):
        chosen = rng.sample(keys, rng.randint(1, 3))  # distinct keys: one change per key per revision
        ops = [("put" if rng.random() < 0.7 else "delete", key, b"v%d" % step) for key in chosen]
        before = model.revisions[model.revision]
        revision = model.apply(ops)
        apply.ops([put_op(k, v) if kind == "put" else delete_op(k) for kind, k, v in ops])
        if revision == model.revision and revision in model.revisions and model.revisions[revision] is not before:
            after = model.revisions[revision]
            for kind, key, _ in ops:
                if kind == "put" or key in before:
                    expected.append((revision, key, after.get(key), before.get(key)))
    with machine._env.begin() as txn:
        got = changes_between(txn, machine._mvcc, 2, machine.revision, b"w/", b"w0", with_prev=True)
    as_model = [(c.kv.mod_revision, c.kv.key,
                 None if c.kv.tombstone else Version(c.kv.value, c.kv.create_revision, c.kv.mod_revision, c.kv.version),
                 None if c.prev is None else Version(c.prev.value, c.prev.create_revision, c.prev.mod_revision,
                                                     c.prev.version))
                for c in got]
    assert as_model == [e for e in expected if e[1].startswith(b"w/")]
    assert len(as_model) > 100


def test_a_revoked_lease_takes_its_keys_in_one_revision(machine: KVStateMachine, tmp_path) -> None:
    from statemachine.commands import encode_lease_grant, encode_lease_revoke
    apply = Applier(machine)
    assert apply.payload(encode_lease_grant(7, 30)).lease_id == 7
    assert apply.payload(encode_lease_grant(7, 30)).refusal == "etcdserver: lease already exists"
    assert machine.leases.ttls == {7: 30}
    apply.txn(pb.TxnRequest(success=[_put(b"a", b"1", lease=7), _put(b"b", b"2", lease=7), _put(b"c", b"3")]))
    apply.txn(pb.TxnRequest(success=[_put(b"b", b"again")]))  # a put without the lease detaches b
    result, _ = apply.txn(pb.TxnRequest(success=[_put(b"d", b"4", lease=99)]))
    assert (result.refusal_kind, result.refusal) == ("NOT_FOUND", "etcdserver: requested lease not found")
    assert machine.lease_keys(7) == [b"a"] and version_of(machine, b"a").lease == 7
    before = machine.revision
    revoked = apply.payload(encode_lease_revoke(7))
    assert revoked.revision == before + 1 and machine.revision == before + 1
    assert machine.get(b"a") is None and machine.get(b"b") == b"again" and machine.get(b"c") == b"3"
    assert machine.leases.ttls == {} and machine.lease_keys(7) == []
    assert apply.payload(encode_lease_revoke(7)).refusal == "etcdserver: requested lease not found"
    # Leases travel in copies (snapshots) like every table.
    apply.payload(encode_lease_grant(8, 60))
    apply.txn(pb.TxnRequest(success=[_put(b"e", b"5", lease=8)]))
    machine.copy_to(tmp_path / "copy")
    with KVStateMachine(tmp_path / "copy", map_size=64 << 20) as copy:
        assert copy.leases.ttls == {8: 60} and copy.lease_keys(8) == [b"e"]


def test_an_empty_transaction_succeeds_and_changes_nothing(machine: KVStateMachine) -> None:
    result, response = Applier(machine).txn(pb.TxnRequest())
    assert not result.refusal and response.succeeded and result.revision == 1  # etcd answers it too


def test_a_compaction_at_or_below_the_compacted_revision_is_refused_as_etcd_does(machine: KVStateMachine) -> None:
    """etcd's mvcc refuses a compaction at a revision <= the compacted one (ErrCompacted), a second
    one at the same revision included; python-etcd3 and etcdctl show "required revision has been
    compacted". Before, a second compaction at the same revision was taken."""
    apply = Applier(machine)
    for i in range(5):
        apply.ops([put_op(b"k", b"%d" % i)])
    assert not apply.payload(encode_compaction(4)).refusal
    for again in (4, 3, 1):
        result = apply.payload(encode_compaction(again))
        assert (result.refusal_kind, result.refusal) == ("OUT_OF_RANGE", COMPACTED), again
    assert machine.compacted_revision == 4
    assert apply.payload(encode_compaction(machine.revision + 1)).refusal == FUTURE_REVISION
    assert not apply.payload(encode_compaction(5)).refusal and machine.compacted_revision == 5


def test_a_read_only_txn_read_outside_the_log_answers_as_applied_through_it(machine: KVStateMachine) -> None:
    """etcd serves a transaction without puts or deletes as a read (isTxnReadonly):
    KVStateMachine.etcd_read_txn must answer exactly as the same transaction applied through the
    log, compares, branches, nested transactions, sorts and limits included, and change nothing."""
    apply = Applier(machine)
    for i in range(6):
        apply.ops([put_op(b"k%d" % i, b"v%d" % i)])
    apply.ops([put_op(b"k2", b"again")])

    def rng(key: bytes, end: bytes = b"", **fields: object) -> pb.RequestOp:
        return pb.RequestOp(request_range=pb.RangeRequest(key=key, range_end=end, **fields))  # type: ignore[arg-type]
    cases = [
        pb.TxnRequest(compare=[pb.Compare(key=b"k2", target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=2)],
                      success=[rng(b"k", b"l", limit=3, sort_order=pb.RangeRequest.DESCEND), rng(b"k2")],
                      failure=[rng(b"nothing")]),
        pb.TxnRequest(compare=[pb.Compare(key=b"k9", target=pb.Compare.CREATE, result=pb.Compare.GREATER)],
                      success=[rng(b"k1")],
                      failure=[pb.RequestOp(request_txn=pb.TxnRequest(success=[rng(b"k0", b"k3", keys_only=True),
                                                                               rng(b"k4", revision=3)]))]),
        pb.TxnRequest(success=[rng(b"\0", b"\0", count_only=True)]),
    ]
    revision = machine.revision
    for request in cases:
        assert read_only(request)
        read = machine.etcd_read_txn(request)
        assert machine.revision == revision
        result, applied = apply.txn(request)
        assert read == applied, request
    assert not read_only(pb.TxnRequest(failure=[pb.RequestOp(request_txn=pb.TxnRequest(success=[
        pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"k1"))]))]))
    assert not apply.payload(encode_compaction(4)).refusal
    with pytest.raises(EtcdRefusal, match="compacted"):
        machine.etcd_read_txn(pb.TxnRequest(success=[rng(b"k1", revision=2)]))


def test_lease_checkpoints_are_kept_cleared_and_go_with_their_lease(tmp_path: Path) -> None:
    machine = KVStateMachine(tmp_path / "state", map_size=64 << 20)
    apply = Applier(machine)
    apply.payload(encode_lease_grant(7, 600))
    apply.payload(encode_lease_grant(8, 600))
    revision = machine.revision
    assert not apply.payload(encode_lease_checkpoints({7: 420, 8: 300, 99: 10})).refusal  # 99: no such lease
    assert machine.leases.remaining == {7: 420, 8: 300} and machine.revision == revision  # no key changed
    apply.payload(encode_lease_checkpoints({8: 0}))  # a keep-alive's clearing
    apply.payload(encode_lease_revoke(7))
    assert machine.leases.remaining == {} and machine.leases.ttls == {8: 600}
    apply.payload(encode_lease_checkpoints({8: 120}))
    machine.close()
    with KVStateMachine(tmp_path / "state", map_size=64 << 20) as reopened:
        assert reopened.leases.remaining == {8: 120} and reopened.leases.ttls == {8: 600}
