"""The key-value state machine: committed log entries applied into an LMDB environment.

One LMDB environment (a directory) holds these named databases:

- ``data``            user key -> its live version: revisions and value, with a checksum
                      (statemachine/key_record.py, statemachine/value_checksum.py)
- ``data_long``, ``history_index_long``, ``lease_keys_long``, ``long_keys``: the tables keyed by a
                      user key, for keys over LMDB's 511-byte key limit (statemachine/long_keys.py)
- ``history``, ``history_index``: the versions that later changes replaced or deleted, so a read
                      at a past revision sees that revision's store (statemachine/mvcc.py)
- ``sessions``, ``session_results``, ``session_expiry``: the client sessions that apply each
                      write exactly once (statemachine/client_sessions.py: rules, key layouts)
- ``meta``            b"applied" -> (applied index, term of that entry); b"format" -> version;
                      b"membership" -> the last configuration applied (raft/core/membership.py);
                      b"revision", b"compacted" -> the store's revision and the compacted one
- ``auth``            users, roles, permissions and whether auth is on (statemachine/auth_state.py):
                      never among the user's keys, but in every copy, snapshot and state hash
- ``alarms``          the raised alarms, NOSPACE and CORRUPT by member (statemachine/alarms.py):
                      in every copy and snapshot

`apply` writes a whole batch of entries - user data, sessions and the applied index - in ONE write
transaction, so the three can never disagree: after any crash the state is exactly "all entries up
to applied_index", and the driver replays the log from ``applied_index + 1``. Nothing is applied
twice and nothing is skipped. What each entry does is statemachine/apply_batch.py, the one apply
path of every face. A batch ends early after a state check marker (Command.check_state): the state
as of the marker is pinned in a read transaction for kv/server/state_check.py to hash, and `apply`
returns the outcomes of the entries through it (the driver hands out the rest again). It ends
early too after an entry that raised while applied: the transaction is rolled back, the entries
before it applied again, and the entry applied as a refusal (only the applied index moves).

Durability and crash consistency (LMDB's documentation of MDB_NOSYNC / MDB_NOMETASYNC):

- ``sync=False`` (default) opens LMDB with ``sync=False`` (MDB_NOSYNC): a commit writes its pages
  into the OS page cache and does not fsync. The Raft log is durable (fsynced before anything is
  acknowledged), so losing recent state transactions only means replaying them. A process crash
  (kill -9, OOM, an exception) loses nothing at all: the page cache survives it. After an OS crash
  or power loss LMDB keeps its integrity (an older, consistent state) only if the filesystem
  preserves write order, because LMDB writes the data pages and then the meta page with plain
  pwrite and, without fsync, the kernel may write them back in any order. `writemap` stays off:
  with MDB_WRITEMAP + NOSYNC there is not even that guarantee.
- ``sync=True`` opens LMDB with ``sync=True, metasync=False`` (MDB_NOMETASYNC): one fdatasync of
  the data pages per commit, the meta page is flushed with the next commit. LMDB documents this as
  keeping integrity after a system crash, which may undo the last transaction - exactly what
  replay from ``applied_index + 1`` repairs. Use it where power loss is a real risk.

In both modes `sync()` forces everything to disk; the snapshot/compaction code must call it (or
take a snapshot) before the log is compacted past `applied_index`.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import lmdb

from raftkv_proto import etcd_rpc_pb2
from raft.core import Entry, EntryType
from raftkv_proto.key_ranges import prefix_end
from statemachine.alarms import ALARMS_DB_NAME, AlarmHolder, load_alarms
from statemachine.apply_batch import (
    MEMBERSHIP_KEY,
    ApplyBatch,
    ApplyOutcome,
    EntryNotApplied,
    Holders,
    StateTables,
    not_applied,
)
from statemachine.auth_state import AUTH_DB_NAME, AuthHolder, load_view
from statemachine.client_sessions import (
    MAX_SESSIONS,
    SESSION_DB_NAMES,
    SessionLimits,
    SessionStats,
    SessionTables,
)
from statemachine.commands import applies_in_its_size
from statemachine.disk_space import out_of_space
from statemachine.errors import ApplyOrderError, StateFullError
from statemachine.etcd_export import EtcdBucketItems
from statemachine.etcd_export import etcd_buckets
from statemachine.etcd_import import EtcdBuckets, Imported, import_etcd
from statemachine.etcd_txn import check_read_revision, read_range, read_txn
from statemachine.range_read import Allow, allow_any
from statemachine.key_record import stored_value
from statemachine.leases import LEASE_KEYS_DB_NAME, LEASE_LONG_KEYS_DB_NAME, LEASES_DB_NAME, LeaseHolder, LeaseTables
from statemachine.long_keys import DATA_LONG_DB_NAME, LONG_KEYS_DB_NAME, KeyedTable, LongKeyNames
from statemachine.mvcc import (
    CHANGES_DB_NAME,
    Change,
    CompactedError,
    changes_between,
    HISTORY_DB_NAME,
    HISTORY_INDEX_DB_NAME,
    MvccTables,
    compacted_revision,
    history_hash,
    store_revision,
)
from statemachine.read_view import ReadView, take_page, unsealed_range

log = logging.getLogger(__name__)

# 2: values stored with a checksum; session tables keyed by registration index.
# 3: revisions (MVCC): each value stored with its key's revisions, superseded versions in history.
FORMAT_VERSION = 3

# The named databases (module docstring), in the order __init__ unpacks them and copy_to makes them.
_DB_NAMES = (b"data", *SESSION_DB_NAMES, b"meta", AUTH_DB_NAME, ALARMS_DB_NAME, HISTORY_DB_NAME,
             HISTORY_INDEX_DB_NAME, CHANGES_DB_NAME, LEASES_DB_NAME, LEASE_KEYS_DB_NAME, LONG_KEYS_DB_NAME,
             DATA_LONG_DB_NAME, HISTORY_INDEX_DB_NAME + b"_long", LEASE_LONG_KEYS_DB_NAME)
_DUPSORT_DB_NAMES = frozenset({HISTORY_INDEX_DB_NAME, LEASE_KEYS_DB_NAME, HISTORY_INDEX_DB_NAME + b"_long",
                               LEASE_LONG_KEYS_DB_NAME})
_APPLIED_KEY = b"applied"
_FORMAT_KEY = b"format"
_U64 = struct.Struct(">Q")
_APPLIED = struct.Struct(">QQ")  # (applied index, applied term)


class KVStateMachine:
    """The replicated key-value state on LMDB. `apply` is called by one thread (the driver); the
    read methods may be called from any number of threads at the same time."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int = 8 << 30,
        sync: bool = False,
        session_window: int = 1024,
        session_ttl_entries: int = 1_000_000,
        max_sessions: int = MAX_SESSIONS,
        max_readers: int = 1024,
        auth: AuthHolder | None = None,
        alarms: AlarmHolder | None = None,
        leases: LeaseHolder | None = None,
    ) -> None:
        session_limits = SessionLimits(session_window, session_ttl_entries, max_sessions)  # checks them
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # See the module docstring for why these flags (crash consistency without per-commit fsync).
        self._env = lmdb.open(
            str(self.path), map_size=map_size, subdir=True, max_dbs=len(_DB_NAMES), max_readers=max_readers,
            sync=sync, metasync=False, writemap=False, map_async=False,
        )
        self._dbs = {name: self._env.open_db(name, dupsort=name in _DUPSORT_DB_NAMES) for name in _DB_NAMES}
        (data, sessions, results, expiry, self._meta, auth_db, alarms_db, history, history_index, changes,
         leases_db, lease_keys_db, names_db, data_long, history_index_long, lease_long_keys_db) = self._dbs.values()
        names = LongKeyNames(names_db)
        leases_tables = LeaseTables(leases_db, lease_keys_db, lease_long_keys_db, names)
        self._data = KeyedTable(data, data_long, names)
        self._mvcc = MvccTables(self._data, history, KeyedTable(history_index, history_index_long, names),
                                self._meta, changes, leases_tables)
        self._tables = StateTables(self._meta, self._mvcc, SessionTables(sessions, results, expiry), session_limits,
                                   auth_db, alarms_db, leases_tables)
        self._applied = self._load_applied()
        # Shared with the client service, which checks requests against it (auth_state.AuthHolder).
        self.auth = auth or AuthHolder()
        # Shared with the client service, which refuses puts while NOSPACE is raised.
        self.alarms = alarms or AlarmHolder()
        # Shared with the lessor (kv/server/lessor.py), which counts their expiry on the leader.
        self.leases = leases or LeaseHolder()
        self._holders = Holders(self.auth, self.alarms, self.leases)
        with self._env.begin() as txn:
            self.auth.publish(load_view(txn, auth_db))
            self.alarms.publish(load_alarms(txn, alarms_db))
            self.leases.publish(*leases_tables.load(txn))
        self._state_checks: list[ReadView] = []  # pinned at check markers, not yet taken
        self._closed = False

    # ---- lifecycle -------------------------------------------------------------------------

    def _load_applied(self) -> tuple[int, int]:
        with self._env.begin(write=True) as txn:
            version = txn.get(_FORMAT_KEY, db=self._meta)
            if version is None:
                txn.put(_FORMAT_KEY, _U64.pack(FORMAT_VERSION), db=self._meta)
            elif _U64.unpack(version)[0] != FORMAT_VERSION:
                raise RuntimeError(f"{self.path}: state format {_U64.unpack(version)[0]}, expected {FORMAT_VERSION}")
            raw = txn.get(_APPLIED_KEY, db=self._meta)
        return _APPLIED.unpack(raw) if raw is not None else (0, 0)

    def sync(self) -> None:
        """Force every committed transaction to disk (before the log is compacted past it)."""
        self._env.sync(True)

    def close(self) -> None:
        """Flush and close. The object is unusable afterwards; closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._env.sync(True)
        self._env.close()

    def __enter__(self) -> KVStateMachine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- applied position ------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        return self._applied[0]

    @property
    def applied_term(self) -> int:
        return self._applied[1]

    # ---- apply -----------------------------------------------------------------------------

    @staticmethod
    def in_proportion(entries: Sequence[Entry]) -> bool:
        """The StateMachine port's: see commands.applies_in_its_size."""
        return all(e.type is not EntryType.NORMAL or applies_in_its_size(e.payload) for e in entries)

    def apply(self, entries: Sequence[Entry]) -> list[ApplyOutcome | None]:
        """Apply consecutive committed entries, starting at applied_index + 1, in one transaction.

        Returns one item per entry applied: None for a NOOP or CONFIG entry, an ApplyOutcome for a
        NORMAL one. That is every entry, except that the batch ends after a state check marker (the
        state as of the marker is pinned for take_state_checks) and after an entry that could not
        be applied (statemachine/apply_batch.py): the caller hands the rest in again.
        Raises ApplyOrderError if the entries do not continue the applied index (a driver bug), and
        StateFullError if the LMDB map or its disk is full (then nothing of the batch is applied)."""
        if not entries:
            return []
        self._check_consecutive(entries)
        try:
            outcomes = self._apply_transaction(entries)
        except EntryNotApplied as failed:
            # The transaction, with whatever part of the entry it wrote, was rolled back: apply
            # what came before the entry, then the entry as a refusal. Every replica meets the same
            # failure on the same entry, so each reaches the same state.
            log.error("%s; applied as a refusal, nothing of it written", failed)
            before = list(entries[:entries.index(failed.entry)])
            outcomes = self._apply_transaction(before) if before else []
            outcomes.append(self._apply_as_refusal(failed.entry, failed.reason))
        if outcomes[-1] is not None and outcomes[-1].state_check:
            self._state_checks.append(self.read_view())
        return outcomes

    def _apply_transaction(self, entries: Sequence[Entry]) -> list[ApplyOutcome | None]:
        """`apply`'s work on entries that continue the applied index, in one write transaction."""
        outcomes: list[ApplyOutcome | None] = []
        with self._storage_errors(entries):
            with self._env.begin(write=True) as txn:
                batch = ApplyBatch(txn, self._tables, self._holders)
                for entry in entries:
                    outcome = batch.apply_entry(entry)
                    outcomes.append(outcome)
                    if outcome is not None and outcome.state_check:
                        break
                last = entries[len(outcomes) - 1]
                batch.sessions.drop_stale(last.index)
                txn.put(_APPLIED_KEY, _APPLIED.pack(last.index, last.term), db=self._meta)
        if batch.auth is not self.auth.view:  # published only once committed
            self.auth.publish(batch.auth)
        if batch.alarms is not self.alarms.alarms:
            self.alarms.publish(batch.alarms)
        if batch.lease_ttls is not self.leases.ttls or batch.lease_remaining is not self.leases.remaining:
            self.leases.publish(batch.lease_ttls, batch.lease_remaining)
        self._applied = (last.index, last.term)
        return outcomes

    def _apply_as_refusal(self, entry: Entry, reason: str) -> ApplyOutcome:
        """Apply `entry` as a refusal: only the applied index moves."""
        with self._storage_errors([entry]):
            with self._env.begin(write=True) as txn:
                txn.put(_APPLIED_KEY, _APPLIED.pack(entry.index, entry.term), db=self._meta)
        self._applied = (entry.index, entry.term)
        return not_applied(entry, reason)

    @contextlib.contextmanager
    def _storage_errors(self, entries: Sequence[Entry]) -> Iterator[None]:
        """A full map or disk under an apply transaction as StateFullError (nothing of it applied)."""
        try:
            yield
        except lmdb.MapFullError as exc:
            raise StateFullError(
                f"state machine map at {self.path} is full ({self._env.info()['map_size']} bytes): "
                f"entries {entries[0].index}..{entries[-1].index} were not applied; reads still work. "
                "Restart the node with a larger map (raftkv serve --state-max-bytes; "
                "StorageConfig.state_max_bytes).") from exc
        except lmdb.Error as exc:
            needed = 2 * sum(len(e.payload) for e in entries) + (1 << 20)
            if not out_of_space(exc, self.path, needed):
                raise
            raise StateFullError(
                f"no space left on the device of the state machine at {self.path} ({exc}): entries "
                f"{entries[0].index}..{entries[-1].index} were not applied; reads still work, and "
                "writes resume by themselves once space is freed.") from exc

    def take_state_checks(self) -> list[ReadView]:
        """The read views pinned at state check markers since the last call, oldest first: the
        caller hashes each (ReadView.state_hash) and closes it."""
        views, self._state_checks = self._state_checks, []
        return views

    def _check_consecutive(self, entries: Sequence[Entry]) -> None:
        expected = self._applied[0] + 1
        for entry in entries:
            if entry.index != expected:
                raise ApplyOrderError(
                    f"entries must continue the applied index: expected index {expected}, got {entry.index} "
                    f"(applied_index is {self._applied[0]}; batch starts at {entries[0].index})")
            expected += 1

    # ---- reads -----------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        if not key:
            return None  # no such key can exist; the client service reports why before reading
        with self._env.begin() as txn:
            record = self._data.get(txn, key)
        return None if record is None else stored_value(key, record)

    def etcd_range(self, request: etcd_rpc_pb2.RangeRequest, allow: Allow = allow_any) -> etcd_rpc_pb2.RangeResponse:
        """etcd's Range from one read transaction (statemachine/etcd_txn.py): the header carries
        only the revision. The reply is measured first and its size passed to `allow`, which
        raises to refuse it before any value is read. Raises EtcdRefusal for a compacted or future
        revision."""
        with self._env.begin() as txn:
            return read_range(txn, self._mvcc, request, allow=allow)

    def etcd_read_txn(self, request: etcd_rpc_pb2.TxnRequest, allow: Allow = allow_any) -> etcd_rpc_pb2.TxnResponse:
        """A read-only etcd transaction (etcd_txn.read_only) from one read transaction, outside the
        log; the header carries only the revision. Measured and refused as etcd_range is."""
        with self._env.begin() as txn:
            return read_txn(txn, self._mvcc, request, allow)

    def hash_kv(self, revision: int = 0) -> tuple[int, int, int]:
        """etcd's HashKV: (CRC-32 of every key version and tombstone at or below `revision`, the
        store's revision, the compacted revision), equal on members that applied the same entries."""
        with self._env.begin() as txn:
            check_read_revision(txn, self._mvcc, revision)
            return (history_hash(txn, self._mvcc, revision), store_revision(txn, self._mvcc),
                    compacted_revision(txn, self._mvcc))

    def changes(self, first: int, last: int, start: bytes = b"", end: bytes | None = None,
                with_prev: bool = False) -> list[Change]:
        """The changes of revisions first..last (mvcc.changes_between) to keys in [start, end), for
        a watch. CompactedError when `first` is below the compacted revision."""
        with self._env.begin() as txn:
            if first < compacted_revision(txn, self._mvcc):
                raise CompactedError(first)
            return changes_between(txn, self._mvcc, first, last, start, end, with_prev)

    def lease_keys(self, lease: int) -> list[bytes]:
        """The keys attached to `lease` now (etcd's TimeToLive with keys)."""
        with self._env.begin() as txn:
            return self._tables.leases.attached(txn, lease)

    @property
    def revision(self) -> int:
        """The store's revision: 1 when empty, up by one per command that changed something."""
        with self._env.begin() as txn:
            return store_revision(txn, self._mvcc)

    @property
    def compacted_revision(self) -> int:
        with self._env.begin() as txn:
            return compacted_revision(txn, self._mvcc)

    def scan(self, start: bytes = b"", end: bytes | None = None, limit: int = 1000,
             max_bytes: int | None = None, keys_only: bool = False) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Keys in [start, end) in key order, at most `limit` of them and, with `max_bytes`, no
        more keys and values than that in all (the first pair always comes). An empty or None
        `end` means "to the last key". Returns (items, more); `more` is True when a limit cut the
        result (continue with start = last key + b"\\x00"). With `keys_only` every value is b""
        (each record still checked)."""
        if limit < 1:
            raise ValueError(f"scan limit must be at least 1, got {limit}")
        with self._env.begin() as txn:
            return take_page(unsealed_range(self._data, txn, start, end or None, keys_only), limit, max_bytes)

    def scan_prefix(self, prefix: bytes, limit: int = 1000, max_bytes: int | None = None,
                    keys_only: bool = False) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Keys starting with `prefix`, like `scan`. An empty prefix means every key."""
        return self.scan(prefix, prefix_end(prefix), limit, max_bytes, keys_only)  # b"": to the last key

    def count(self) -> int:
        """Number of user keys."""
        with self._env.begin() as txn:
            return self._data.count(txn)

    def session_stats(self) -> SessionStats:
        """How many client sessions and recorded results are kept (for status and tests)."""
        with self._env.begin() as txn:
            return self._tables.sessions.stats(txn)

    def state_hash(self) -> str:
        """ReadView.state_hash of the current state."""
        view = self.read_view()
        try:
            return view.state_hash()
        finally:
            view.close()

    def size_bytes(self) -> int:
        """Bytes of the map in use (pages up to the highest one written)."""
        info = self._env.info()
        return (int(info["last_pgno"]) + 1) * int(self._env.stat()["psize"])

    def in_use_bytes(self) -> int:
        """Bytes of the pages the tables hold now: less than size_bytes once deletes have freed
        pages, which LMDB reuses for new writes (what --quota-backend-bytes is checked against)."""
        with self._env.begin() as txn:
            stats = [txn.stat(db) for db in self._dbs.values()] + [self._env.stat()]
        pages = sum(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats)
        return pages * int(stats[-1]["psize"])

    def read_view(self) -> ReadView:
        """Pin the current applied state in one read transaction (point-in-time exports, state
        checks); close it when done."""
        txn = self._env.begin()
        raw = txn.get(_APPLIED_KEY, db=self._meta)
        return ReadView(txn, self._mvcc, self._tables.auth, _APPLIED.unpack(raw) if raw is not None else (0, 0))

    @property
    def membership(self) -> bytes:
        """The configuration of the last CONFIG entry applied (b"" when none was)."""
        with self._env.begin() as txn:
            return bytes(txn.get(MEMBERSHIP_KEY, b"", db=self._meta))

    def replace_membership(self, encoded: bytes) -> None:
        """Record `encoded` as the configuration in force, durably: for `snapshot restore`, whose
        new cluster has the members it is restored for, not those the snapshot was taken with."""
        with self._env.begin(write=True) as txn:
            txn.put(MEMBERSHIP_KEY, encoded, db=self._meta)
        self._env.sync(True)

    def import_etcd(self, buckets: EtcdBuckets, signing_key: bytes, term: int = 1) -> Imported:
        """Fill this new, empty state with an etcd snapshot's data (statemachine/etcd_import.py),
        applied as of etcd's consistent index (at least 1) and `term`: for `snapshot restore` of
        an etcd file. Raises EtcdDataError for a damaged record (the caller discards the state)."""
        if self._applied != (0, 0) or self.count():
            raise RuntimeError(f"{self.path}: an etcd snapshot is imported only into a new state")
        imported = import_etcd(self._env, self._tables, buckets, signing_key)
        applied = (max(imported.consistent_index, 1), term)
        with self._env.begin(write=True) as txn:
            txn.put(_APPLIED_KEY, _APPLIED.pack(*applied), db=self._meta)
        with self._env.begin() as txn:
            self.auth.publish(load_view(txn, self._tables.auth))
            self.leases.publish(*self._tables.leases.load(txn))
        self._applied = applied
        self._env.sync(True)
        return imported

    @contextlib.contextmanager
    def etcd_export(self) -> Iterator[EtcdBucketItems]:
        """This state as etcd 3.4's buckets (statemachine/etcd_export.py), from one read
        transaction held while the caller iterates them: for an etcd snapshot of this state."""
        with self._env.begin() as txn:
            raw = txn.get(_APPLIED_KEY, db=self._meta)
            yield etcd_buckets(txn, self._tables, _APPLIED.unpack(raw)[0] if raw is not None else 0)

    def copy_to(self, directory: str | os.PathLike[str]) -> tuple[int, int, bytes]:
        """Write a packed copy of the whole state (data, sessions, applied index) to
        `directory`/data.mdb from one read transaction, without stopping `apply`. Returns the
        (applied index, applied term, membership) the copy contains. For the snapshot code.

        Packed rather than LMDB's compacting copy, which drops free pages but keeps every page as
        full as it is: keys inserted into the middle of the tree split pages in half, and W6's
        million keys loaded after W1-W7's few thousand made a 97 MB snapshot of 48 MB of pages.
        Re-inserting every key in order, in append mode, fills each page (0.3 s for 1,000,000
        keys here, against 0.08 s for the compacting copy; the halved file then costs half to
        checksum, send and install)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self._env.begin() as txn:
            raw = txn.get(_APPLIED_KEY, db=self._meta)
            membership = bytes(txn.get(MEMBERSHIP_KEY, b"", db=self._meta))
            copy = lmdb.open(str(directory), map_size=self._env.info()["map_size"], subdir=True, max_dbs=len(_DB_NAMES),
                             sync=False, metasync=False, lock=False)
            try:
                for name, db in self._dbs.items():
                    dupsort = name in _DUPSORT_DB_NAMES
                    _append_all(txn, db, copy, copy.open_db(name, dupsort=dupsort), dupsort)
            finally:
                copy.close()
        index, term = _APPLIED.unpack(raw) if raw is not None else (0, 0)
        return index, term, membership


# Entries per write transaction of a packed copy: bounds the copy's dirty pages in memory.
_COPY_CHUNK = 65_536


def _append_all(source: lmdb.Transaction, source_db: lmdb._Database, copy: lmdb.Environment,
                copy_db: lmdb._Database, dupsort: bool = False) -> None:
    """Every (key, value) of source_db, in key order, appended to copy_db (which is empty). LMDB's
    append flag takes no second value of a key, so a dupsort table is copied by plain inserts."""
    with source.cursor(source_db) as cursor:
        items = cursor.iternext(keys=True, values=True)
        while True:
            with copy.begin(write=True) as txn:
                _, added = txn.cursor(copy_db).putmulti(itertools.islice(items, _COPY_CHUNK), append=not dupsort,
                                                        dupdata=dupsort)
            if added < _COPY_CHUNK:
                return
