"""An etcd 3.4 snapshot's data written into an empty raftkv state: what `raftkv snapshot restore`
makes of an etcd file (kv/server/restore.py reads the file with snapshot/bbolt_reader.py and hands
its buckets here).

Every version etcd kept goes in with its revisions, in revision order, through the store's own
`RevisionWriter.restore` (statemachine/mvcc.py), so a key's live version, its history back to the
compacted revision and the change log a watch replays are what the same history applied to raftkv
would have left. Then the store's revision (etcd's: the newest main revision, or the compacted one
if that is higher), the compacted revision (a compaction etcd had scheduled but not finished is
finished here, as etcd finishes it when it starts), the leases with their TTLs and checkpointed
remaining TTLs, and users, roles and the auth switch through `apply_auth` - each as the one path
that writes it. etcd's members and alarms are not carried: the restored cluster has its own members.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import lmdb
from google.protobuf.message import DecodeError

from raftkv_proto import kv_pb2
from statemachine import etcd_records as etcd
from statemachine.apply_batch import StateTables
from statemachine.auth_state import ROOT, AuthRefusal, apply_auth, load_view
from statemachine.key_record import KeyVersion
from statemachine.mvcc import RevisionWriter

# Versions per write transaction: bounds the dirty pages an import holds in memory.
_CHUNK = 65_536


class EtcdDataError(ValueError):
    """A record of the etcd snapshot that etcd could not have written (the file is damaged)."""


@dataclass(frozen=True, slots=True)
class EtcdBuckets:
    """The buckets of an etcd snapshot that are imported, each as (key, value) pairs in key order."""

    key: Iterable[tuple[bytes, bytes]]
    meta: Mapping[bytes, bytes]
    lease: Iterable[tuple[bytes, bytes]]
    auth: Mapping[bytes, bytes]
    users: Iterable[tuple[bytes, bytes]]
    roles: Iterable[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Imported:
    """What an import wrote."""

    revision: int
    compacted: int
    versions: int  # every version and tombstone of the key bucket
    leases: int
    consistent_index: int  # etcd's applied index, the restored state's applied index
    auth_enabled: bool


def import_etcd(env: lmdb.Environment, tables: StateTables, buckets: EtcdBuckets, signing_key: bytes) -> Imported:
    """Write `buckets` into the empty state on `env`. `signing_key` signs tokens if etcd's auth was
    on (the same on every member restored from one file). Raises EtcdDataError for a damaged record."""
    finished = _compact_revision(buckets.meta, etcd.FINISHED_COMPACT)
    scheduled = _compact_revision(buckets.meta, etcd.SCHEDULED_COMPACT)
    versions = _versions(buckets.key)
    count = 0
    last_main = 0
    while chunk := list(itertools.islice(versions, _CHUNK)):
        with env.begin(write=True) as txn:
            writer = RevisionWriter(txn, tables.mvcc)
            for kv in chunk:
                writer.restore(kv, logged=kv.mod_revision >= finished)
        count += len(chunk)
        last_main = chunk[-1].mod_revision
    with env.begin(write=True) as txn:
        writer = RevisionWriter(txn, tables.mvcc)
        writer.restore_revisions(max(last_main, finished, 1), finished)
        if scheduled > finished:  # etcd was stopped (or snapshotted) inside a compaction: finish it
            writer.compact(scheduled)
        leases = _import_leases(txn, tables, buckets.lease)
        enabled = _import_auth(txn, tables, buckets, signing_key)
        revision = writer.revision
    index = buckets.meta.get(etcd.CONSISTENT_INDEX)
    return Imported(revision, max(finished, scheduled), count, leases,
                    etcd.U64.unpack(index)[0] if index is not None and len(index) == 8 else 0, enabled)


def _compact_revision(meta: Mapping[bytes, bytes], name: bytes) -> int:
    raw = meta.get(name)
    if raw is None:
        return 0
    try:
        return etcd.parse_revision(raw).main
    except ValueError as exc:
        raise EtcdDataError(f"meta bucket, {name.decode()}: {exc}") from None


def _versions(items: Iterable[tuple[bytes, bytes]]) -> Iterator[KeyVersion]:
    """The key bucket's records as versions and tombstones, checked against their revision keys."""
    for raw, value in items:
        try:
            revision = etcd.parse_revision(raw)
            kv = etcd.KeyValue.FromString(value)
        except (ValueError, DecodeError) as exc:
            raise EtcdDataError(f"key bucket, record {bytes(raw[:24]).hex()}: {exc}") from None
        if not kv.key:
            raise EtcdDataError(f"key bucket, revision {revision.main}_{revision.sub}: a record without a key")
        if revision.tombstone:
            yield KeyVersion(kv.key, b"", 0, revision.main, 0, 0, revision.sub)
            continue
        if kv.mod_revision != revision.main or kv.version < 1 or not 0 < kv.create_revision <= kv.mod_revision:
            raise EtcdDataError(f"key bucket, revision {revision.main}_{revision.sub}: the record's revisions "
                                f"(create {kv.create_revision}, mod {kv.mod_revision}, version {kv.version}) "
                                "do not fit its place")
        yield KeyVersion(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease, revision.sub)


