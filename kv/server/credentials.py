"""Passwords and tokens of raftkv's users (docs/security.md).

Passwords are hashed by the node that takes the request, before anything is proposed, with
scrypt (16-byte random salt, n=2**14, r=8, p=1): the log, snapshots and every replica hold only salt
and hash. scrypt costs tens of milliseconds of CPU on purpose, so callers run it in a worker thread
(`asyncio.to_thread`), never on the event loop.

A token is HMAC-SHA256 over (user, user generation, expiry), signed with the replicated signing key
made at `auth enable`, so every member verifies any member's token without asking anyone:

    <base64url(user)>.<generation>.<expiry, unix seconds>.<base64url(mac)>

The generation ties a token to one password of one user (a password change or a delete and
re-add makes another), the expiry to the node's --auth-token-ttl. Expiry is wall-clock time, so
members' clocks must roughly agree, as for etcd's JWT tokens.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import math
import os
import time
from dataclasses import dataclass

from kv.server.bcrypt_password import bcrypt_matches, is_bcrypt

SALT_BYTES = 16
SIGNING_KEY_BYTES = 32
# scrypt's parameters (RFC 7914's interactive-login figures): 16 MiB of memory per hash.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_HASH_BYTES = 32


def new_salt() -> bytes:
    return os.urandom(SALT_BYTES)


def new_signing_key() -> bytes:
    return os.urandom(SIGNING_KEY_BYTES)


def hash_password(password: str, salt: bytes) -> bytes:
    """scrypt of `password` (slow on purpose: call it in a worker thread)."""
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                          maxmem=64 << 20, dklen=_HASH_BYTES)


def password_matches(password: str, salt: bytes, expected: bytes) -> bool:
    """Whether `password` hashes to `expected` (constant-time compare; slow, as hash_password).
    A bcrypt hash (a user restored from an etcd snapshot) is checked as etcd checks it."""
    if is_bcrypt(expected):
        return bcrypt_matches(password, expected)
    actual = hash_password(password, salt)  # even for no `expected`: a login costs the same either way
    return bool(expected) and hmac.compare_digest(actual, expected)


@dataclass(frozen=True, slots=True)
class TokenClaims:
    user: str
    generation: int
    expiry: float  # unix seconds

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expiry


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, body: str) -> bytes:
    return hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()


def sign_token(key: bytes, claims: TokenClaims) -> str:
    # Whole seconds, rounded up: a token never lives less than the TTL it was made with.
    body = f"{_b64(claims.user.encode('utf-8'))}.{claims.generation}.{math.ceil(claims.expiry)}"
    return f"{body}.{_b64(_mac(key, body))}"


def read_token(key: bytes, token: str) -> TokenClaims | None:
    """The claims of a token signed with `key`; None for a malformed or forged one (expiry and
    generation are the caller's to check against the clock and the auth state)."""
    body, dot, mac = token.rpartition(".")
    if not dot or not key:
        return None
    try:
        if not hmac.compare_digest(_unb64(mac), _mac(key, body)):
            return None
        user, generation, expiry = body.split(".")
        return TokenClaims(_unb64(user).decode("utf-8"), int(generation), float(expiry))
    except (ValueError, UnicodeError):
        return None
