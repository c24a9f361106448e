"""etcd's leases in the replicated state: which leases exist, their granted TTLs, and which keys
each holds. A lease is granted and revoked through the log (Command.lease); revoking one deletes
its keys in one revision. When a lease expires is not state: only the leader counts it
(kv/server/lessor.py) and revokes an expired lease through the log, as etcd's lessor does.

Two tables beside the user's keys:
- ``leases``      lease id (8 bytes, big-endian) -> its granted TTL in seconds (8 bytes), then the
                  remaining TTL the leader last checkpointed for it (8 bytes; absent: none), which
                  a new leader counts the lease from instead of its whole TTL (etcd's checkpoints)
- ``lease_keys``  lease id -> each key attached to it (an LMDB dupsort table, whose values are at
                  most 511 bytes: a longer key is in ``lease_keys_long`` by its stored key,
                  statemachine/long_keys.py). A key's lease is also in its version's header
                  (statemachine/key_record.py), so a put or delete detaches it here."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import lmdb

from statemachine.long_keys import LongKeyNames, is_long, stored_key

LEASES_DB_NAME = b"leases"
LEASE_KEYS_DB_NAME = b"lease_keys"
LEASE_LONG_KEYS_DB_NAME = b"lease_keys_long"
_ID = struct.Struct(">q")
_TTL = struct.Struct(">q")

# etcd's messages (api/v3rpc/rpctypes/error.go).
LEASE_NOT_FOUND = "etcdserver: requested lease not found"
LEASE_EXISTS = "etcdserver: lease already exists"
# etcd's MaxLeaseTTL: 9,000,000,000 seconds.
MAX_LEASE_TTL = 9_000_000_000


class LeaseHolder:
    """The leases as of the last apply (id -> granted TTL, and id -> checkpointed remaining TTL),
    published for the lessor and the services; the same object across snapshot installs, as
    AuthHolder."""

    __slots__ = ("ttls", "remaining")

    def __init__(self) -> None:
        self.ttls: dict[int, int] = {}
        self.remaining: dict[int, int] = {}

    def publish(self, ttls: dict[int, int], remaining: dict[int, int]) -> None:
        self.ttls, self.remaining = ttls, remaining


@dataclass(frozen=True, slots=True)
class LeaseTables:
    leases: lmdb._Database
    keys: lmdb._Database
    long_keys: lmdb._Database  # lease id -> stored key of each long key attached
    names: LongKeyNames

    def exists(self, txn: lmdb.Transaction, lease: int) -> bool:
        return txn.get(_ID.pack(lease), db=self.leases) is not None

    def grant(self, txn: lmdb.Transaction, lease: int, ttl: int) -> None:
        txn.put(_ID.pack(lease), _TTL.pack(ttl), db=self.leases)

    def checkpoint(self, txn: lmdb.Transaction, lease: int, remaining: int) -> bool:
        """Record `lease`'s remaining TTL (0: none); False when the lease does not exist."""
        raw = txn.get(_ID.pack(lease), db=self.leases)
        if raw is None:
            return False
        ttl = bytes(raw[:_TTL.size])
        txn.put(_ID.pack(lease), ttl + _TTL.pack(remaining) if remaining > 0 else ttl, db=self.leases)
        return True

    def revoke(self, txn: lmdb.Transaction, lease: int) -> list[bytes]:
        """Forget `lease`; the keys it held (the caller deletes them)."""
        raw = _ID.pack(lease)
        keys = self.attached(txn, lease)
        txn.delete(raw, db=self.keys)  # every attachment (all duplicates of the id)
        txn.delete(raw, db=self.long_keys)
        txn.delete(raw, db=self.leases)
        return keys

    def attach(self, txn: lmdb.Transaction, lease: int, key: bytes) -> None:
        if is_long(key):
            txn.put(_ID.pack(lease), stored_key(key), db=self.long_keys, dupdata=True)
        else:
            txn.put(_ID.pack(lease), key, db=self.keys, dupdata=True)

    def detach(self, txn: lmdb.Transaction, lease: int, key: bytes) -> None:
        if is_long(key):
            txn.delete(_ID.pack(lease), stored_key(key), db=self.long_keys)
        else:
            txn.delete(_ID.pack(lease), key, db=self.keys)

    def attached(self, txn: lmdb.Transaction, lease: int) -> list[bytes]:
        """The keys attached to `lease`, in key order."""
        keys = _values(txn.cursor(db=self.keys), _ID.pack(lease))
        long = _values(txn.cursor(db=self.long_keys), _ID.pack(lease))
        if not long:
            return keys
        return sorted(keys + [self.names.full(txn, stored) for stored in long])

    def load(self, txn: lmdb.Transaction) -> tuple[dict[int, int], dict[int, int]]:
        """(lease -> granted TTL, lease -> checkpointed remaining TTL)."""
        ttls: dict[int, int] = {}
        remaining: dict[int, int] = {}
        for raw, value in txn.cursor(db=self.leases).iternext():
            lease = _ID.unpack(raw)[0]
            ttls[lease] = _TTL.unpack_from(value)[0]
            if len(value) > _TTL.size:
                remaining[lease] = _TTL.unpack_from(value, _TTL.size)[0]
        return ttls, remaining


def _values(cursor: lmdb.Cursor, key: bytes) -> list[bytes]:
    """Every value of `key` in a dupsort table."""
    return list(cursor.iternext_dup()) if cursor.set_key(key) else []