def _import_leases(txn: lmdb.Transaction, tables: StateTables, items: Iterable[tuple[bytes, bytes]]) -> int:
    count = 0
    for raw, value in items:
        try:
            lease = etcd.LeaseRecord.FromString(value)
        except DecodeError as exc:
            raise EtcdDataError(f"lease bucket, lease {bytes(raw).hex()}: {exc}") from None
        if raw != etcd.lease_key(lease.ID) or lease.TTL < 0:
            raise EtcdDataError(f"lease bucket, lease {bytes(raw).hex()}: the record names lease {lease.ID:x}, "
                                f"TTL {lease.TTL}")
        tables.leases.grant(txn, lease.ID, lease.TTL)
        if lease.RemainingTTL > 0:
            tables.leases.checkpoint(txn, lease.ID, lease.RemainingTTL)
        count += 1
    return count


def _import_auth(txn: lmdb.Transaction, tables: StateTables, buckets: EtcdBuckets, signing_key: bytes) -> bool:
    """Roles, users, their grants and the switch, as the auth commands that made them: each
    through `apply_auth`, which checks them as it checks any change."""
    A = kv_pb2
    commands: list[kv_pb2.AuthCommand] = []
    grants: list[kv_pb2.AuthCommand] = []
    try:
        for _, raw in buckets.roles:
            role = etcd.Role.FromString(raw)
            name = role.name.decode()
            commands.append(A.AuthCommand(action=A.ROLE_ADD, role=name))
            commands += [A.AuthCommand(action=A.ROLE_GRANT_PERMISSION, role=name, permission=A.Permission(
                perm_type=p.permType, key=p.key, range_end=p.range_end)) for p in role.keyPermission]
        for _, raw in buckets.users:
            user = etcd.User.FromString(raw)
            name = user.name.decode()
            # etcd's bcrypt hash, kept as it is (docs/etcd-snapshot-format.md, passwords).
            commands.append(A.AuthCommand(action=A.USER_ADD, user=name, password_hash=user.password))
            grants += [A.AuthCommand(action=A.USER_GRANT_ROLE, user=name, role=r) for r in user.roles]
    except (DecodeError, UnicodeDecodeError) as exc:
        raise EtcdDataError(f"authUsers or authRoles bucket: {exc}") from None
    enabled = buckets.auth.get(etcd.AUTH_ENABLED, b"\x00") == b"\x01"
    if enabled:
        grants.append(A.AuthCommand(action=A.AUTH_ENABLE, signing_key=signing_key))
    view = load_view(txn, tables.auth)
    for command in commands + grants:
        try:
            view = apply_auth(txn, tables.auth, view, command)
        except AuthRefusal as exc:
            what = command.user or command.role or ROOT
            raise EtcdDataError(f"auth buckets: {A.AuthAction.Name(command.action)} {what}: {exc}") from None
    return enabled
