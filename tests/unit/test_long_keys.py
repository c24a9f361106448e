"""Keys over LMDB's 511-byte key limit (statemachine/long_keys.py) through the state machine: a
model dict against the store, with short keys, keys of 511 and 512 bytes and keys of several KiB
that share long prefixes, for every read at every kept revision (order included), ranges and
prefixes, watch replay, leases, compaction, copies and etcd snapshots; and the hashes of a store
of short keys alone, as they were before long keys existed."""
from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.key_ranges import prefix_end
from statemachine import KVStateMachine
from statemachine.commands import (
    encode_compaction,
    encode_lease_grant,
    encode_lease_revoke,
)
from kv.tools.spark.snapshot_source import SnapshotSource
from snapshot.store import SnapshotStore
from statemachine.long_keys import PREFIX_BYTES, stored_key
from tests.unit.test_bbolt_etcd_state import Applier, through_an_etcd_file

# Heads that make keys short, exactly at the limit, just over it, and long with a shared prefix
# longer than the stored prefix (so their order rests on the bytes the digest replaced).
HEADS = [b"", b"a", b"p" * 100, b"p" * (PREFIX_BYTES - 1), b"p" * PREFIX_BYTES, b"p" * 510, b"p" * 511,
         b"p" * 512, b"p" * 3000, b"q" * 600]
TAILS = st.binary(min_size=0, max_size=3).map(lambda raw: bytes(b"\x00ap\xff"[c % 4] for c in raw))
KEYS = st.builds(lambda head, tail: head + tail or b"a", st.sampled_from(HEADS), TAILS)


@dataclass
class Model:
    """The store at every revision as a dict, and every change a watch replays."""

    revisions: dict[int, dict[bytes, tuple]] = field(default_factory=lambda: {1: {}})
    revision: int = 1
    compacted: int = 0
    events: list[tuple] = field(default_factory=list)  # (revision, key, value or None, lease)

    def apply(self, ops: list[tuple[str, bytes, bytes, int]]) -> None:
        """Ops of one etcd transaction: ("put", key, value, lease) or ("delete", start, end, 0)."""
        store = dict(self.revisions[self.revision])
        pending, changed = self.revision + 1, False
        for kind, key, arg, lease in ops:
            if kind == "put":
                old = store.get(key)
                store[key] = (arg, old[1] if old else pending, pending, old[3] + 1 if old else 1, lease)
                self.events.append((pending, key, arg, lease))
                changed = True
            else:
                for gone in sorted(k for k in store if key <= k < arg):
                    del store[gone]
                    self.events.append((pending, gone, None, 0))
                    changed = True
        if changed:
            self.revision = pending
            self.revisions[pending] = store

    def at(self, revision: int) -> dict[bytes, tuple]:
        return self.revisions[max(r for r in self.revisions if r <= revision)]


def txn(apply: Applier, ops: list[tuple[str, bytes, bytes, int]]) -> None:
    """One etcd transaction of ("put", key, value, lease) and ("delete", start, end, 0) ops."""
    apply.txn(*(pb.RequestOp(request_put=pb.PutRequest(key=key, value=arg, lease=lease)) if kind == "put" else
                pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key, range_end=arg))
                for kind, key, arg, lease in ops))


def read(sm: KVStateMachine, start: bytes, end: bytes, revision: int = 0) -> list[tuple]:
    kvs = sm.etcd_range(pb.RangeRequest(key=start, range_end=end, revision=revision)).kvs
    return [(kv.key, (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)) for kv in kvs]


def expected(model: Model, start: bytes, end: bytes, revision: int) -> list[tuple]:
    store = model.at(revision)
    return sorted((k, v) for k, v in store.items() if start <= k and (end == b"\0" or k < end))


OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "delete", "range"]), KEYS, KEYS, st.booleans()),
               min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.integers(0, 2**32))
