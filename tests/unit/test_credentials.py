"""Passwords and tokens (kv/server/credentials.py) and the identity of a token (kv/server/auth_gate.py)."""
from __future__ import annotations

import time

import pytest

from kv import errors
from kv.server.auth_gate import AuthGate
from kv.server.credentials import TokenClaims, hash_password, password_matches, read_token, sign_token
from raftkv_proto import kv_pb2
from statemachine.auth_state import INVALID_TOKEN, AuthHolder, AuthView

KEY = b"k" * 32


def test_a_password_matches_only_its_own_hash() -> None:
    salt = b"s" * 16
    stored = hash_password("secret", salt)
    assert password_matches("secret", salt, stored)
    assert not password_matches("Secret", salt, stored)
    assert not password_matches("secret", b"t" * 16, stored)
    assert not password_matches("secret", salt, b"")


def test_a_token_reads_back_and_a_forged_one_does_not() -> None:
    claims = TokenClaims("al.ice", 7, 2_000_000_000)
    token = sign_token(KEY, claims)
    assert read_token(KEY, token) == claims
    assert read_token(b"x" * 32, token) is None
    user, generation, expiry, mac = token.split(".")
    assert read_token(KEY, ".".join((user, "8", expiry, mac))) is None
    assert read_token(KEY, "garbage") is None and read_token(KEY, "") is None


def gate_with(users: dict[str, int]) -> AuthGate:
    holder = AuthHolder()
    holder.publish(AuthView(enabled=True, signing_key=KEY, users={
        name: kv_pb2.StoredUser(name=name, generation=generation) for name, generation in users.items()}))
    return AuthGate(holder)


def test_expired_stale_and_deleted_users_tokens_are_invalid() -> None:
    gate = gate_with({"alice": 3})
    fresh = sign_token(KEY, TokenClaims("alice", 3, time.time() + 60))
    assert gate.identity_of_token(fresh).user == "alice"
    for token in (sign_token(KEY, TokenClaims("alice", 3, time.time() - 1)),  # expired
                  sign_token(KEY, TokenClaims("alice", 2, time.time() + 60)),  # an older password
                  sign_token(KEY, TokenClaims("bob", 1, time.time() + 60))):  # no such user
        with pytest.raises(errors.UnauthenticatedError, match=INVALID_TOKEN):
            gate.identity_of_token(token)


class FakeContext:
    """What AuthGate reads of a grpc.aio.ServicerContext: metadata and the TLS auth context."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = (), common_name: bytes | None = None) -> None:
        self._metadata = metadata
        self._auth = {"x509_common_name": [common_name]} if common_name else {"transport_security_type": [b"ssl"]}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


def test_a_token_wins_over_a_certificate_and_a_certificate_names_a_user_without_one() -> None:
    gate = gate_with({"alice": 1, "bob": 1})
    token = sign_token(KEY, TokenClaims("alice", 1, time.time() + 60))
    assert gate.user(FakeContext((("token", token),), common_name=b"bob")) == "alice"
    assert gate.user(FakeContext(common_name=b"bob")) == "bob"
    with pytest.raises(errors.UnauthenticatedError):
        gate.user(FakeContext())
    with pytest.raises(errors.UnauthenticatedError, match=INVALID_TOKEN):
        gate.user(FakeContext((("token", "forged"),), common_name=b"bob"))
