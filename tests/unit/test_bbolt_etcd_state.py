"""A raftkv state written as an etcd snapshot and read back (statemachine/etcd_export.py,
etcd_import.py, kv/server/etcd_backup.py): a random history of puts, overwrites, deletes, txns,
leases and compactions - one of them at the revision of a delete - reads the same at every kept
revision after the round trip, and the restored state exports to the very same buckets. Real
etcd's files: tests/integration/test_etcd_snapshot.py."""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from raft.core import Entry, EntryType
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import kv_pb2
from kv.server.etcd_backup import restore_etcd_state, write_etcd_database
from snapshot.bbolt_reader import BoltFile
from snapshot.bbolt_writer import write_bolt
from snapshot.errors import SnapshotCorruptError
from statemachine import KVStateMachine
from statemachine import etcd_records as etcd
from statemachine.commands import encode_auth, encode_compaction, encode_etcd_txn, encode_lease_grant

KEYS = [f"k{i:02d}".encode() for i in range(30)]


class Applier:
    def __init__(self, sm: KVStateMachine) -> None:
        self.sm, self.index = sm, 0

    def __call__(self, payload: bytes) -> kv_pb2.CommandResult:
        self.index += 1
        (outcome,) = self.sm.apply([Entry(self.index, 1, EntryType.NORMAL, payload)])
        assert outcome is not None and not outcome.result.refusal, outcome
        return outcome.result

    def txn(self, *ops: pb.RequestOp) -> None:
        self(encode_etcd_txn(pb.TxnRequest(success=list(ops)).SerializeToString()))


def put(key: bytes, value: bytes, lease: int = 0) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> pb.RequestOp:
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key))


def history(sm: KVStateMachine, seed: int) -> None:
    rng = random.Random(seed)
    apply = Applier(sm)
    apply(encode_lease_grant(7, 600))
    apply(encode_auth(kv_pb2.AuthCommand(action=kv_pb2.ROLE_ADD, role="reader")))
    apply(encode_auth(kv_pb2.AuthCommand(action=kv_pb2.ROLE_GRANT_PERMISSION, role="reader",
                                         permission=kv_pb2.Permission(key=b"/a", range_end=b"/b"))))
    apply(encode_auth(kv_pb2.AuthCommand(action=kv_pb2.USER_ADD, user="alice", salt=b"s" * 16,
                                         password_hash=b"h" * 32)))
    apply(encode_auth(kv_pb2.AuthCommand(action=kv_pb2.USER_GRANT_ROLE, user="alice", role="reader")))
    for step in range(300):
        key = rng.choice(KEYS)
        roll = rng.random()
        if roll < 0.55:
            apply.txn(put(key, rng.randbytes(rng.choice((3, 40, 5000))), lease=7 if rng.random() < 0.1 else 0))
        elif roll < 0.75 and sm.etcd_range(pb.RangeRequest(key=key)).kvs:
            apply.txn(delete(key))
        elif roll < 0.9:
            apply.txn(put(key, b"a"), put(rng.choice(KEYS) + b"/2", b"b"))
        elif sm.revision > sm.compacted_revision + 5:
            apply(encode_compaction(rng.randrange(sm.compacted_revision + 1, sm.revision)))
    # a key deleted at exactly the compacted revision, then put again: the tombstone is compacted
    # away (as etcd's), the change log still names its revision
    apply.txn(put(b"again", b"1"))
    apply.txn(delete(b"again"))
    apply(encode_compaction(sm.revision))
    apply.txn(put(b"again", b"2"))


def through_an_etcd_file(tmp_path: Path) -> Path:
    """The state in tmp_path/state written as an etcd snapshot file and restored into
    tmp_path/restored; the etcd database written."""
    exported = tmp_path / "etcd.db"
    write_etcd_database(tmp_path / "state", exported)
    snap = tmp_path / "etcd.snap"
    snap.write_bytes(exported.read_bytes() + hashlib.sha256(exported.read_bytes()).digest())
    restore_etcd_state(snap, tmp_path / "restored", "c-test")
    return exported


def every_read(sm: KVStateMachine) -> dict[int, list[tuple]]:
    reads = {}
    for revision in range(max(sm.compacted_revision, 1), sm.revision + 1):
        kvs = sm.etcd_range(pb.RangeRequest(key=b"\0", range_end=b"\0", revision=revision)).kvs
        reads[revision] = [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in kvs]
    return reads


