"""Users, roles and permissions in the state machine (statemachine/auth_state.py): changes through
apply with etcd's refusals, checks of writes at apply, sessions bound to users, and the auth
tables in copies, reopens and the state hash but never among the user's keys."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raft.core import Entry, EntryType
from raftkv_proto import kv_pb2
from raftkv_proto import etcd_rpc_pb2 as etcd_pb
from statemachine.auth_state import (
    INVALID_AUTH_MGMT,
    PERMISSION_DENIED,
    ROLE_NOT_FOUND,
    ROOT_ROLE_MISSING,
    ROOT_USER_MISSING,
    USER_EMPTY,
    USER_EXISTS,
    USER_NOT_FOUND,
    AuthHolder,
    AuthView,
)
from statemachine.commands import (
    encode_auth,
    encode_command,
    encode_etcd_txn,
    encode_lease_grant,
    encode_lease_revoke,
    encode_registration,
    put_op,
    session_id,
)
from statemachine.etcd_txn import txn_leases, txn_spans
from statemachine.apply_batch import ApplyOutcome
from statemachine.kv_state import KVStateMachine

A = kv_pb2
KEY = b"k" * 32


class Log:
    def __init__(self, machine: KVStateMachine) -> None:
        self.machine = machine
        self.index = machine.applied_index

    def apply(self, payload: bytes) -> ApplyOutcome:
        self.index += 1
        outcome = self.machine.apply([Entry(self.index, 1, EntryType.NORMAL, payload)])[0]
        assert outcome is not None
        return outcome

    def auth(self, action: int, **fields: object) -> kv_pb2.CommandResult:
        if action == A.AUTH_ENABLE:
            fields.setdefault("signing_key", KEY)
        return self.apply(encode_auth(kv_pb2.AuthCommand(action=action, **fields))).result


@pytest.fixture
def sm(tmp_path: Path) -> Iterator[KVStateMachine]:
    machine = KVStateMachine(tmp_path / "state", map_size=64 << 20)
    yield machine
    machine.close()


def perm(kind: int, key: bytes, range_end: bytes = b"") -> kv_pb2.Permission:
    return kv_pb2.Permission(perm_type=kind, key=key, range_end=range_end)


def setup_users(log: Log) -> None:
    """root (root role), alice reading app/ (prefix), bob reading and writing app/."""
    for name in ("root", "alice", "bob"):
        assert not log.auth(A.USER_ADD, user=name, salt=b"s" * 16, password_hash=b"h" * 32).refusal
    log.auth(A.USER_GRANT_ROLE, user="root", role="root")
    for role, kind in (("reader", kv_pb2.Permission.READ), ("writer", kv_pb2.Permission.READWRITE)):
        log.auth(A.ROLE_ADD, role=role)
        log.auth(A.ROLE_GRANT_PERMISSION, role=role, permission=perm(kind, b"app/", b"app0"))
    log.auth(A.USER_GRANT_ROLE, user="alice", role="reader")
    log.auth(A.USER_GRANT_ROLE, user="bob", role="writer")


def test_enable_needs_a_root_user_with_the_root_role(sm: KVStateMachine) -> None:
    log = Log(sm)
    assert log.auth(A.AUTH_ENABLE).refusal == ROOT_USER_MISSING
    log.auth(A.USER_ADD, user="root", salt=b"s" * 16, password_hash=b"h" * 32)
    assert log.auth(A.AUTH_ENABLE).refusal == ROOT_ROLE_MISSING
    log.auth(A.USER_GRANT_ROLE, user="root", role="root")
    result = log.auth(A.AUTH_ENABLE)
    assert not result.refusal and sm.auth.enabled and sm.auth.view.signing_key == KEY


def test_etcds_refusals_change_nothing(sm: KVStateMachine) -> None:
    log = Log(sm)
    setup_users(log)
    before = sm.state_hash()
    result = log.auth(A.USER_ADD, user="alice", salt=b"x" * 16, password_hash=b"y" * 32)
    assert (result.refusal_kind, result.refusal) == ("FAILED_PRECONDITION", USER_EXISTS)
    assert log.auth(A.USER_GRANT_ROLE, user="alice", role="nope").refusal == ROLE_NOT_FOUND
    assert log.auth(A.USER_ADD, user="").refusal == USER_EMPTY
    assert sm.state_hash() == before
    log.auth(A.AUTH_ENABLE)
    assert log.auth(A.USER_DELETE, user="root").refusal == INVALID_AUTH_MGMT
    assert log.auth(A.USER_REVOKE_ROLE, user="root", role="root").refusal == INVALID_AUTH_MGMT


def test_permissions_of_keys_ranges_and_prefixes() -> None:
    view = AuthView(users={"u": kv_pb2.StoredUser(name="u", roles=["r"])}, roles={"r": kv_pb2.StoredRole(
        name="r", permissions=[perm(kv_pb2.Permission.READ, b"one"), perm(kv_pb2.Permission.READ, b"a", b"c"),
                               perm(kv_pb2.Permission.READWRITE, b"c", b"d"), perm(kv_pb2.Permission.WRITE, b"z", b"\0")])})
    assert view.may_read("u", (b"one", b"one\0")) and not view.may_read("u", (b"one", b"onf"))
    assert view.may_read("u", (b"a", b"d"))  # two adjacent ranges merged
    assert not view.may_read("u", (b"a", b"e"))
    assert view.may_write("u", [(b"zebra", b"zebra\0"), (b"c1", b"c1\0")])
    assert not view.may_write("u", [(b"b", b"b\0")])
    assert not view.may_read("nobody", (b"a", b"b"))


def test_writes_are_checked_again_at_apply(sm: KVStateMachine) -> None:
    log = Log(sm)
    setup_users(log)
    log.auth(A.AUTH_ENABLE)
    assert not log.apply(encode_command([put_op(b"app/1", b"v")], user="bob")).result.refusal
    denied = log.apply(encode_command([put_op(b"app/2", b"v")], user="alice")).result
    assert (denied.refusal_kind, denied.refusal) == ("PERMISSION_DENIED", PERMISSION_DENIED)
    assert log.apply(encode_command([put_op(b"other", b"v")], user="bob")).result.refusal == PERMISSION_DENIED
    assert log.apply(encode_command([put_op(b"app/3", b"v")])).result.refusal == USER_EMPTY
    # Revoked between the check on the proposer and the commit: the apply refuses it.
    log.auth(A.ROLE_REVOKE_PERMISSION, role="writer", permission=perm(0, b"app/", b"app0"))
    assert log.apply(encode_command([put_op(b"app/4", b"v")], user="bob")).result.refusal == PERMISSION_DENIED
    assert [sm.get(b"app/%d" % i) for i in range(1, 5)] == [b"v", None, None, None]
    assert sm.get(b"other") is None


def test_a_session_belongs_to_the_user_that_registered_it(sm: KVStateMachine) -> None:
    log = Log(sm)
    setup_users(log)
    log.auth(A.AUTH_ENABLE)
    unbound = session_id(log.index + 1, b"u" * 16)
    log.apply(encode_registration(b"u" * 16))  # as if registered while auth was off
    bobs = session_id(log.index + 1, b"b" * 16)
    log.apply(encode_registration(b"b" * 16, "bob"))
    root_on_bobs = log.apply(encode_command([put_op(b"app/1", b"v")], bobs, 1, user="root"))
    assert root_on_bobs.other_user and not root_on_bobs.ok and sm.get(b"app/1") is None
    assert log.apply(encode_command([put_op(b"app/1", b"v")], unbound, 1, user="bob")).unknown_session
    assert log.apply(encode_command([put_op(b"app/1", b"v")], bobs, 1, user="bob")).ok
    assert sm.get(b"app/1") == b"v"


def test_auth_data_is_never_a_user_key_but_in_copies_reopens_and_the_hash(tmp_path: Path) -> None:
    machine = KVStateMachine(tmp_path / "state", map_size=64 << 20)
    log = Log(machine)
    setup_users(log)
    log.auth(A.AUTH_ENABLE)
    log.apply(encode_command([put_op(b"app/1", b"v")], user="bob"))
    assert machine.scan(b"", None, 100)[0] == [(b"app/1", b"v")] and machine.count() == 1
    hash_with_auth = machine.state_hash()
    machine.copy_to(tmp_path / "copy")
    machine.close()
    for directory in ("state", "copy"):
        holder = AuthHolder()
        reopened = KVStateMachine(tmp_path / directory, map_size=64 << 20, auth=holder)
        assert holder.enabled and set(holder.view.users) == {"root", "alice", "bob"}
        assert holder.view.may_read("alice", (b"app/x", b"app/x\0"))
        assert reopened.state_hash() == hash_with_auth
        reopened.close()


def test_the_state_hash_tells_different_auth_states_apart(tmp_path: Path) -> None:
    one, two = (KVStateMachine(tmp_path / name, map_size=64 << 20) for name in ("one", "two"))
    Log(one).auth(A.ROLE_ADD, role="a")
    Log(two).auth(A.ROLE_ADD, role="b")
    assert one.state_hash() != two.state_hash()
    one.close()
    two.close()


def test_a_users_sessions_end_with_it(sm: KVStateMachine) -> None:
    """A user deleted and added again under its name, or given another password, owns none of its
    earlier client sessions: a write on one is UNKNOWN_SESSION (its client registers again), so
    the new holder of the name inherits nothing of the old one's."""
    log = Log(sm)
    setup_users(log)
    log.auth(A.AUTH_ENABLE)
    bobs = session_id(log.index + 1, b"b" * 16)
    log.apply(encode_registration(b"b" * 16, "bob"))
    assert log.apply(encode_command([put_op(b"app/1", b"v")], bobs, 1, user="bob")).ok
    log.auth(A.USER_DELETE, user="bob")
    log.auth(A.USER_ADD, user="bob", salt=b"t" * 16, password_hash=b"i" * 32)
    log.auth(A.USER_GRANT_ROLE, user="bob", role="writer")
    assert log.apply(encode_command([put_op(b"app/2", b"v")], bobs, 2, user="bob")).unknown_session
    again = session_id(log.index + 1, b"c" * 16)
    log.apply(encode_registration(b"c" * 16, "bob"))
    assert log.apply(encode_command([put_op(b"app/2", b"v")], again, 1, user="bob")).ok
    log.auth(A.USER_CHANGE_PASSWORD, user="bob", salt=b"u" * 16, password_hash=b"j" * 32)
    assert log.apply(encode_command([put_op(b"app/3", b"v")], again, 2, user="bob")).unknown_session
    assert sm.get(b"app/2") == b"v" and sm.get(b"app/3") is None