def test_the_store_with_long_keys_answers_as_a_model_dict(ops: list[tuple], seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as directory, KVStateMachine(Path(directory) / "s", map_size=64 << 20) as sm:
        apply, model = Applier(sm), Model()
        apply(encode_lease_grant(7, 600))
        for step, (kind, key, other, flag) in enumerate(ops):
            if kind == "put":
                batch = [("put", key, b"v%d" % step, 7 if flag else 0)]
            elif kind == "delete":
                batch = [("delete", key, key + b"\0" if flag else prefix_end(key), 0)]
            else:  # one transaction, two puts and a range delete: one revision, subs in order
                low, high = sorted((key, other))
                batch = [("put", other, b"w%d" % step, 0), ("delete", low, high, 0), ("put", key, b"x", 0)]
            txn(apply, batch)
            model.apply(batch)
            if rng.random() < 0.15 and model.revision > model.compacted + 1:
                model.compacted = rng.randint(model.compacted + 1, model.revision)
                apply(encode_compaction(model.compacted))
        assert sm.revision == model.revision
        bounds = [(b"\0", b"\0")] + [(key, prefix_end(key) or b"\0") for _, key, _, _ in ops[:5]] + \
            [tuple(sorted((key, other))) for _, key, other, _ in ops[:5] if key != other]
        for revision in range(max(model.compacted, 1), model.revision + 1):
            for start, end in bounds:
                assert read(sm, start, end, revision) == expected(model, start, end, revision), (revision, start, end)
        first = max(model.compacted, 1) + 1  # a watch from past the compacted revision replays
        replay = [(c.kv.mod_revision, c.kv.key, None if c.kv.tombstone else c.kv.value, c.kv.lease)
                  for c in sm.changes(first, sm.revision)]
        assert replay == [e for e in model.events if e[0] >= first]
        leased = sorted(k for k, v in model.at(model.revision).items() if v[4] == 7)
        assert sm.lease_keys(7) == leased
        # A copy (a snapshot) holds the same; the lease takes its long keys with it when revoked.
        sm.copy_to(Path(directory) / "copy")
        with KVStateMachine(Path(directory) / "copy", map_size=64 << 20) as copy:
            assert read(copy, b"\0", b"\0") == read(sm, b"\0", b"\0")
            assert copy.hash_kv() == sm.hash_kv() and copy.state_hash() == sm.state_hash()
        apply(encode_lease_revoke(7))
        assert sm.lease_keys(7) == [] and not [k for k, v in read(sm, b"\0", b"\0") if v[4] == 7]
        assert sm.count() == len(model.at(model.revision)) - len(leased)


def test_keys_past_the_stored_prefix_keep_their_order_among_short_keys(tmp_path: Path) -> None:
    shared = b"p" * PREFIX_BYTES
    keys = [shared, shared + b"\x00", shared + b"a" * 16, shared + b"a" * 17, shared + b"a" * 17 + b"\x00",
            shared + b"b", shared + b"a" * 4000, shared + b"\xff" * 16, shared + b"\xff" * 17, b"q"]
    with KVStateMachine(tmp_path / "s", map_size=64 << 20) as sm:
        apply = Applier(sm)
        for key in reversed(keys):
            txn(apply, [("put", key, b"v", 0)])
        assert [k for k, _ in read(sm, b"\0", b"\0")] == sorted(keys)
        assert [k for k, _ in read(sm, shared + b"a", shared + b"b")] == sorted(k for k in keys
                                                                             if shared + b"a" <= k < shared + b"b")
        assert sm.scan(shared + b"a" * 17, None, limit=3)[0] == [(k, b"v") for k in sorted(keys)[3:6]]
        # Keys of 511 bytes or fewer are stored as themselves: a state written before long keys reads as before.
        assert stored_key(b"p" * 511) == b"p" * 511 and len(stored_key(keys[3])) == 511


# What _short_history's store hashed to before the long-key tables existed (computed then).
GOLDEN_HASH_KV = (1287070502, 180, 115)
GOLDEN_STATE_HASH = "c047cebe3a7529229d3dae99c5888dffd2b6ade9fdfc10b1cfdc4d16139e8fb7"


def test_a_snapshot_file_counts_and_exports_long_keys_in_order(tmp_path: Path) -> None:
    keys = [b"a", b"p" * 511, b"p" * 2000 + b"b", b"p" * 2000 + b"a", b"p" * 512, b"z"]
    with KVStateMachine(tmp_path / "s", map_size=64 << 20) as sm:
        apply = Applier(sm)
        txn(apply, [("put", key, key[-1:], 0) for key in keys])
        store = SnapshotStore(tmp_path / "snaps")
        manifest = store.create(sm, ["n1"], "c-test")
    assert manifest.key_count == len(keys)
    with SnapshotSource(store.path_for(manifest), workdir=tmp_path) as snap:
        exported = [item for start, end in snap.ranges(3) for batch in snap.read(start, end) for item in batch]
    assert exported == sorted((key, key[-1:]) for key in keys)


def _short_history(sm: KVStateMachine) -> None:
    """A fixed history of short keys only: puts, deletes, leases, a compaction."""
    rng = random.Random(5)
    apply = Applier(sm)
    apply(encode_lease_grant(9, 600))
    for step in range(200):
        key = b"k%02d" % rng.randrange(20)
        if rng.random() < 0.7:
            txn(apply, [("put", key, rng.randbytes(rng.choice((3, 300))), 9 if rng.random() < 0.1 else 0)])
        else:
            txn(apply, [("delete", key, key + b"\0", 0)])
        if step == 150:
            apply(encode_compaction(sm.revision - 20))


def test_a_store_of_short_keys_hashes_as_before_long_keys_existed(tmp_path: Path) -> None:
    """HashKV and the state hash that members compare: the values this history had before the
    long-key tables existed, so members of both versions agree on existing data."""
    with KVStateMachine(tmp_path / "s", map_size=64 << 20) as sm:
        _short_history(sm)
        assert sm.hash_kv() == GOLDEN_HASH_KV
        assert sm.state_hash() == GOLDEN_STATE_HASH


def test_a_state_with_long_keys_round_trips_through_an_etcd_snapshot(tmp_path: Path) -> None:
    rng = random.Random(3)
    keys = [b"s", b"p" * 511, b"p" * 512, b"p" * 2000 + b"a", b"p" * 2000 + b"b", b"p" * 600]
    with KVStateMachine(tmp_path / "state", map_size=64 << 20) as sm:
        apply = Applier(sm)
        apply(encode_lease_grant(7, 600))
        for step in range(80):
            key = rng.choice(keys)
            if rng.random() < 0.7:
                txn(apply, [("put", key, b"%d" % step, 7 if rng.random() < 0.3 else 0)])
            else:
                txn(apply, [("delete", key, key + b"\0", 0)])
            if step == 40:
                apply(encode_compaction(sm.revision - 5))
        txn(apply, [("put", keys[3], b"leased", 7), ("put", keys[1], b"leased", 7)])
        reads = {r: read(sm, b"\0", b"\0", r) for r in range(sm.compacted_revision, sm.revision + 1)}
        watched = sm.changes(sm.compacted_revision + 1, sm.revision, with_prev=True)
        leased = sm.lease_keys(7)
    through_an_etcd_file(tmp_path)
    with KVStateMachine(tmp_path / "restored", map_size=64 << 20) as restored:
        assert {r: read(restored, b"\0", b"\0", r) for r in reads} == reads
        assert restored.changes(min(reads) + 1, max(reads), with_prev=True) == watched
        assert restored.lease_keys(7) == leased and any(len(k) > 511 for k in leased)
