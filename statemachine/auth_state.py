"""Users, roles and permissions, as etcd v3 keeps them (etcd server/auth/store.go): the replicated
auth state, how an AuthCommand changes it, and who may read or write which keys.

The state lives in the named database ``auth`` of the state machine's LMDB environment, beside and
never among the user's keys, so scans, exports and Get never see it while snapshots, restores,
restarts and the state hash carry it:

- ``enabled``            b"1" while auth is on (absent: off)
- ``signing_key``        the HMAC key of tokens (made by the proposer of AUTH_ENABLE)
- ``generation``         a counter (u64) that every user add and password change takes the next
                         value of, so a token names the exact password it was issued for
- ``user/<name>``        kv_pb2.StoredUser
- ``role/<name>``        kv_pb2.StoredRole

Every change comes through the log and is validated in `apply_auth` (user exists, role not found,
root user missing on enable, ...), so every replica refuses the same commands with the same
message. `AuthView` is an in-memory copy of the tables, replaced after each applied batch that
changed them; reads of it are lock free (one attribute per request while auth is off).
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import lmdb

from raftkv_proto import kv_pb2
from raftkv_proto.key_ranges import prefix_end

AUTH_DB_NAME = b"auth"
ROOT = "root"  # the root user and the root role, as etcd's

_ENABLED, _SIGNING_KEY, _GENERATION = b"enabled", b"signing_key", b"generation"
_USER, _ROLE = b"user/", b"role/"
_U64 = struct.Struct(">Q")

# etcd's messages (etcdserver/api/v3rpc/rpctypes/error.go), which etcd users recognise.
PERMISSION_DENIED = "etcdserver: permission denied"
INVALID_TOKEN = "etcdserver: invalid auth token"
AUTH_FAILED = "etcdserver: authentication failed, invalid user ID or password"
USER_EMPTY = "etcdserver: user name is empty"
ROOT_USER_MISSING = "etcdserver: root user does not exist"
ROOT_ROLE_MISSING = "etcdserver: root user does not have root role"
USER_EXISTS = "etcdserver: user name already exists"
USER_NOT_FOUND = "etcdserver: user name not found"
ROLE_EXISTS = "etcdserver: role name already exists"
ROLE_NOT_FOUND = "etcdserver: role name not found"
ROLE_NOT_GRANTED = "etcdserver: role is not granted to the user"
PERMISSION_NOT_GRANTED = "etcdserver: permission is not granted to the role"
INVALID_AUTH_MGMT = "etcdserver: invalid auth management"
ROLE_EMPTY = "etcdserver: role name is empty"

# kv.errors' kinds of the refusals above (statemachine cannot import kv; the service maps them).
KIND_PERMISSION_DENIED = "PERMISSION_DENIED"
KIND_FAILED_PRECONDITION = "FAILED_PRECONDITION"
KIND_INVALID_ARGUMENT = "INVALID_ARGUMENT"

READ, WRITE, READWRITE = kv_pb2.Permission.READ, kv_pb2.Permission.WRITE, kv_pb2.Permission.READWRITE


class AuthRefusal(Exception):
    """A command the auth state refuses: `kind` is kv.errors' kind, the message etcd's."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---- key ranges --------------------------------------------------------------------------------

# A half-open key range [start, end); end None: to the last key.
KeyRange = tuple[bytes, "bytes | None"]


def permission_range(key: bytes, range_end: bytes) -> KeyRange:
    """etcd's reading of (key, range_end): one key, [key, range_end), or from key on ("\\0")."""
    if not range_end:
        return key, key + b"\0"
    if range_end == b"\0":
        return key, None
    return key, range_end


def prefix_range(prefix: bytes) -> KeyRange:
    return prefix, prefix_end(prefix) or None


def _merged(ranges: Iterable[KeyRange]) -> list[KeyRange]:
    """The union of `ranges` as disjoint ranges in key order (etcd's mergeRangePerms)."""
    merged: list[KeyRange] = []
    for start, end in sorted(ranges, key=lambda r: r[0]):
        if merged and (merged[-1][1] is None or start <= merged[-1][1]):
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, None if last_end is None or end is None else max(last_end, end))
        else:
            merged.append((start, end))
    return merged