def test_only_an_add_asks_for_a_name_and_root_is_guarded_before_any_lookup(sm: KVStateMachine) -> None:
    """As etcd's auth store: a change naming the empty user or role finds none, and deleting the
    root role while auth is on is invalid auth management even when no such role was made."""
    log = Log(sm)
    setup_users(log)
    assert log.auth(A.USER_DELETE, user="").refusal == USER_NOT_FOUND
    assert log.auth(A.USER_CHANGE_PASSWORD, user="", salt=b"s" * 16, password_hash=b"h" * 32).refusal == USER_NOT_FOUND
    assert log.auth(A.ROLE_DELETE, role="").refusal == ROLE_NOT_FOUND
    assert log.auth(A.USER_GRANT_ROLE, user="alice", role="").refusal == ROLE_NOT_FOUND
    log.auth(A.AUTH_ENABLE)
    assert "root" not in sm.auth.view.roles
    result = log.auth(A.ROLE_DELETE, role="root")
    assert (result.refusal_kind, result.refusal) == ("FAILED_PRECONDITION", INVALID_AUTH_MGMT)


def test_permissions_are_listed_by_key_a_new_range_after_those_of_its_key(sm: KVStateMachine) -> None:
    log = Log(sm)
    log.auth(A.ROLE_ADD, role="r")
    for key, range_end in ((b"b", b"c"), (b"a", b"z"), (b"a", b""), (b"a", b"\0")):
        log.auth(A.ROLE_GRANT_PERMISSION, role="r", permission=perm(kv_pb2.Permission.READ, key, range_end))
    log.auth(A.ROLE_GRANT_PERMISSION, role="r", permission=perm(kv_pb2.Permission.WRITE, b"a", b""))  # replaces
    assert [(p.key, p.range_end, p.perm_type) for p in sm.auth.view.roles["r"].permissions] == [
        (b"a", b"z", kv_pb2.Permission.READ), (b"a", b"", kv_pb2.Permission.WRITE),
        (b"a", b"\0", kv_pb2.Permission.READ), (b"b", b"c", kv_pb2.Permission.READ)]


