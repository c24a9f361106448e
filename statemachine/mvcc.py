"""Revisions, as etcd's MVCC store keeps them, on three LMDB tables.

The store has one revision: 1 when empty, up by exactly one for each command that changes
something (a put, a delete that found a key, a batch, an etcd transaction: all changes of one
command share its revision, each with a sub of its own). Reads name a revision or take the newest.

Each table keyed by a user key is a KeyedTable (statemachine/long_keys.py): keys over LMDB's
511-byte key limit are in a table of their own under a stored key, and reads merge both by key.

- ``data``           key -> its live version (statemachine/key_record.py): what a read at the
                     newest revision sees, in one lookup, as before revisions existed.
- ``history``        (mod_revision, mod_sub) -> a superseded version or a tombstone (version 0).
                     A version enters it when a later change of its key replaces or deletes it,
                     so it is visible at revisions [its mod_revision, the next change's).
- ``history_index``  key -> (mod_revision, mod_sub) of each of its history entries, sorted (an
                     LMDB dupsort table: its values are at most 511 bytes, so the versions
                     themselves, up to the value limit, cannot live there).
- ``changes``        (mod_revision, mod_sub) -> key, for every change: the store's changes in
                     revision order, what a watch replays (`events`). The version a change wrote
                     is in ``history`` under the same (revision, sub) once a later change replaced
                     it, and in ``data`` until then.

Why this shape: a stored key may be 511 bytes, LMDB's key limit, so no table can be keyed by key
plus revision; etcd's own layout (a revision-keyed backend and an in-memory index) is kept with the
index on disk, so a member starts without rebuilding anything.

Compaction at C (`compact`) drops every history entry below C that no read at a revision >= C can
see: one whose successor's revision is <= C, and every tombstone; and every change below C. A
change at C keeps its version, a tombstone too, so that a watch from C replays it; the next
compaction takes it. Reads and watches below C are refused.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import lmdb

from statemachine.key_record import KeyVersion, change_of, decode, encode, revisions_of
from statemachine.leases import LeaseTables
from statemachine.long_keys import KeyedTable

HISTORY_DB_NAME = b"history"
HISTORY_INDEX_DB_NAME = b"history_index"
CHANGES_DB_NAME = b"changes"
REVISION_KEY = b"revision"
COMPACTED_KEY = b"compacted"
_CHANGE = struct.Struct(">QI")  # (mod_revision, mod_sub): a history key, and an index value
CHANGE = _CHANGE  # for readers of the layout (statemachine/etcd_export.py)
_I64 = struct.Struct(">q")
FIRST_REVISION = 1  # an empty store's revision, as etcd's


class CompactedError(LookupError):
    """A read or compaction at a revision below the compacted one (etcd's ErrCompacted)."""


class FutureRevisionError(LookupError):
    """A read or compaction at a revision above the store's (etcd's ErrFutureRev)."""


@dataclass(frozen=True, slots=True)
class MvccTables:
    data: KeyedTable
    history: lmdb._Database
    history_index: KeyedTable
    meta: lmdb._Database
    changes: lmdb._Database
    leases: LeaseTables  # which keys each lease holds: a put or delete moves a key between leases


def store_revision(txn: lmdb.Transaction, tables: MvccTables) -> int:
    raw = txn.get(REVISION_KEY, db=tables.meta)
    return FIRST_REVISION if raw is None else _I64.unpack(raw)[0]


def compacted_revision(txn: lmdb.Transaction, tables: MvccTables) -> int:
    raw = txn.get(COMPACTED_KEY, db=tables.meta)
    return 0 if raw is None else _I64.unpack(raw)[0]


class RevisionWriter:
    """The changes of one apply batch, inside its write transaction. Each command calls `begin`,
    its puts and deletes, then `end`, which moves the store's revision when something changed."""

    def __init__(self, txn: lmdb.Transaction, tables: MvccTables) -> None:
        self._txn = txn
        self.tables = tables
        self.revision = store_revision(txn, tables)
        self._sub = 0
        self.changed = False  # whether the command under way has changed something

    def begin(self) -> None:
        self._sub = 0
        self.changed = False

    def end(self) -> int:
        """The store's revision after the command."""
        if self.changed:
            self.revision += 1
            self._txn.put(REVISION_KEY, _I64.pack(self.revision), db=self.tables.meta)
        return self.revision

    @property
    def pending(self) -> int:
        """The revision this command's changes get."""
        return self.revision + 1

    def _next_change(self, key: bytes) -> tuple[int, int]:
        """The (revision, sub) of the next change, which changes `key`: logged in ``changes``."""
        self.changed = True
        sub = self._sub
        self._sub += 1
        self._txn.put(_CHANGE.pack(self.revision + 1, sub), key, db=self.tables.changes, append=True)
        return self.revision + 1, sub

    def current(self, key: bytes) -> KeyVersion | None:
        record = self.tables.data.get(self._txn, key)
        return None if record is None else decode(key, record)

    def put(self, key: bytes, value: bytes, lease: int = 0) -> bool:
        """Write `value` as `key`'s next version; whether the key existed."""
        self.tables.data.names.name(self._txn, key)  # a colliding long key is refused before any change
        record = self.tables.data.get(self._txn, key)
        revision, sub = self._next_change(key)
        old_lease = 0
        if record is None:
            new = KeyVersion(key, value, revision, revision, 1, lease, sub)
        else:
            create, _, _, version, old_lease = revisions_of(record)
            new = KeyVersion(key, value, create, revision, version + 1, lease, sub)
            self._file(key, record)
        self.tables.data.put(self._txn, key, encode(new))
        if lease != old_lease:
            if old_lease:
                self.tables.leases.detach(self._txn, old_lease, key)
            if lease:
                self.tables.leases.attach(self._txn, lease, key)
        return record is not None

    def delete(self, key: bytes) -> KeyVersion | None:
        """Delete `key`; the version it had, or None (then nothing changed)."""
        record = self.tables.data.pop(self._txn, key)
        if record is None:
            return None
        old = decode(key, record)
        revision, sub = self._next_change(key)
        if old.lease:
            self.tables.leases.detach(self._txn, old.lease, key)
        self._file(key, record)
        self._file(key, encode(KeyVersion(key, b"", 0, revision, 0, 0, sub)))
        return old

    def delete_range(self, start: bytes, end: bytes | None) -> list[KeyVersion]:
        """Delete every live key in [start, end) (None: to the last key); the versions they had."""
        keys = list(live_keys(self._txn, self.tables, start, end))
        return [old for old in map(self.delete, keys) if old is not None]

    def restore(self, kv: KeyVersion, logged: bool) -> None:
        """Write `kv` - a version, or a tombstone (version 0), with the revisions it had in the store
        it comes from (an etcd snapshot restored: statemachine/etcd_import.py) - as `put` and
        `delete` write theirs. Versions come in revision order. `logged`: whether a watch may
        replay the change (it is not below the compacted revision)."""
        txn, tables = self._txn, self.tables
        tables.data.names.name(txn, kv.key)  # a colliding long key is refused before any change
        if logged:
            txn.put(_CHANGE.pack(kv.mod_revision, kv.mod_sub), kv.key, db=tables.changes, append=True)
        record = tables.data.get(txn, kv.key)
        old_lease = 0
        if record is not None:
            old_lease = revisions_of(record)[4]
            self._file(kv.key, record)
        if kv.tombstone:
            if record is not None:
                tables.data.delete(txn, kv.key)
            self._file(kv.key, encode(kv))
        else:
            tables.data.put(txn, kv.key, encode(kv))
        lease = 0 if kv.tombstone else kv.lease
        if lease != old_lease:
            if old_lease:
                tables.leases.detach(txn, old_lease, kv.key)
            if lease:
                tables.leases.attach(txn, lease, kv.key)
        self.revision = max(self.revision, kv.mod_revision)

    def restore_revisions(self, revision: int, compacted: int) -> None:
        """Set the store's revision and compacted revision (after `restore`)."""
        self.revision = revision
        self._txn.put(REVISION_KEY, _I64.pack(revision), db=self.tables.meta)
        if compacted:
            self._txn.put(COMPACTED_KEY, _I64.pack(compacted), db=self.tables.meta)

    def _file(self, key: bytes, record: bytes) -> None:
        change = _CHANGE.pack(*change_of(record))
        self._txn.put(change, record, db=self.tables.history)
        self.tables.history_index.put(self._txn, key, change, dupdata=True)

    def compact(self, revision: int) -> None:
        """Drop the history no read at `revision` or later can see (module docstring). Raises
        CompactedError / FutureRevisionError as etcd refuses such a compaction: one at or below
        the compacted revision (etcd's mvcc: a second compaction at the same revision too), or
        above the store's."""
        txn, tables = self._txn, self.tables
        compacted = compacted_revision(txn, tables)
        if compacted and revision <= compacted:
            raise CompactedError(revision)
        if revision > self.revision:
            raise FutureRevisionError(revision)
        names = tables.history_index.names
        for db, long in ((tables.history_index.short, False), (tables.history_index.long, True)):
            index = txn.cursor(db=db)
            found = index.first()
            while found:  # each half in the order of its stored keys: any order does
                stored = index.key()
                key = names.full(txn, stored) if long else stored
                changes = [_CHANGE.unpack(raw) for raw in index.iternext_dup()]
                live = tables.data.get(txn, key)
                if not self._compact_key(key, stored, db, changes, live, revision) and long and live is None:
                    names.forget(txn, key)  # nothing of the key is left
                found = index.set_range(stored + b"\x00")
        changes = txn.cursor(db=tables.changes)
        found = changes.first()
        while found and _CHANGE.unpack(changes.key())[0] < revision:
            found = changes.delete()
        txn.put(COMPACTED_KEY, _I64.pack(revision), db=tables.meta)

    def _compact_key(self, key: bytes, stored: bytes, index: lmdb._Database, changes: list[tuple[int, int]],
                     live: bytes | None, revision: int) -> int:
        """Drop `key`'s history entries that compaction at `revision` drops; how many are left."""
        txn, tables = self._txn, self.tables
        successors = [change[0] for change in changes[1:]] + [change_of(live)[0] if live else None]
        left = len(changes)
        for change, successor in zip(changes, successors):
            raw = _CHANGE.pack(*change)
            tombstone = decode(key, txn.get(raw, db=tables.history)).tombstone
            # A change at the compacted revision itself is kept with its version (a watch from
            # there replays it), a tombstone included; the next compaction takes it.
            if change[0] < revision and ((successor is not None and successor <= revision) or tombstone):
                txn.delete(raw, db=tables.history)
                txn.delete(stored, raw, db=index)
                left -= 1
        return left


def check_revision(txn: lmdb.Transaction, tables: MvccTables, revision: int, current: int | None = None) -> None:
    """Refuse a read or compaction at `revision` as etcd does (0 or less: the newest)."""
    if revision <= 0:
        return
    newest = store_revision(txn, tables) if current is None else current
    if revision > newest:
        raise FutureRevisionError(revision)
    if revision < compacted_revision(txn, tables):
        raise CompactedError(revision)


def live_keys(txn: lmdb.Transaction, tables: MvccTables, start: bytes, end: bytes | None) -> Iterator[bytes]:
    return tables.data.keys(txn, start, end)


def version_at(txn: lmdb.Transaction, tables: MvccTables, key: bytes, revision: int) -> KeyVersion | None:
    """`key` as a read at `revision` sees it (None: absent then). The caller checked the revision."""
    record = tables.data.get(txn, key)
    if record is not None:
        current = decode(key, record)
        if revision <= 0 or current.mod_revision <= revision:
            return current
    elif revision <= 0:
        return None
    return _from_history(txn, tables, key, revision)


def _from_history(txn: lmdb.Transaction, tables: MvccTables, key: bytes, revision: int) -> KeyVersion | None:
    slot = tables.history_index.slot(txn, key)
    if slot is None:
        return None
    stored, db = slot
    index = txn.cursor(db=db)
    if not index.set_key(stored):
        return None
    if index.set_range_dup(stored, _CHANGE.pack(revision + 1, 0)):
        found = index.prev_dup()  # the last change at or below `revision`, if any
    else:
        found = index.set_key(stored) and index.last_dup()  # every change is at or below it
    if not found:
        return None
    raw = index.value()
    if _CHANGE.unpack(raw)[0] > revision:
        return None
    kept = decode(key, txn.get(raw, db=tables.history))
    return None if kept.tombstone else kept


def range_at(txn: lmdb.Transaction, tables: MvccTables, start: bytes, end: bytes | None,
             revision: int) -> Iterator[KeyVersion]:
    """The keys in [start, end) that exist at `revision` (0: the newest), in key order."""
    if revision <= 0 or revision >= store_revision(txn, tables):
        for key, record in tables.data.ordered(txn, start, end):
            yield decode(key, record)
        return
    for key in _keys_ever(txn, tables, start, end):
        kept = version_at(txn, tables, key, revision)
        if kept is not None:
            yield kept


def _keys_ever(txn: lmdb.Transaction, tables: MvccTables, start: bytes, end: bytes | None) -> Iterator[bytes]:
    """Every key in [start, end) that is live or has history, in order, once each."""
    live = live_keys(txn, tables, start, end)
    past = _history_keys(txn, tables, start, end)
    next_live, next_past = next(live, None), next(past, None)
    while next_live is not None or next_past is not None:
        if next_past is None or (next_live is not None and next_live < next_past):
            yield next_live
            next_live = next(live, None)
        elif next_live is None or next_past < next_live:
            yield next_past
            next_past = next(past, None)
        else:
            yield next_live
            next_live, next_past = next(live, None), next(past, None)


def _history_keys(txn: lmdb.Transaction, tables: MvccTables, start: bytes, end: bytes | None) -> Iterator[bytes]:
    return tables.history_index.keys(txn, start, end)  # each key once, however many changes it has


def history_hash(txn: lmdb.Transaction, tables: MvccTables, revision: int) -> int:
    """A CRC-32 over every change at or below `revision` (0: all) that the store keeps, live
    versions and history alike, in key then revision order (etcd's HashKV hashes its kept
    revisions likewise); records are checked against their checksums on the way."""
    limit = revision if revision > 0 else 1 << 62
    crc = 0
    history = txn.cursor(db=tables.history)
    for key in _keys_ever(txn, tables, b"", None):
        changes = []
        stored, db = tables.history_index.slot(txn, key) or (b"", tables.history_index.short)
        index = txn.cursor(db=db)
        if stored and index.set_key(stored):
            changes = [(raw, history.get(raw)) for raw in index.iternext_dup()]
        live = tables.data.get(txn, key)
        if live is not None:
            changes.append((_CHANGE.pack(*change_of(live)), live))
        for change, record in changes:
            if _CHANGE.unpack(change)[0] <= limit:
                decode(key, record)  # refuses a damaged record
                crc = zlib.crc32(record, zlib.crc32(change, zlib.crc32(key, crc)))
    return crc


@dataclass(frozen=True, slots=True)
class Change:
    """One change of the store, as a watch delivers it: the version it wrote (a tombstone for a
    delete) and, when asked, the version it replaced."""

    kv: KeyVersion
    prev: KeyVersion | None = None


def changes_between(txn: lmdb.Transaction, tables: MvccTables, first: int, last: int,
                    start: bytes = b"", end: bytes | None = None, with_prev: bool = False) -> list[Change]:
    """Every change of revisions first..last to a key in [start, end) (end None: to the last key;
    end == start + b"\0": that key alone), in revision order. The caller checked that `first`
    is not compacted."""
    out: list[Change] = []
    cursor = txn.cursor(db=tables.changes)
    found = cursor.set_range(_CHANGE.pack(first, 0))
    while found:
        raw = cursor.key()
        revision = _CHANGE.unpack(raw)[0]
        if revision > last:
            break
        key = cursor.value()
        if key >= start and (end is None or key < end):
            kv = _version_of_change(txn, tables, key, raw)
            if kv is not None:
                prev = _previous(txn, tables, key, raw) if with_prev else None
                out.append(Change(kv, prev))
        found = cursor.next()
    return out


def _version_of_change(txn: lmdb.Transaction, tables: MvccTables, key: bytes,
                       change: bytes) -> KeyVersion | None:
    """The version `change` wrote; None when a compaction took it (a store compacted before
    changes at the compacted revision kept their versions: the change is not replayed, as etcd's
    watch, which reads its compacted backend, does not replay it either)."""
    record = txn.get(change, db=tables.history)
    if record is None:  # not replaced yet: the live version, if it is the one this change wrote
        record = tables.data.get(txn, key)
        if record is None or _CHANGE.pack(*change_of(record)) != change:
            return None
    return decode(key, record)


def _previous(txn: lmdb.Transaction, tables: MvccTables, key: bytes, change: bytes) -> KeyVersion | None:
    """The version `key` had just before `change` (None: absent then)."""
    slot = tables.history_index.slot(txn, key)
    if slot is None:
        return None
    stored, db = slot
    index = txn.cursor(db=db)
    if index.set_key_dup(stored, change):
        found = index.prev_dup()
    else:  # the change is still live: the version it replaced was filed last
        found = index.set_key(stored) and index.last_dup()
    if not found:
        return None
    kept = decode(key, txn.get(index.value(), db=tables.history))
    return None if kept.tombstone else kept
