"""etcd's Auth service on a node, on the native API (KV.AuthAdmin, KV.Authenticate): users, roles
and permissions changed through the log (statemachine/auth_state.py) and read from the applied
state, and tokens for a user's name and password (kv/server/credentials.py).

Once auth is enabled only a user with the root role may run the admin actions (AUTH_STATUS is open
to any authenticated user); while it is off anyone may, which is how root and its role are set up
before `auth enable`. A password is hashed here, in a worker thread, before its change is proposed.
"""
from __future__ import annotations

import asyncio
import time

from kv import errors
from kv.server.credentials import (
    TokenClaims,
    hash_password,
    new_salt,
    new_signing_key,
    password_matches,
    sign_token,
)
from kv.server.kv_handler import KVHandler
from kv.server.login_throttle import LoginThrottle
from kv.server.node_calls import propose_command, read_barrier
from raft.node.node import RaftNode
from raftkv_proto import kv_pb2
from statemachine.auth_state import (
    AUTH_FAILED,
    CHANGE_ACTIONS,
    ROLE_NOT_FOUND,
    USER_NOT_FOUND,
    AuthView,
)
from statemachine.commands import encode_auth

A = kv_pb2
AUTH_NOT_ENABLED = "etcdserver: authentication is not enabled"
# Any password's hash, compared when the user does not exist, so that a login costs the same time
# whether or not the name is known.
_DUMMY_SALT = bytes(16)


class AuthHandler:
    def __init__(self, node: RaftNode, handler: KVHandler, token_ttl_s: float) -> None:
        self._node = node
        self._handler = handler
        self._auth = handler.auth
        self._token_ttl_s = token_ttl_s
        self._throttle = LoginThrottle(time.monotonic)  # a guesser's answers slow down, per name

    # ---- login ---------------------------------------------------------------------------------

    async def authenticate(self, request: kv_pb2.AuthenticateRequest,
                           timeout: float | None = None) -> kv_pb2.AuthenticateResponse:
        """A token for (name, password), from this member's applied auth state. A refusal is
        confirmed against the newest state first (a ReadIndex round on the leader; a follower
        answers NOT_LEADER, and the client asks the leader): a member a little behind may not
        know a user or password just changed. Failed logins on a name slow its next ones down
        (kv/server/login_throttle.py)."""
        if not self._auth.view.enabled:
            raise errors.FailedPreconditionError(AUTH_NOT_ENABLED)

        async def check() -> str | None:
            token = await self._token_for(request)
            if token is None:
                await read_barrier(self._node, "linearizable", timeout)
                token = await self._token_for(request)
            return token
        token = await self._throttle.attempt(request.name, check)
        if token is None:
            raise errors.UnauthenticatedError(AUTH_FAILED)
        return kv_pb2.AuthenticateResponse(token=token)

    async def login(self, name: str, password: str, timeout: float | None) -> str:
        """`authenticate` for a caller in this process (kv/embedded.py): a refusal a follower
        would have the leader confirm is a refusal here."""
        try:
            return (await self.authenticate(kv_pb2.AuthenticateRequest(name=name, password=password), timeout)).token
        except errors.NotLeaderError:
            raise errors.UnauthenticatedError(AUTH_FAILED) from None

    async def _token_for(self, request: kv_pb2.AuthenticateRequest) -> str | None:
        view = self._auth.view
        user = view.users.get(request.name)
        salt, expected = (user.salt, user.password_hash) if user is not None else (_DUMMY_SALT, b"")
        matches = await asyncio.to_thread(password_matches, request.password, salt, expected)
        if user is None or not matches:
            return None
        claims = TokenClaims(user.name, user.generation, time.time() + self._token_ttl_s)
        return sign_token(view.signing_key, claims)

    # ---- admin ---------------------------------------------------------------------------------

    async def admin(self, request: kv_pb2.AuthAdminRequest, user: str | None,
                    timeout: float | None, own_reads: bool = False) -> kv_pb2.AuthAdminResponse:
        """One of etcd's Auth RPCs, by `request.action`, for `user` (None: auth is off).
        `own_reads`: etcd's rule that a user may also get itself and the roles it has (its
        authApplierV3's UserGet and RoleGet), which the etcd face follows."""
        if request.action != A.AUTH_STATUS and not (own_reads and self._reads_own(request, user)):
            self._handler.gate.check_root(user)
        if request.action in CHANGE_ACTIONS:
            return await self._change(request, timeout)
        read = _READS.get(request.action)
        if read is None:
            raise errors.InvalidArgumentError(f"unknown auth action {request.action}")
        await read_barrier(self._node, "linearizable", timeout)
        return read(self._auth.view, request)

    def _reads_own(self, request: kv_pb2.AuthAdminRequest, user: str | None) -> bool:
        if user is None:
            return False
        if request.action == A.USER_GET:
            return request.user == user
        stored = self._auth.view.users.get(user)
        return request.action == A.ROLE_GET and stored is not None and request.role in stored.roles

    async def _change(self, request: kv_pb2.AuthAdminRequest, timeout: float | None) -> kv_pb2.AuthAdminResponse:
        change = kv_pb2.AuthCommand(action=request.action, user=request.user, role=request.role,
                                    permission=request.permission)
        if request.action in (A.USER_ADD, A.USER_CHANGE_PASSWORD):
            if not request.password:
                raise errors.InvalidArgumentError("a password is needed (etcd's users without one are not supported)")
            change.salt = new_salt()
            change.password_hash = await asyncio.to_thread(hash_password, request.password, change.salt)
        elif request.action == A.AUTH_ENABLE:
            change.signing_key = new_signing_key()
        payload = encode_auth(change)
        outcome = await propose_command(self._node, payload, timeout)
        return kv_pb2.AuthAdminResponse(index=outcome.index)