def _covers(ranges: Sequence[KeyRange], wanted: KeyRange) -> bool:
    start, end = wanted
    for r_start, r_end in ranges:
        if r_start <= start and (r_end is None or (end is not None and end <= r_end)):
            return True
    return False


def op_ranges(op: kv_pb2.Op) -> list[KeyRange]:
    """The key ranges a write op touches."""
    kind = op.WhichOneof("op")
    if kind == "put":
        return [permission_range(op.put.key, b"")]
    if kind == "delete":
        return [permission_range(op.delete, b"")]
    if kind == "delete_prefix":
        return [prefix_range(op.delete_prefix)]
    if kind == "move_prefix":
        return [prefix_range(op.move_prefix.source), prefix_range(op.move_prefix.target)]
    return [(b"", None)]  # an op kind this code does not know: only whoever may write everything


# ---- the in-memory view --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class UserRights:
    """What one user may touch, merged over its roles."""

    root: bool
    read: list[KeyRange]
    write: list[KeyRange]


@dataclass(frozen=True, slots=True)
class AuthView:
    """The auth state as of one applied index; never changed (a change makes a new one)."""

    enabled: bool = False
    signing_key: bytes = b""
    generation: int = 0
    users: dict[str, kv_pb2.StoredUser] = field(default_factory=dict)
    roles: dict[str, kv_pb2.StoredRole] = field(default_factory=dict)
    _rights: dict[str, UserRights] = field(default_factory=dict)  # filled on first use per user

    def rights(self, user: str) -> UserRights | None:
        """The merged rights of `user`; None for a user that does not exist."""
        rights = self._rights.get(user)
        if rights is None:
            stored = self.users.get(user)
            if stored is None:
                return None
            rights = self._rights[user] = self._merge(stored)
        return rights

    def _merge(self, user: kv_pb2.StoredUser) -> UserRights:
        read: list[KeyRange] = []
        write: list[KeyRange] = []
        for name in user.roles:
            role = self.roles.get(name)
            for perm in role.permissions if role is not None else ():
                span = permission_range(perm.key, perm.range_end)
                if perm.perm_type in (READ, READWRITE):
                    read.append(span)
                if perm.perm_type in (WRITE, READWRITE):
                    write.append(span)
        return UserRights(ROOT in user.roles, _merged(read), _merged(write))

    def is_root(self, user: str) -> bool:
        rights = self.rights(user)
        return rights is not None and rights.root

    def may_read(self, user: str, span: KeyRange) -> bool:
        rights = self.rights(user)
        return rights is not None and (rights.root or _covers(rights.read, span))

    def may_write(self, user: str, spans: Iterable[KeyRange]) -> bool:
        rights = self.rights(user)
        if rights is None:
            return False
        return rights.root or all(_covers(rights.write, span) for span in spans)

    def spans_refusal(self, user: str, reads: Iterable[tuple[bytes, bytes]],
                      writes: Iterable[tuple[bytes, bytes]]) -> AuthRefusal | None:
        """Why `user` may not read and write these (key, range_end) pairs now (an etcd
        transaction's: statemachine/etcd_txn.txn_spans); None when it may."""
        if not user:
            return AuthRefusal(KIND_PERMISSION_DENIED, USER_EMPTY)
        if not all(self.may_read(user, permission_range(*span)) for span in reads) or \
                not self.may_write(user, (permission_range(*span) for span in writes)):
            return AuthRefusal(KIND_PERMISSION_DENIED, PERMISSION_DENIED)
        return None

    def write_refusal(self, user: str, ops: Sequence[kv_pb2.Op]) -> AuthRefusal | None:
        """Why `user` may not apply `ops` now; None when it may."""
        if not user:
            return AuthRefusal(KIND_PERMISSION_DENIED, USER_EMPTY)
        if not self.may_write(user, (span for op in ops for span in op_ranges(op))):
            return AuthRefusal(KIND_PERMISSION_DENIED, PERMISSION_DENIED)
        return None


