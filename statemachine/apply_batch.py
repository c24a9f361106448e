"""The one apply path: what a committed entry does to the state, whichever face proposed it.

Every replica runs this on the same entries in the same order and must reach the same state and
the same answers, so nothing here reads a clock or the node's configuration. A command that cannot
be applied - malformed bytes, an unknown kind, a key LMDB cannot store, anything that raises while
it is applied - never stops the member: `ApplyBatch.apply_entry` raises `EntryNotApplied`, the
state machine rolls the batch back and applies that entry as a refusal that changes nothing but the
applied index (KVStateMachine.apply). Only the storage itself (a full map or disk, an I/O error, a
damaged page) stops an apply.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import lmdb
from google.protobuf.message import DecodeError

from raft.core import Entry, EntryType
from raftkv_proto import etcd_rpc_pb2, kv_pb2
from raftkv_proto.key_ranges import prefix_end
from statemachine.alarms import CORRUPT_CLUSTER, Alarm, AlarmHolder, apply_alarm, refuses_writes
from statemachine.auth_state import PERMISSION_DENIED, AuthHolder, AuthRefusal, AuthView, apply_auth
from statemachine.client_sessions import ClientSessions, SessionLimits, SessionTables, Verdict, owner
from statemachine.commands import decode_command
from statemachine.errors import ApplyOrderError, CorruptStateError, InvalidCommandError, StateFullError
from statemachine.etcd_txn import EtcdRefusal, apply_txn, refusal_of, txn_leases, txn_spans
from statemachine.leases import LEASE_EXISTS, LEASE_NOT_FOUND, LeaseHolder, LeaseTables
from statemachine.mvcc import MvccTables, RevisionWriter

log = logging.getLogger(__name__)

# The configuration of the last CONFIG entry applied (raft/core/membership.py's encoding), in the
# meta table: the members a node restarts with, and a snapshot carries.
MEMBERSHIP_KEY = b"membership"


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What applying one NORMAL entry did, for the client service waiting on that index.

    - ``duplicate``: the (client_id, seq) was applied before; ``result`` is the recorded one and
      nothing changed this time.
    - ``expired``: the seq is older than the client's session window; nothing changed and the
      original result is unknown. The service should fail the request (not retryable).
    - ``unknown_session``: the header's client id names no live client session (never
      registered, expired, or a wrong secret); nothing changed. The client must register again.
    - ``error``: the entry could not be applied (malformed, or it failed while applied); nothing
      changed. Every replica produces the same outcome for the same entry.
    """

    index: int
    result: kv_pb2.CommandResult
    duplicate: bool = False
    expired: bool = False
    unknown_session: bool = False
    other_user: bool = False  # the session belongs to another user (auth on); nothing changed
    error: str | None = None
    state_check: bool = False  # a check marker: the state as of it is pinned (take_state_checks)

    @property
    def ok(self) -> bool:
        """True when ``result`` describes a write that took effect (now or, for a duplicate, before)."""
        return self.error is None and not self.expired and not self.unknown_session and not self.other_user


def not_applied(entry: Entry, reason: str) -> ApplyOutcome:
    """The outcome of an entry applied as a refusal: nothing but the applied index moved."""
    return ApplyOutcome(entry.index, kv_pb2.CommandResult(), error=reason)


class EntryNotApplied(Exception):
    """Applying `entry` raised `cause`: the batch's transaction must be rolled back (part of the
    entry may be written) and the entry applied as a refusal (`not_applied`)."""

    def __init__(self, entry: Entry, cause: BaseException) -> None:
        super().__init__(f"entry {entry.index} (term {entry.term}) could not be applied: "
                         f"{type(cause).__name__}: {cause}")
        self.entry = entry
        self.reason = f"{type(cause).__name__}: {cause}"


def is_storage_failure(exc: BaseException) -> bool:
    """Whether `exc` is the storage's own failure (it stops the apply) rather than the entry's.
    MDB_BAD_VALSIZE is LMDB refusing a key or value of the entry: the entry's."""
    if isinstance(exc, lmdb.BadValsizeError):
        return False
    return isinstance(exc, (lmdb.Error, StateFullError, CorruptStateError, ApplyOrderError, MemoryError, OSError))