def _status(view: AuthView, request: kv_pb2.AuthAdminRequest) -> kv_pb2.AuthAdminResponse:
    return kv_pb2.AuthAdminResponse(enabled=view.enabled)


def _user(stored: kv_pb2.StoredUser) -> kv_pb2.AuthUser:
    return kv_pb2.AuthUser(name=stored.name, roles=list(stored.roles))


def _role(stored: kv_pb2.StoredRole) -> kv_pb2.AuthRole:
    return kv_pb2.AuthRole(name=stored.name, permissions=list(stored.permissions))


def _user_get(view: AuthView, request: kv_pb2.AuthAdminRequest) -> kv_pb2.AuthAdminResponse:
    stored = view.users.get(request.user)
    if stored is None:
        raise errors.FailedPreconditionError(USER_NOT_FOUND)
    return kv_pb2.AuthAdminResponse(users=[_user(stored)])


def _user_list(view: AuthView, request: kv_pb2.AuthAdminRequest) -> kv_pb2.AuthAdminResponse:
    return kv_pb2.AuthAdminResponse(users=[_user(view.users[name]) for name in sorted(view.users)])


def _role_get(view: AuthView, request: kv_pb2.AuthAdminRequest) -> kv_pb2.AuthAdminResponse:
    stored = view.roles.get(request.role)
    if stored is None:
        raise errors.FailedPreconditionError(ROLE_NOT_FOUND)
    return kv_pb2.AuthAdminResponse(roles=[_role(stored)])


def _role_list(view: AuthView, request: kv_pb2.AuthAdminRequest) -> kv_pb2.AuthAdminResponse:
    return kv_pb2.AuthAdminResponse(roles=[_role(view.roles[name]) for name in sorted(view.roles)])


_READS = {
    A.AUTH_STATUS: _status,
    A.USER_GET: _user_get,
    A.USER_LIST: _user_list,
    A.ROLE_GET: _role_get,
    A.ROLE_LIST: _role_list,
}