def test_a_txn_reads_what_prev_kv_returns_and_names_its_leases() -> None:
    delete = etcd_pb.DeleteRangeRequest(key=b"d", range_end=b"e", prev_kv=True)
    inner = etcd_pb.TxnRequest(success=[etcd_pb.RequestOp(request_put=etcd_pb.PutRequest(key=b"n", lease=9))])
    request = etcd_pb.TxnRequest(
        success=[etcd_pb.RequestOp(request_put=etcd_pb.PutRequest(key=b"p", prev_kv=True, lease=7)),
                 etcd_pb.RequestOp(request_txn=inner)],
        failure=[etcd_pb.RequestOp(request_delete_range=delete),
                 etcd_pb.RequestOp(request_put=etcd_pb.PutRequest(key=b"q"))])
    reads, writes = txn_spans(request)
    assert reads == [(b"p", b""), (b"d", b"e")]
    assert writes == [(b"p", b""), (b"n", b""), (b"d", b"e"), (b"q", b"")]
    assert txn_leases(request) == {7, 9}


def test_a_lease_is_revoked_or_given_a_key_only_by_who_may_write_all_its_keys(sm: KVStateMachine) -> None:
    """etcd's checkLeasePuts, at apply: bob writes app/, alice only reads it; the leader's revoke
    of an expired lease names no user and needs none."""
    log = Log(sm)
    setup_users(log)
    log.auth(A.AUTH_ENABLE)

    def put_on_lease(key: bytes, lease: int, user: str) -> kv_pb2.CommandResult:
        request = etcd_pb.TxnRequest(success=[etcd_pb.RequestOp(request_put=etcd_pb.PutRequest(
            key=key, value=b"v", lease=lease))])
        return log.apply(encode_etcd_txn(request.SerializeToString(), user)).result

    for lease in (7, 8):
        log.apply(encode_lease_grant(lease, 60))
    assert not put_on_lease(b"other", 7, "root").refusal
    assert put_on_lease(b"app/1", 7, "bob").refusal == PERMISSION_DENIED  # root's key is on it
    assert log.apply(encode_lease_revoke(7, "bob")).result.refusal == PERMISSION_DENIED
    assert sm.get(b"other") is not None
    assert not put_on_lease(b"app/1", 8, "bob").refusal
    assert log.apply(encode_lease_revoke(8, "alice")).result.refusal == PERMISSION_DENIED
    assert not log.apply(encode_lease_revoke(8, "bob")).result.refusal
    assert sm.get(b"app/1") is None
    assert not log.apply(encode_lease_revoke(7)).result.refusal  # the leader's, on expiry
    assert sm.get(b"other") is None