@dataclass(frozen=True, slots=True)
class StateTables:
    """The named databases an apply writes (statemachine/kv_state.py's module docstring)."""

    meta: lmdb._Database
    mvcc: MvccTables
    sessions: SessionTables
    session_limits: SessionLimits
    auth: lmdb._Database
    alarms: lmdb._Database
    leases: LeaseTables


@dataclass(frozen=True, slots=True)
class Holders:
    """What the state publishes to the node once a batch commits: the auth view, the raised
    alarms and the leases' TTLs."""

    auth: AuthHolder
    alarms: AlarmHolder
    leases: LeaseHolder


class ApplyBatch:
    """The work of one apply transaction: `apply_entry` for each entry in order."""

    def __init__(self, txn: lmdb.Transaction, tables: StateTables, holders: Holders) -> None:
        self.txn = txn
        self.tables = tables
        self.mvcc = RevisionWriter(txn, tables.mvcc)
        self.sessions = ClientSessions(txn, tables.sessions, tables.session_limits)
        self.auth: AuthView = holders.auth.view  # replaced by every auth change of the batch
        self.alarms: frozenset[Alarm] = holders.alarms.alarms  # likewise for alarm changes
        self._published_ttls = holders.leases.ttls
        self._published_remaining = holders.leases.remaining
        # The leases after this batch: a new dict once a lease is granted or revoked (or
        # checkpointed), published when the batch commits (the table is not read again: 10,000
        # leases take milliseconds).
        self.lease_ttls: dict[int, int] = holders.leases.ttls
        self.lease_remaining: dict[int, int] = holders.leases.remaining

    def apply_entry(self, entry: Entry) -> ApplyOutcome | None:
        """Apply one entry; None for a NOOP or CONFIG entry. Raises EntryNotApplied when applying
        it raised anything but a storage failure."""
        try:
            return self._apply(entry)
        except Exception as exc:
            if is_storage_failure(exc):
                raise
            raise EntryNotApplied(entry, exc) from exc

    def _apply(self, entry: Entry) -> ApplyOutcome | None:
        if entry.type != EntryType.NORMAL:
            if entry.type == EntryType.CONFIG:
                self.txn.put(MEMBERSHIP_KEY, entry.payload, db=self.tables.meta)
            return None
        try:
            command = decode_command(entry.payload)
        except InvalidCommandError as exc:
            # Deterministic on every replica: same bytes, same verdict. Never crash the node.
            log.error("entry %d (term %d) has a malformed command, applied as a no-op: %s",
                      entry.index, entry.term, exc)
            return not_applied(entry, str(exc))
        if command.check_state:
            return ApplyOutcome(entry.index, kv_pb2.CommandResult(), state_check=True)
        if command.HasField("registration"):
            user = command.registration.user
            self.sessions.register(entry.index, command.registration.secret, self._owner(user) if user else "")
            return ApplyOutcome(entry.index, kv_pb2.CommandResult())
        if command.HasField("auth"):
            return ApplyOutcome(entry.index, self._apply_auth(command.auth))
        if command.HasField("alarm"):
            self.alarms = apply_alarm(self.txn, self.tables.alarms, self.alarms, command.alarm)
            return ApplyOutcome(entry.index, kv_pb2.CommandResult())
        if refuses_writes(self.alarms) and _writes(command):
            return ApplyOutcome(entry.index, kv_pb2.CommandResult(refusal_kind="CORRUPT", refusal=CORRUPT_CLUSTER,
                                                                  revision=self.mvcc.revision))
        # While auth is on, a write's session must be its user's; otherwise users are not checked.
        user = command.user if self.auth.enabled else None
        if command.compact:
            return ApplyOutcome(entry.index, self._compact(user, command.compact))
        if command.HasField("lease"):
            return ApplyOutcome(entry.index, self._apply_lease(command.lease, user))
        if command.HasField("etcd_txn"):
            write = functools.partial(self._apply_etcd_txn, user, command.etcd_txn.request)
        else:
            write = functools.partial(self._apply_checked, user, command.ops)
        if not command.header.client_id:
            return ApplyOutcome(entry.index, write())
        return self._apply_tracked(entry.index, command.header.client_id, command.header.seq, write, user)

    def _owner(self, user: str) -> str:
        """Whom `user`'s sessions belong to as of this entry: its name and generation."""
        stored = self.auth.users.get(user)
        return owner(user, stored.generation if stored is not None else 0)

    def _apply_tracked(self, index: int, client_id: str, seq: int, write: Callable[[], kv_pb2.CommandResult],
                       user: str | None) -> ApplyOutcome:
        check = self.sessions.check(client_id, seq, index, None if user is None else self._owner(user))
        if check.verdict is Verdict.APPLY:
            result = write()
            self.sessions.record(check, result)
            return ApplyOutcome(index, result)
        if check.verdict is Verdict.DUPLICATE:
            assert check.recorded is not None
            return ApplyOutcome(index, check.recorded, duplicate=True)
        return ApplyOutcome(index, kv_pb2.CommandResult(), expired=check.verdict is Verdict.EXPIRED,
                            unknown_session=check.verdict is Verdict.UNKNOWN_SESSION,
                            other_user=check.verdict is Verdict.OTHER_USER)

    def _apply_auth(self, command: kv_pb2.AuthCommand) -> kv_pb2.CommandResult:
        try:
            self.auth = apply_auth(self.txn, self.tables.auth, self.auth, command)
        except AuthRefusal as refusal:
            return kv_pb2.CommandResult(refusal_kind=refusal.kind, refusal=str(refusal))
        return kv_pb2.CommandResult()

    def _apply_etcd_txn(self, user: str | None, payload: bytes) -> kv_pb2.CommandResult:
        """Apply an etcd transaction if `user` may (None: auth is off); its response in the result."""
        request = etcd_rpc_pb2.TxnRequest()
        try:
            request.ParseFromString(payload)
        except DecodeError as exc:  # deterministic on every replica, as a malformed command
            return kv_pb2.CommandResult(refusal_kind="INVALID_ARGUMENT", refusal=f"malformed etcd transaction: {exc}",
                                        revision=self.mvcc.revision)
        if user is not None:
            reads, writes = txn_spans(request)
            writes += self._lease_spans(txn_leases(request))
            refusal = self.auth.spans_refusal(user, reads, writes)
            if refusal is not None:
                return kv_pb2.CommandResult(refusal_kind=refusal.kind, refusal=str(refusal), revision=self.mvcc.revision)
        self.mvcc.begin()
        try:
            response = apply_txn(self.txn, self.mvcc.tables, self.mvcc, request)
        except EtcdRefusal as refusal:  # refused before anything changed
            return kv_pb2.CommandResult(refusal_kind=refusal.kind, refusal=str(refusal), revision=self.mvcc.end())
        return kv_pb2.CommandResult(revision=self.mvcc.end(), etcd_txn_response=response.SerializeToString())

    def _lease_spans(self, leases: set[int]) -> list[tuple[bytes, bytes]]:
        """The keys attached to `leases`, as (key, range_end) pairs of single keys."""
        return [(key, b"") for lease in sorted(leases) for key in self.tables.leases.attached(self.txn, lease)]

    def _apply_lease(self, command: kv_pb2.LeaseCommand, user: str | None) -> kv_pb2.CommandResult:
        """Grant a lease, or revoke one and delete its keys in one revision (etcd's Grant, Revoke),
        or record the leader's checkpoint of remaining TTLs (no revision: no key changes). A revoke
        made as `user` (auth on) needs write permission on every key attached, as etcd's; the
        leader's revoke of an expired lease names no user and needs none."""
        leases = self.tables.leases
        if command.checkpoints:
            for checkpoint in command.checkpoints:
                if leases.checkpoint(self.txn, checkpoint.id, checkpoint.remaining_ttl):
                    remaining = self._changed_remaining()
                    if checkpoint.remaining_ttl > 0:
                        remaining[checkpoint.id] = checkpoint.remaining_ttl
                    else:
                        remaining.pop(checkpoint.id, None)
            return kv_pb2.CommandResult(revision=self.mvcc.revision)
        if command.grant_id:
            if leases.exists(self.txn, command.grant_id):
                return kv_pb2.CommandResult(refusal_kind="FAILED_PRECONDITION", refusal=LEASE_EXISTS,
                                            revision=self.mvcc.revision)
            leases.grant(self.txn, command.grant_id, command.ttl)
            self._changed_leases()[command.grant_id] = command.ttl
            return kv_pb2.CommandResult(revision=self.mvcc.revision, lease_id=command.grant_id, lease_ttl=command.ttl)
        if not leases.exists(self.txn, command.revoke_id):
            return kv_pb2.CommandResult(refusal_kind="NOT_FOUND", refusal=LEASE_NOT_FOUND, revision=self.mvcc.revision)
        if user:
            refusal = self.auth.spans_refusal(user, (), self._lease_spans({command.revoke_id}))
            if refusal is not None:
                return kv_pb2.CommandResult(refusal_kind=refusal.kind, refusal=str(refusal), revision=self.mvcc.revision)
        self.mvcc.begin()
        for key in leases.revoke(self.txn, command.revoke_id):
            self.mvcc.delete(key)
        self._changed_leases().pop(command.revoke_id, None)
        if command.revoke_id in self.lease_remaining:
            self._changed_remaining().pop(command.revoke_id)
        return kv_pb2.CommandResult(revision=self.mvcc.end())

    def _changed_leases(self) -> dict[int, int]:
        """This batch's own copy of the leases, to change (readers keep the published one)."""
        if self.lease_ttls is self._published_ttls:
            self.lease_ttls = dict(self.lease_ttls)
        return self.lease_ttls

    def _changed_remaining(self) -> dict[int, int]:
        """Likewise for the checkpointed remaining TTLs."""
        if self.lease_remaining is self._published_remaining:
            self.lease_remaining = dict(self.lease_remaining)
        return self.lease_remaining

    def _compact(self, user: str | None, revision: int) -> kv_pb2.CommandResult:
        """etcd's Compact (root only while auth is on, as etcd)."""
        if user is not None and not self.auth.is_root(user):
            return kv_pb2.CommandResult(refusal_kind="PERMISSION_DENIED", refusal=PERMISSION_DENIED,
                                        revision=self.mvcc.revision)
        try:
            self.mvcc.compact(revision)
        except LookupError as exc:
            refusal = refusal_of(exc)
            return kv_pb2.CommandResult(refusal_kind=refusal.kind, refusal=str(refusal), revision=self.mvcc.revision)
        return kv_pb2.CommandResult(revision=self.mvcc.revision)

    def _apply_checked(self, user: str | None, ops: Sequence[kv_pb2.Op]) -> kv_pb2.CommandResult:
        """Apply `ops` if `user` may write them as of this entry (None: auth is off)."""
        if user is not None:
            refusal = self.auth.write_refusal(user, ops)
            if refusal is not None:
                return kv_pb2.CommandResult(refusal_kind=refusal.kind, refusal=str(refusal))
        return self._apply_ops(ops)

    def _apply_ops(self, ops: Sequence[kv_pb2.Op]) -> kv_pb2.CommandResult:
        """Apply a native write: all its changes share one revision (none when nothing changed)."""
        existed: list[bool] = []
        mvcc = self.mvcc
        mvcc.begin()
        for op in ops:
            if op.HasField("put"):
                existed.append(mvcc.put(op.put.key, op.put.value))
            elif op.HasField("delete_prefix"):
                existed.append(bool(mvcc.delete_range(op.delete_prefix, prefix_end(op.delete_prefix) or None)))
            elif op.HasField("move_prefix"):
                existed.append(self._move_prefix(op.move_prefix.source, op.move_prefix.target))
            else:
                existed.append(mvcc.delete(op.delete) is not None)
        return kv_pb2.CommandResult(existed=existed, revision=mvcc.end())

    def _move_prefix(self, source: bytes, target: bytes) -> bool:
        """Rename every key under `source` to `target` + rest, overwriting; True when one moved.
        Every key under `source` is deleted before any is written again, so a renamed key that
        falls under `source` once more (target a prefix of source) is not moved twice.
        commands.validate_prefix_op keeps renamed keys within the key limit."""
        moved = self.mvcc.delete_range(source, prefix_end(source) or None)
        for old in moved:
            self.mvcc.put(target + old.key[len(source):], old.value)
        return bool(moved)


def _writes(command: kv_pb2.Command) -> bool:
    """Whether `command` writes what a CORRUPT alarm freezes: keys, the history, leases (not a
    lease checkpoint, which only the leader's bookkeeping sends)."""
    if command.HasField("lease"):
        return not command.lease.checkpoints
    return bool(command.ops) or command.HasField("etcd_txn") or bool(command.compact)
