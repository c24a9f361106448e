"""ReadView: the state machine as of one applied index, pinned in an LMDB read transaction (live
exports for Spark, the cross-member state check), and the range reads it shares with
KVStateMachine: values checked against their checksums, pages bounded by count and bytes."""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

import lmdb

from statemachine.key_record import stored_value
from statemachine.long_keys import KeyedTable
from statemachine.mvcc import COMPACTED_KEY, REVISION_KEY, MvccTables, store_revision
from statemachine.value_checksum import unseal, verify

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")


class ReadView:
    """One LMDB read transaction of the state machine, pinned: every read through it sees the
    state exactly as of `index`, however far `apply` moves on. While it is open LMDB cannot reuse
    the pages it sees, so the file grows under writes: close it promptly. py-lmdb transactions
    may move between threads but must not be used by two at once; the caller serialises.
    KVStateMachine.read_view() makes one."""

    def __init__(self, txn: lmdb.Transaction, mvcc: MvccTables, auth: lmdb._Database,
                 applied: tuple[int, int]) -> None:
        self._txn = txn
        self._mvcc = mvcc
        self._data = mvcc.data
        self._auth_db = auth
        self.index, self.term = applied
        self.revision = store_revision(txn, mvcc)
        self.closed = False

    def scan(self, start: bytes, end: bytes | None, limit: int,
             max_bytes: int | None = None) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Like KVStateMachine.scan, at this view's index."""
        return take_page(unsealed_range(self._data, self._txn, start, end or None), limit, max_bytes)

    def keys(self, start: bytes, end: bytes | None) -> Iterator[bytes]:
        """Keys in [start, end) in order, without copying values (for split points)."""
        return self._data.keys(self._txn, start, end or None)

    def count(self) -> int:
        return self._data.count(self._txn)

    def state_hash(self) -> str:
        """Hex sha256 over every live key version (revisions and value) in key order, the history
        and the store's revisions, each length-prefixed so different contents never hash alike:
        equal on members that applied the same entries. Raises CorruptStateError for a record
        that fails its checksum."""
        digest = hashlib.sha256()
        for key, record in self._data.ordered(self._txn):
            body = unseal(key, record)
            digest.update(_U16.pack(len(key)) + key + _U64.pack(len(body)))
            digest.update(body)
        # The history, marked off like the auth tables below: its index names each record's key.
        digest.update(b"\xffhistory")
        history = self._txn.cursor(db=self._mvcc.history)
        for key, change in self._mvcc.history_index.ordered(self._txn, each_dup=True):
            body = unseal(key, history.get(change) or b"")
            digest.update(_U16.pack(len(key)) + key + change + _U64.pack(len(body)))
            digest.update(body)
        digest.update(b"\xffchanges")
        for change, key in self._txn.cursor(db=self._mvcc.changes).iternext():
            digest.update(change + _U16.pack(len(key)) + key)
        for name in (REVISION_KEY, COMPACTED_KEY):
            digest.update(name + (self._txn.get(name, db=self._mvcc.meta) or b""))
        # The auth tables too, marked off from the data, so members that disagree on users or
        # permissions are caught as those that disagree on keys.
        digest.update(b"\xffauth")
        for key, value in self._txn.cursor(db=self._auth_db).iternext():
            digest.update(_U16.pack(len(key)) + key + _U64.pack(len(value)) + value)
        return digest.hexdigest()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._txn.abort()


def unsealed_range(data: KeyedTable, txn: lmdb.Transaction, start: bytes, end: bytes | None,
                   keys_only: bool = False) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) in [start, end), values checked against their checksums; with `keys_only`
    (key, b""), the records checked all the same."""
    if keys_only:
        for key, record in data.ordered(txn, start, end):
            verify(key, record)
            yield key, b""
        return
    for key, record in data.ordered(txn, start, end):
        yield key, stored_value(key, record)


def take_page(items: Iterator[tuple[bytes, bytes]], limit: int,
              max_bytes: int | None = None) -> tuple[list[tuple[bytes, bytes]], bool]:
    """Up to `limit` items and, with `max_bytes`, keys and values of at most that many bytes
    (at least one item, however large); (page, whether items were left)."""
    page: list[tuple[bytes, bytes]] = []
    taken = 0
    for item in items:
        if len(page) == limit:
            return page, True
        if max_bytes is not None:
            taken += len(item[0]) + len(item[1])
            if taken > max_bytes and page:
                return page, True
        page.append(item)
    return page, False
