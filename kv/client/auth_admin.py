"""etcd clientv3's Auth API on the Client, in snake_case (docs/security.md): auth enable, disable
and status; users; roles and their permissions. Each is one KV.AuthAdmin call, retried like any
other call; once auth is enabled, only a user with the root role may make them (auth_status:
any user)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raftkv_proto import kv_pb2

A = kv_pb2
PERMISSION_TYPES = {"read": kv_pb2.Permission.READ, "write": kv_pb2.Permission.WRITE,
                    "readwrite": kv_pb2.Permission.READWRITE}
_TYPE_NAMES = {value: name for name, value in PERMISSION_TYPES.items()}


def permission(key: bytes, range_end: bytes | None = None, prefix: bool = False,
               perm: str = "readwrite") -> kv_pb2.Permission:
    """A permission on `key`, [key, range_end), or every key starting with `key` (prefix)."""
    from raftkv_proto.key_ranges import prefix_end

    kind = PERMISSION_TYPES.get(perm.lower())
    if kind is None:
        raise ValueError(f"perm must be one of {', '.join(PERMISSION_TYPES)}, not {perm!r}")
    if prefix and range_end is not None:
        raise ValueError("give either range_end or prefix, not both")
    if prefix:
        range_end = prefix_end(key) or b"\0"  # the empty prefix: every key, as etcd's --from-key
    return kv_pb2.Permission(perm_type=kind, key=key, range_end=range_end or b"")


def permission_dict(perm: kv_pb2.Permission) -> dict[str, Any]:
    return {"perm": _TYPE_NAMES[perm.perm_type], "key": perm.key, "range_end": perm.range_end}


class AuthAdmin:
    """Mixed into kv.Client, whose `_call` sends each request (with its retries and token)."""

    _call: Callable[..., Any]

    def _admin(self, action: int, **fields: Any) -> kv_pb2.AuthAdminResponse:
        return self._call(lambda stub: stub.AuthAdmin, kv_pb2.AuthAdminRequest(action=action, **fields))

    # ---- auth --------------------------------------------------------------------------------

    def auth_enable(self) -> None:
        """Turn authentication on; refused ("etcdserver: root user does not exist") until a user
        root with the role root exists."""
        self._admin(A.AUTH_ENABLE)

    def auth_disable(self) -> None:
        self._admin(A.AUTH_DISABLE)

    def auth_status(self) -> dict[str, bool]:
        return {"enabled": self._admin(A.AUTH_STATUS).enabled}

    # ---- users -------------------------------------------------------------------------------

    def user_add(self, name: str, password: str) -> None:
        self._admin(A.USER_ADD, user=name, password=password)

    def user_delete(self, name: str) -> None:
        self._admin(A.USER_DELETE, user=name)

    def user_get(self, name: str) -> dict[str, Any]:
        """{"name": ..., "roles": [...]}"""
        user = self._admin(A.USER_GET, user=name).users[0]
        return {"name": user.name, "roles": list(user.roles)}

    def user_list(self) -> list[str]:
        return [user.name for user in self._admin(A.USER_LIST).users]

    def user_change_password(self, name: str, password: str) -> None:
        self._admin(A.USER_CHANGE_PASSWORD, user=name, password=password)

    def user_grant_role(self, name: str, role: str) -> None:
        self._admin(A.USER_GRANT_ROLE, user=name, role=role)

    def user_revoke_role(self, name: str, role: str) -> None:
        self._admin(A.USER_REVOKE_ROLE, user=name, role=role)

    # ---- roles -------------------------------------------------------------------------------

    def role_add(self, name: str) -> None:
        self._admin(A.ROLE_ADD, role=name)

    def role_delete(self, name: str) -> None:
        self._admin(A.ROLE_DELETE, role=name)

    def role_get(self, name: str) -> dict[str, Any]:
        """{"name": ..., "permissions": [{"perm": "read", "key": b"...", "range_end": b"..."}]}"""
        role = self._admin(A.ROLE_GET, role=name).roles[0]
        return {"name": role.name, "permissions": [permission_dict(p) for p in role.permissions]}

    def role_list(self) -> list[str]:
        return [role.name for role in self._admin(A.ROLE_LIST).roles]

    def role_grant_permission(self, role: str, key: str | bytes, range_end: str | bytes | None = None,
                              prefix: bool = False, perm: str = "readwrite") -> None:
        """Let `role` read, write or readwrite `key`, [key, range_end) or (prefix) every key
        starting with `key`. A grant on the same key and range end replaces its type, as etcd's."""
        self._admin(A.ROLE_GRANT_PERMISSION, role=role,
                    permission=permission(_bytes(key), _bytes(range_end), prefix, perm))

    def role_revoke_permission(self, role: str, key: str | bytes, range_end: str | bytes | None = None,
                               prefix: bool = False) -> None:
        """Take back the permission granted on exactly this key and range end (or prefix)."""
        self._admin(A.ROLE_REVOKE_PERMISSION, role=role,
                    permission=permission(_bytes(key), _bytes(range_end), prefix))


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value
