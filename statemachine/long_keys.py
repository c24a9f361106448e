"""Keys longer than LMDB's 511-byte key limit: the tables keyed by a user key, in two halves.

LMDB compiles in a key limit of 511 bytes (mdb_env_get_maxkeysize), for table keys and for the
values of a dupsort table alike. A key of up to 511 bytes is stored as itself, in the table it
always was stored in, so a state written before long keys existed reads as before. A longer key
("long") is stored in a table of its own under its *stored key*

    stored = key[:PREFIX_BYTES] + BLAKE2b-128(key)             (511 bytes)

and ``long_keys`` maps each stored key back to its full key. Its own tables, because every string
of 1..511 bytes may be some short key: no stored form in the short table could be told from one.

Order. Every read in key order merges the two halves by full key (`ordered`). The long half in
stored-key order is in full-key order except within a run of long keys that share their first
PREFIX_BYTES bytes (their hashes order them), so each such run is gathered and sorted; the run
ends where the prefix changes. Bounds map conservatively: a long key k >= start has
k[:PREFIX_BYTES] >= start[:PREFIX_BYTES], and k < end has k[:PREFIX_BYTES] <= end[:PREFIX_BYTES],
so the scan starts at the one and stops past the other, and each full key is checked against
[start, end). A run costs memory only for keys that share PREFIX_BYTES bytes, which a client
chooses; the key limit bounds each (docs/decisions/0072-long-keys.md).

A digest that collides (two long keys with one stored key: 2^-64 odds for 2^32 keys) is refused
at apply, alike on every replica (`LongKeyCollision`), rather than one key overwriting the other.
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter

import lmdb

LMDB_MAX_KEY_BYTES = 511  # mdb_env_get_maxkeysize: keys up to this are stored as themselves
DIGEST_BYTES = 16
PREFIX_BYTES = LMDB_MAX_KEY_BYTES - DIGEST_BYTES
LONG_KEYS_DB_NAME = b"long_keys"
DATA_LONG_DB_NAME = b"data_long"  # the live versions of long keys (statemachine/mvcc.py's data)


class LongKeyCollision(ValueError):
    """Two long keys whose stored keys are equal (module docstring)."""


def is_long(key: bytes) -> bool:
    return len(key) > LMDB_MAX_KEY_BYTES


def stored_key(key: bytes) -> bytes:
    """The key `key` is stored under in its table (itself when short)."""
    if not is_long(key):
        return key
    return key[:PREFIX_BYTES] + hashlib.blake2b(key, digest_size=DIGEST_BYTES).digest()


@dataclass(frozen=True, slots=True)
class LongKeyNames:
    """``long_keys``: stored key -> full key, for every long key some table holds. An entry is
    written with the key's first version and dropped when compaction leaves the key nothing."""

    db: lmdb._Database | None  # None: a state opened read-only that has no long key (nor the table)

    def name(self, txn: lmdb.Transaction, key: bytes) -> bytes:
        """`key`'s stored key, recorded; LongKeyCollision when another key holds it."""
        stored = stored_key(key)
        if is_long(key):
            held = txn.get(stored, db=self.db)
            if held is None:
                txn.put(stored, key, db=self.db)
            elif held != key:
                raise LongKeyCollision(f"keys of {len(key)} and {len(held)} bytes share the stored key of "
                                       f"{len(stored)} bytes starting {key[:32]!r}: the second is refused")
        return stored

    def full(self, txn: lmdb.Transaction, stored: bytes) -> bytes:
        return bytes(txn.get(stored, db=self.db))

    def forget(self, txn: lmdb.Transaction, key: bytes) -> None:
        if is_long(key):
            txn.delete(stored_key(key), db=self.db)


