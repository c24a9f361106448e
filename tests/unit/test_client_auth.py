"""The client's side of auth without a cluster: credentials, and permissions as the admin
methods send them (kv/client/credentials.py, kv/client/auth_admin.py)."""
from __future__ import annotations

import grpc
import pytest

import kv
from kv import errors
from kv.client.auth_admin import permission
from kv.client.credentials import Credentials
from raftkv_proto import kv_pb2


def test_a_permission_on_a_key_a_range_or_a_prefix() -> None:
    assert permission(b"k", perm="read") == kv_pb2.Permission(perm_type=kv_pb2.Permission.READ, key=b"k")
    assert permission(b"a", b"c").range_end == b"c"
    assert permission(b"app/", prefix=True, perm="WRITE") == kv_pb2.Permission(
        perm_type=kv_pb2.Permission.WRITE, key=b"app/", range_end=b"app0")
    assert permission(b"", prefix=True).range_end == b"\0"  # every key, as etcd's open end
    with pytest.raises(ValueError, match="perm must be one of"):
        permission(b"k", perm="admin")
    with pytest.raises(ValueError, match="not both"):
        permission(b"a", b"b", prefix=True)


def test_credentials_log_in_once_and_carry_the_token() -> None:
    credentials = Credentials("alice", "pw")
    assert credentials.needs_login and credentials.metadata is None
    credentials.use_token("t")
    assert not credentials.needs_login and credentials.metadata == (("token", "t"),)
    credentials.use_token(None)  # auth is off: no token, and no login at every call
    assert credentials.metadata is None and not credentials.needs_login
    assert not Credentials("alice").needs_login  # a certificate names alice
    with pytest.raises(ValueError):
        Credentials(None, "pw")


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "etcdserver: ..."

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_grpcs_auth_codes_are_typed_errors_neither_retried() -> None:
    denied = errors.from_rpc_error(_Refused(grpc.StatusCode.PERMISSION_DENIED))
    unauthenticated = errors.from_rpc_error(_Refused(grpc.StatusCode.UNAUTHENTICATED))
    assert isinstance(denied, kv.PermissionDeniedError) and denied.kind == "PERMISSION_DENIED"
    assert isinstance(unauthenticated, kv.UnauthenticatedError) and unauthenticated.kind == "UNAUTHENTICATED"
    assert not denied.retryable and not unauthenticated.retryable
