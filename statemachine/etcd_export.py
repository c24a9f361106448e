"""A raftkv state as etcd 3.4's buckets (statemachine/etcd_records.py): what etcd's
Maintenance.Snapshot on raftkv writes into a bbolt file (kv/server/etcd_backup.py), so that
`etcdctl snapshot restore` makes an etcd member holding the same keys, values, revisions and
history back to the compacted revision, the same leases, users and roles.

The key bucket is every version and tombstone the store keeps, in revision order. From the
compacted revision C on, the change log (``changes``) names them in that order; below C the store
keeps, per key, at most the version a read at C sees (in ``history``, or still live), which the
change log no longer names: those are gathered from ``history_index`` and ``data`` and sorted -
at most one per key, their (revision, key) alone held in memory.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import lmdb

from statemachine import etcd_records as etcd
from statemachine.apply_batch import StateTables
from statemachine.auth_state import load_view
from statemachine.key_record import change_of, decode
from statemachine.mvcc import CHANGE as _CHANGE
from statemachine.mvcc import MvccTables, compacted_revision

EtcdBucketItems = dict[bytes, Iterable[tuple[bytes, bytes]]]


def etcd_buckets(txn: lmdb.Transaction, tables: StateTables, applied_index: int) -> EtcdBucketItems:
    """The state `txn` sees as etcd's buckets, each (key, value) pairs in key order; the key bucket
    is read as it is iterated (inside `txn`)."""
    compacted = compacted_revision(txn, tables.mvcc)
    meta = [(etcd.CONSISTENT_INDEX, etcd.U64.pack(applied_index))]
    if compacted:
        done = etcd.revision_key(compacted, 0)
        meta += [(etcd.FINISHED_COMPACT, done), (etcd.SCHEDULED_COMPACT, done)]
    ttls, remaining = tables.leases.load(txn)
    leases = sorted((etcd.lease_key(lease), etcd.LeaseRecord(ID=lease, TTL=ttl, RemainingTTL=remaining.get(lease, 0))
                     .SerializeToString()) for lease, ttl in ttls.items())
    view = load_view(txn, tables.auth)
    return {
        etcd.KEY: _key_bucket(txn, tables.mvcc, compacted),
        etcd.META: sorted(meta),
        etcd.LEASE: leases,
        etcd.AUTH: [(etcd.AUTH_ENABLED, b"\x01" if view.enabled else b"\x00"), (etcd.AUTH_REVISION, etcd.U64.pack(1))],
        etcd.USERS: sorted((name.encode(), etcd.etcd_user(user)) for name, user in view.users.items()),
        etcd.ROLES: sorted((name.encode(), etcd.etcd_role(role)) for name, role in view.roles.items()),
        etcd.MEMBERS: [], etcd.MEMBERS_REMOVED: [], etcd.ALARM: [],
        etcd.CLUSTER: [(etcd.CLUSTER_VERSION_KEY, etcd.CLUSTER_VERSION)],
    }


def _key_bucket(txn: lmdb.Transaction, tables: MvccTables, compacted: int) -> Iterator[tuple[bytes, bytes]]:
    for change, key in _changes(txn, tables, compacted):
        record = txn.get(change, db=tables.history)
        if record is None:  # not replaced: the live version, if it is this change's
            record = tables.data.get(txn, key)
            if record is None or _CHANGE.pack(*change_of(record)) != change:
                continue  # a version a compaction took (a store compacted before it kept them)
        kv = decode(key, record)  # checked against its checksum
        if kv.tombstone and kv.mod_revision == compacted:
            continue  # kept for a watch from C; etcd's compaction at C drops it
        if kv.tombstone:
            yield etcd.revision_key(kv.mod_revision, kv.mod_sub, True), etcd.KeyValue(key=key).SerializeToString()
        else:
            yield etcd.revision_key(kv.mod_revision, kv.mod_sub), etcd.KeyValue(
                key=key, create_revision=kv.create_revision, mod_revision=kv.mod_revision, version=kv.version,
                value=kv.value, lease=kv.lease).SerializeToString()


def _changes(txn: lmdb.Transaction, tables: MvccTables, compacted: int) -> Iterator[tuple[bytes, bytes]]:
    """(change, key) of every version kept, in revision order (module docstring)."""
    if compacted:
        below: list[bytes] = []
        for key, change in tables.history_index.ordered(txn, each_dup=True):
            if _CHANGE.unpack(change)[0] < compacted:
                below.append(change + key)
        for key, record in tables.data.ordered(txn):
            revision, sub = change_of(record)
            if revision < compacted:
                below.append(_CHANGE.pack(revision, sub) + key)
        below.sort()
        yield from ((item[:_CHANGE.size], item[_CHANGE.size:]) for item in below)
        del below
    yield from txn.cursor(db=tables.changes).iternext(keys=True, values=True)