@dataclass(frozen=True, slots=True)
class KeyedTable:
    """One table keyed by user key, as its two halves: short keys in `short`, long ones in `long`."""

    short: lmdb._Database
    long: lmdb._Database | None  # None: as LongKeyNames.db
    names: LongKeyNames

    def slot(self, txn: lmdb.Transaction, key: bytes) -> tuple[bytes, lmdb._Database] | None:
        """(stored key, table) of `key`, for LMDB calls made with them; None when another long
        key holds its stored key (a collision: `key` itself is absent)."""
        if not is_long(key):
            return key, self.short
        if self.long is None:
            return None
        stored = stored_key(key)
        held = txn.get(stored, db=self.names.db)
        return None if held is not None and held != key else (stored, self.long)

    def get(self, txn: lmdb.Transaction, key: bytes) -> bytes | None:
        slot = self.slot(txn, key)
        return None if slot is None else txn.get(slot[0], db=slot[1])

    def put(self, txn: lmdb.Transaction, key: bytes, value: bytes, dupdata: bool = False) -> None:
        txn.put(self.names.name(txn, key), value, db=self.long if is_long(key) else self.short, dupdata=dupdata)

    def pop(self, txn: lmdb.Transaction, key: bytes) -> bytes | None:
        slot = self.slot(txn, key)
        return None if slot is None else txn.pop(slot[0], db=slot[1])

    def delete(self, txn: lmdb.Transaction, key: bytes, value: bytes = b"") -> bool:
        slot = self.slot(txn, key)
        return slot is not None and txn.delete(slot[0], value, db=slot[1])

    def count(self, txn: lmdb.Transaction) -> int:
        return int(txn.stat(self.short)["entries"]) + (0 if self.long is None else int(txn.stat(self.long)["entries"]))

    def count_range(self, txn: lmdb.Transaction, start: bytes = b"", end: bytes | None = None) -> int:
        """How many keys [start, end) holds (each once in a dupsort table): a walk of keys alone,
        no value read and no order merged."""
        cursor = txn.cursor(db=self.short)
        counted = 0
        if cursor.set_range(start) if start else cursor.first():
            for key in cursor.iternext_nodup(keys=True, values=False):
                if end is not None and key >= end:
                    break
                counted += 1
        if self.long is not None and txn.stat(self.long)["entries"]:
            counted += sum(1 for _ in _long_items(txn, txn.cursor(db=self.long), self.names, start, end, False))
        return counted

    def ordered(self, txn: lmdb.Transaction, start: bytes = b"", end: bytes | None = None,
                each_dup: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """(full key, value) of the keys in [start, end) (end None: to the last), in full-key
        order; in a dupsort table each key once (its first value) or, with `each_dup`, each value."""
        short = _short_items(txn.cursor(db=self.short), start, end, each_dup)
        if self.long is None or not txn.stat(self.long)["entries"]:
            return short  # the common case: no long key at all, nothing to merge
        long = _long_items(txn, txn.cursor(db=self.long), self.names, start, end, each_dup)
        return heapq.merge(short, long, key=itemgetter(0))

    def first(self, txn: lmdb.Transaction, start: bytes, count: int) -> Iterator[tuple[bytes, bytes]]:
        """The first `count` (full key, value) pairs from `start` on, in full-key order, for a
        caller that counted them in this transaction (so no end bound is checked): with no long
        key, LMDB's cursor stepping in C alone."""
        if self.long is not None and txn.stat(self.long)["entries"]:
            return itertools.islice(self.ordered(txn, start), count)
        return itertools.islice(_stepping_from(txn.cursor(db=self.short), start, each_dup=False), count)

    def keys(self, txn: lmdb.Transaction, start: bytes = b"", end: bytes | None = None) -> Iterator[bytes]:
        return (key for key, _ in self.ordered(txn, start, end))


def _stepping_from(cursor: lmdb.Cursor, start: bytes, each_dup: bool) -> Iterator[tuple[bytes, bytes]]:
    """py-lmdb's own iterator of the (key, value) pairs from `start` on, which steps the cursor in
    C: a list of 10,000 keys walks in a third of the time that a key(), value() and next() call per
    item take."""
    if not (cursor.set_range(start) if start else cursor.first()):
        return iter(())
    return cursor.iternext(keys=True, values=True) if each_dup else cursor.iternext_nodup(keys=True, values=True)


def _short_items(cursor: lmdb.Cursor, start: bytes, end: bytes | None,
                 each_dup: bool) -> Iterator[tuple[bytes, bytes]]:
    items = _stepping_from(cursor, start, each_dup)
    if end is None:
        yield from items
        return
    for item in items:
        if item[0] >= end:
            return
        yield item


def _long_items(txn: lmdb.Transaction, cursor: lmdb.Cursor, names: LongKeyNames, start: bytes,
                end: bytes | None, each_dup: bool) -> Iterator[tuple[bytes, bytes]]:
    """The long half in full-key order: runs sharing a PREFIX_BYTES prefix sorted (docstring)."""
    lower, upper = start[:PREFIX_BYTES], None if end is None else end[:PREFIX_BYTES]
    run: list[tuple[bytes, bytes]] = []
    run_prefix = b""
    found = cursor.set_range(lower) if lower else cursor.first()
    while found:
        stored = cursor.key()
        prefix = stored[:PREFIX_BYTES]
        if upper is not None and prefix > upper:
            break
        if prefix != run_prefix:
            yield from sorted(run, key=itemgetter(0))  # stable: a key's values stay in order
            run, run_prefix = [], prefix
        key = names.full(txn, stored)
        if key >= start and (end is None or key < end):
            run.append((key, cursor.value()))
        found = cursor.next() if each_dup else cursor.next_nodup()
    yield from sorted(run, key=itemgetter(0))