def buckets(path: Path) -> dict[bytes, list[tuple[bytes, bytes | None]]]:
    with BoltFile(path) as db:
        return {name: list(bucket.items()) for name, bucket in db.root.buckets()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_state_round_trips_through_an_etcd_snapshot(tmp_path: Path, seed: int) -> None:
    with KVStateMachine(tmp_path / "state", map_size=256 << 20) as sm:
        history(sm, seed)
        expected = (every_read(sm), sm.revision, sm.compacted_revision, dict(sm.leases.ttls))
        # what a watch replays (from past the compacted revision: a delete at exactly it is gone)
        watched = sm.changes(sm.compacted_revision + 1, sm.revision, with_prev=True)
    assert expected[2] > 0
    exported = through_an_etcd_file(tmp_path)
    with KVStateMachine(tmp_path / "restored", map_size=256 << 20) as restored:
        assert (every_read(restored), restored.revision, restored.compacted_revision,
                dict(restored.leases.ttls)) == expected
        assert restored.changes(expected[2] + 1, expected[1], with_prev=True) == watched
        assert restored.auth.view.users["alice"].roles == ["reader"]
        assert [p.key for p in restored.auth.view.roles["reader"].permissions] == [b"/a"]
        assert restored.lease_keys(7) == sorted(kv[0] for kv in expected[0][expected[1]] if kv[5] == 7)
    again = tmp_path / "again.db"
    write_etcd_database(tmp_path / "restored", again)
    first, second = buckets(exported), buckets(again)
    for name in first:
        if name != b"meta":
            assert second[name] == first[name], name
    assert dict(second[b"meta"])[etcd.FINISHED_COMPACT] == dict(first[b"meta"])[etcd.FINISHED_COMPACT]


def test_a_record_etcd_could_not_have_written_is_refused(tmp_path: Path) -> None:
    kv = etcd.KeyValue(key=b"a", create_revision=2, mod_revision=3, version=1, value=b"v").SerializeToString()
    cases = {
        "do not fit its place": [(etcd.revision_key(2, 0), kv)],  # mod_revision 3 filed under 2
        "is not an etcd revision": [(b"\x00" * 5, kv)],
        "a record without a key": [(etcd.revision_key(3, 0), etcd.KeyValue().SerializeToString())],
    }
    for i, (message, items) in enumerate(cases.items()):
        snap = tmp_path / f"bad{i}.db"
        with open(snap, "wb") as f:
            write_bolt(f, {b"key": items, b"meta": []})
        with pytest.raises(SnapshotCorruptError, match=message):
            restore_etcd_state(snap, tmp_path / f"state{i}", "c-test")


def test_members_restored_from_one_file_with_one_cluster_id_hold_the_same_state(tmp_path: Path) -> None:
    """Each member of a multi-member cluster is restored on its own; with auth on, the token
    signing key is part of the state, so it must not be drawn at random."""
    with KVStateMachine(tmp_path / "state", map_size=256 << 20) as sm:
        history(sm, 4)
        apply = Applier(sm)
        apply.index = sm.applied_index
        for command in (kv_pb2.AuthCommand(action=kv_pb2.USER_ADD, user="root", password_hash=b"$2a$10$x"),
                        kv_pb2.AuthCommand(action=kv_pb2.USER_GRANT_ROLE, user="root", role="root"),
                        kv_pb2.AuthCommand(action=kv_pb2.AUTH_ENABLE, signing_key=b"k" * 32)):
            apply(encode_auth(command))
    write_etcd_database(tmp_path / "state", tmp_path / "etcd.db")
    hashes = set()
    for member in ("n1", "n2", "n3"):
        restore_etcd_state(tmp_path / "etcd.db", tmp_path / member, "c-shared")
        with KVStateMachine(tmp_path / member, map_size=256 << 20) as restored:
            assert restored.auth.enabled and restored.auth.view.signing_key != b"k" * 32
            hashes.add(restored.state_hash())
    assert len(hashes) == 1
    restore_etcd_state(tmp_path / "etcd.db", tmp_path / "other", "c-other")
    with KVStateMachine(tmp_path / "other", map_size=256 << 20) as other:
        assert other.state_hash() not in hashes  # another cluster id: another signing key