class AuthHolder:
    """Where the state machine publishes its AuthView, shared with the client service: the node's
    state machine is reopened after a snapshot install, the holder stays. `enabled` is what every
    request tests, so it is a plain attribute."""

    __slots__ = ("view", "enabled")

    def __init__(self) -> None:
        self.view = AuthView()
        self.enabled = False

    def publish(self, view: AuthView) -> None:
        self.view = view
        self.enabled = view.enabled


# ---- the tables ----------------------------------------------------------------------------------

def load_view(txn: lmdb.Transaction, db: lmdb._Database) -> AuthView:
    """The auth tables as `txn` sees them."""
    users: dict[str, kv_pb2.StoredUser] = {}
    roles: dict[str, kv_pb2.StoredRole] = {}
    cursor = txn.cursor(db=db)
    for key, value in cursor.iternext():
        if key.startswith(_USER):
            user = kv_pb2.StoredUser.FromString(value)
            users[user.name] = user
        elif key.startswith(_ROLE):
            role = kv_pb2.StoredRole.FromString(value)
            roles[role.name] = role
    raw_generation = txn.get(_GENERATION, db=db)
    return AuthView(enabled=txn.get(_ENABLED, db=db) == b"1", signing_key=txn.get(_SIGNING_KEY, db=db) or b"",
                    generation=_U64.unpack(raw_generation)[0] if raw_generation else 0, users=users, roles=roles)


def apply_auth(txn: lmdb.Transaction, db: lmdb._Database, view: AuthView, command: kv_pb2.AuthCommand) -> AuthView:
    """Apply one auth change in `txn`; the view after it. Raises AuthRefusal, changing nothing,
    for a change the state does not allow (the same on every replica)."""
    change = _CHANGES.get(command.action)
    if change is None:
        raise AuthRefusal(KIND_INVALID_ARGUMENT, f"auth action {command.action} is not a change")
    change(_Tables(txn, db, view), command)
    return load_view(txn, db)


@dataclass(slots=True)
class _Tables:
    txn: lmdb.Transaction
    db: lmdb._Database
    view: AuthView

    def user(self, name: str) -> kv_pb2.StoredUser:
        # etcd: only an add asks whether a name is empty; any other change finds no such user.
        user = self.view.users.get(name)
        if user is None:
            raise AuthRefusal(KIND_FAILED_PRECONDITION, USER_NOT_FOUND)
        copy = kv_pb2.StoredUser()
        copy.CopyFrom(user)
        return copy

    def role(self, name: str) -> kv_pb2.StoredRole:
        role = self.view.roles.get(name)
        if role is None:
            raise AuthRefusal(KIND_FAILED_PRECONDITION, ROLE_NOT_FOUND)
        copy = kv_pb2.StoredRole()
        copy.CopyFrom(role)
        return copy

    def next_generation(self) -> int:
        generation = self.view.generation + 1
        self.txn.put(_GENERATION, _U64.pack(generation), db=self.db)
        return generation

    def save_user(self, user: kv_pb2.StoredUser) -> None:
        self.txn.put(_USER + user.name.encode(), user.SerializeToString(deterministic=True), db=self.db)

    def save_role(self, role: kv_pb2.StoredRole) -> None:
        self.txn.put(_ROLE + role.name.encode(), role.SerializeToString(deterministic=True), db=self.db)


def _enable(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    if tables.view.enabled:
        return  # etcd: enabling twice is fine
    root = tables.view.users.get(ROOT)
    if root is None:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, ROOT_USER_MISSING)
    if ROOT not in root.roles:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, ROOT_ROLE_MISSING)
    if len(command.signing_key) < 16:
        raise AuthRefusal(KIND_INVALID_ARGUMENT, "auth enable carries no token signing key")
    tables.txn.put(_ENABLED, b"1", db=tables.db)
    tables.txn.put(_SIGNING_KEY, command.signing_key, db=tables.db)


