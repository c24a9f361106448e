"""etcd 3.4's backend layout: the buckets of its bbolt database and how their keys and values are
encoded (mvcc/kvstore.go, mvcc/revision.go, lease/lessor.go, auth/store.go, etcdserver/membership).
What raftkv reads from an etcd snapshot and writes into one it serves; the bbolt file itself is
the snapshot package's (snapshot/bbolt_reader.py, bbolt_writer.py).

- ``key``      revision -> mvccpb.KeyValue. A revision is main (8 bytes, big-endian), b"_", sub
               (8 bytes); a tombstone's key ends in b"t" and its value holds only the key.
- ``meta``     consistent_index (8 bytes), scheduledCompactRev and finishedCompactRev (revisions)
- ``lease``    lease id (8 bytes, big-endian) -> leasepb.Lease {ID, TTL, RemainingTTL}
- ``auth``     authEnabled (1 byte), authRevision (8 bytes)
- ``authUsers``, ``authRoles``: name -> authpb.User / authpb.Role
- ``members``, ``members_removed``, ``cluster``, ``alarm``: etcd's membership and alarms
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from raftkv_proto import etcd_auth_pb2, etcd_mvcc_pb2, kv_pb2

KEY, META, LEASE, AUTH, USERS, ROLES = b"key", b"meta", b"lease", b"auth", b"authUsers", b"authRoles"
MEMBERS, MEMBERS_REMOVED, CLUSTER, ALARM = b"members", b"members_removed", b"cluster", b"alarm"
CONSISTENT_INDEX, SCHEDULED_COMPACT, FINISHED_COMPACT = b"consistent_index", b"scheduledCompactRev", b"finishedCompactRev"
AUTH_ENABLED, AUTH_REVISION = b"authEnabled", b"authRevision"
CLUSTER_VERSION_KEY, CLUSTER_VERSION = b"clusterVersion", b"3.4.0"

_REVISION = struct.Struct(">Q")
REVISION_BYTES = 17  # main, "_", sub
_TOMBSTONE = b"t"
U64 = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Revision:
    main: int
    sub: int
    tombstone: bool = False


def revision_key(main: int, sub: int, tombstone: bool = False) -> bytes:
    return _REVISION.pack(main) + b"_" + _REVISION.pack(sub) + (_TOMBSTONE if tombstone else b"")


def parse_revision(raw: bytes) -> Revision:
    """A ``key`` bucket's key (or a compact revision in ``meta``); ValueError when malformed."""
    if len(raw) not in (REVISION_BYTES, REVISION_BYTES + 1) or raw[8:9] != b"_" or \
            (len(raw) > REVISION_BYTES and raw[REVISION_BYTES:] != _TOMBSTONE):
        raise ValueError(f"{bytes(raw[:24])!r} is not an etcd revision")
    return Revision(_REVISION.unpack_from(raw)[0], _REVISION.unpack_from(raw, 9)[0], len(raw) > REVISION_BYTES)


def _lease_message() -> type:
    """leasepb.Lease (etcd's lease/leasepb/lease.proto), built here: raftkv speaks no lease message
    on any wire, only in etcd's backend."""
    proto = descriptor_pb2.FileDescriptorProto(name="raftkv_etcd_backend_lease.proto", package="leasepb",
                                               syntax="proto3")
    message = proto.message_type.add(name="Lease")
    for number, name in enumerate(("ID", "TTL", "RemainingTTL"), start=1):
        message.field.add(name=name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("leasepb.Lease"))


LeaseRecord = _lease_message()
KeyValue = etcd_mvcc_pb2.KeyValue
User = etcd_auth_pb2.User
Role = etcd_auth_pb2.Role


def lease_key(lease: int) -> bytes:
    return struct.pack(">q", lease)


def etcd_user(user: kv_pb2.StoredUser) -> bytes:
    """raftkv's user as etcd's authUsers keeps it (the password hash as it is: see
    docs/etcd-snapshot-format.md, passwords)."""
    return User(name=user.name.encode(), password=user.password_hash, roles=sorted(user.roles)).SerializeToString()


def etcd_role(role: kv_pb2.StoredRole) -> bytes:
    return Role(name=role.name.encode(), keyPermission=[
        etcd_auth_pb2.Permission(permType=p.perm_type, key=p.key, range_end=p.range_end)
        for p in role.permissions]).SerializeToString()
