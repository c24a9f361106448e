"""Who a client request comes from while auth is on, and what they may do (docs/security.md): the
one place every face (native, etcd, exports, the embedded node) asks.

A request names its user by a token in the gRPC metadata "token" (etcd's key), made by
KV.Authenticate and checked here against the replicated auth state: its signature, its expiry and
its user's current generation (a password change or a delete voids earlier tokens). Without a
token, on a client port that verifies client certificates, the user is the certificate's common
name, as etcd does. Anything else is UNAUTHENTICATED.

The client service asks only while auth is on (`AuthHolder.enabled`, one attribute per request),
and a Stream or Pipeline call resolves its caller once and rechecks the token's expiry and
generation per request (`Caller`), without verifying the signature again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import grpc

from kv import errors
from kv.server.credentials import TokenClaims, read_token
from statemachine.auth_state import INVALID_TOKEN, PERMISSION_DENIED, USER_EMPTY, AuthHolder, KeyRange

TOKEN_METADATA_KEY = "token"
_COMMON_NAME = "x509_common_name"


@dataclass(frozen=True, slots=True)
class Identity:
    """The user a request is made as; `claims` when a token says so (None: a certificate)."""

    user: str
    claims: TokenClaims | None = None


class AuthGate:
    """Resolves and rechecks the identity of requests against the node's auth state."""

    def __init__(self, holder: AuthHolder) -> None:
        self.holder = holder

    def identify(self, context: grpc.aio.ServicerContext) -> Identity:
        """The identity of the call `context` belongs to; UnauthenticatedError when it has none."""
        token = token_of(context)
        if token is not None:
            return self.identity_of_token(token)
        name = common_name(context)
        if name:
            return Identity(name)
        raise errors.UnauthenticatedError(USER_EMPTY)

    def user(self, context: grpc.aio.ServicerContext) -> str:
        return self.identify(context).user

    def caller(self, context: grpc.aio.ServicerContext) -> str | None:
        """Who makes the call while auth is on, None while it is off (one attribute test);
        UnauthenticatedError when the call names no one."""
        return self.identify(context).user if self.holder.enabled else None

    def check_token(self, context: grpc.aio.ServicerContext) -> None:
        """While auth is on, UnauthenticatedError for a call whose token is not valid. A call that
        sends none passes: etcd checks the token of a call that needs no user (LeaseGrant) but
        lets it come from no one."""
        if self.holder.enabled and token_of(context) is not None:
            self.identify(context)

    def check_read(self, user: str | None, span: KeyRange) -> None:
        """PermissionDeniedError unless auth is off (`user` None) or `user` may read all of `span`."""
        if user is not None and not self.holder.view.may_read(user, span):
            raise errors.PermissionDeniedError(PERMISSION_DENIED)

    def check_root(self, user: str | None) -> None:
        """PermissionDeniedError unless auth is off (`user` None) or `user` has the root role."""
        if user is not None and not self.holder.view.is_root(user):
            raise errors.PermissionDeniedError(PERMISSION_DENIED)

    def identity_of_token(self, token: str) -> Identity:
        claims = read_token(self.holder.view.signing_key, token)
        if claims is None:
            raise errors.UnauthenticatedError(INVALID_TOKEN)
        identity = Identity(claims.user, claims)
        self.recheck(identity)
        return identity

    def recheck(self, identity: Identity) -> None:
        """UnauthenticatedError when a token identity is no longer valid: expired, or its user
        deleted or given another password since it was made."""
        claims = identity.claims
        if claims is None:
            return
        user = self.holder.view.users.get(claims.user)
        if claims.expiry <= time.time() or user is None or user.generation != claims.generation:
            raise errors.UnauthenticatedError(INVALID_TOKEN)


class Caller:
    """The caller of one Stream or Pipeline call: identified on its first request made while auth
    is on, and rechecked (expiry, generation) on every later one."""

    __slots__ = ("_gate", "_context", "_identity")

    def __init__(self, gate: AuthGate, context: grpc.aio.ServicerContext) -> None:
        self._gate = gate
        self._context = context
        self._identity: Identity | None = None

    def user(self) -> str:
        if self._identity is None:
            self._identity = self._gate.identify(self._context)
        else:
            self._gate.recheck(self._identity)
        return self._identity.user


def token_of(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None


def common_name(context: grpc.aio.ServicerContext) -> str | None:
    """The CN of the client's verified certificate (a TLS client port with --client-cert-auth)."""
    try:
        names = context.auth_context().get(_COMMON_NAME)
    except Exception:  # noqa: BLE001 - no auth context on this transport
        return None
    if not names:
        return None
    name = names[0]
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