def _disable(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    tables.txn.delete(_ENABLED, db=tables.db)


def _user_add(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    if not command.user:
        raise AuthRefusal(KIND_INVALID_ARGUMENT, USER_EMPTY)
    if command.user in tables.view.users:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, USER_EXISTS)
    tables.save_user(kv_pb2.StoredUser(name=command.user, salt=command.salt, password_hash=command.password_hash,
                                       generation=tables.next_generation()))


def _user_delete(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    if tables.view.enabled and command.user == ROOT:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, INVALID_AUTH_MGMT)
    tables.user(command.user)
    tables.txn.delete(_USER + command.user.encode(), db=tables.db)


def _user_change_password(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    user = tables.user(command.user)
    user.salt, user.password_hash, user.generation = command.salt, command.password_hash, tables.next_generation()
    tables.save_user(user)


def _user_grant_role(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    user = tables.user(command.user)
    if command.role != ROOT:  # etcd: the root role exists implicitly for granting
        tables.role(command.role)
    if command.role not in user.roles:
        roles = sorted([*user.roles, command.role])
        del user.roles[:]
        user.roles.extend(roles)
        tables.save_user(user)


def _user_revoke_role(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    if tables.view.enabled and command.user == ROOT and command.role == ROOT:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, INVALID_AUTH_MGMT)
    user = tables.user(command.user)
    if command.role not in user.roles:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, ROLE_NOT_GRANTED)
    user.roles.remove(command.role)
    tables.save_user(user)


def _role_add(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    if not command.role:
        raise AuthRefusal(KIND_INVALID_ARGUMENT, ROLE_EMPTY)
    if command.role in tables.view.roles:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, ROLE_EXISTS)
    tables.save_role(kv_pb2.StoredRole(name=command.role))


def _role_delete(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    # As etcd, before the role is looked up: the root role need not exist (granting it does not
    # need it), and deleting it is refused alike while auth is on.
    if tables.view.enabled and command.role == ROOT:
        raise AuthRefusal(KIND_FAILED_PRECONDITION, INVALID_AUTH_MGMT)
    tables.role(command.role)
    tables.txn.delete(_ROLE + command.role.encode(), db=tables.db)
    for user in tables.view.users.values():  # etcd revokes a deleted role from every user
        if command.role in user.roles:
            changed = kv_pb2.StoredUser()
            changed.CopyFrom(user)
            changed.roles.remove(command.role)
            tables.save_user(changed)


def _role_grant_permission(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    role = tables.role(command.role)
    wanted = command.permission
    for perm in role.permissions:
        if perm.key == wanted.key and perm.range_end == wanted.range_end:
            perm.perm_type = wanted.perm_type  # etcd: a grant on the same range replaces its type
            break
    else:
        role.permissions.append(wanted)
        # etcd's order: by key alone, a new range after those of its key (RoleGet lists them so).
        ordered = sorted(role.permissions, key=lambda p: p.key)
        del role.permissions[:]
        role.permissions.extend(ordered)
    tables.save_role(role)


def _role_revoke_permission(tables: _Tables, command: kv_pb2.AuthCommand) -> None:
    role = tables.role(command.role)
    wanted = command.permission
    kept = [p for p in role.permissions if (p.key, p.range_end) != (wanted.key, wanted.range_end)]
    if len(kept) == len(role.permissions):
        raise AuthRefusal(KIND_FAILED_PRECONDITION, PERMISSION_NOT_GRANTED)
    del role.permissions[:]
    role.permissions.extend(kept)
    tables.save_role(role)


A = kv_pb2
_CHANGES = {
    A.AUTH_ENABLE: _enable,
    A.AUTH_DISABLE: _disable,
    A.USER_ADD: _user_add,
    A.USER_DELETE: _user_delete,
    A.USER_CHANGE_PASSWORD: _user_change_password,
    A.USER_GRANT_ROLE: _user_grant_role,
    A.USER_REVOKE_ROLE: _user_revoke_role,
    A.ROLE_ADD: _role_add,
    A.ROLE_DELETE: _role_delete,
    A.ROLE_GRANT_PERMISSION: _role_grant_permission,
    A.ROLE_REVOKE_PERMISSION: _role_revoke_permission,
}
CHANGE_ACTIONS = frozenset(_CHANGES)
