"""etcd's password hashes (bcrypt, `$2a$10$...`: etcd 3.4's auth/store.go, golang.org/x/crypto/bcrypt)
checked by raftkv, so that users restored from an etcd snapshot log in with the passwords they had
(kv/server/etcd_backup.py keeps their hashes as they are). raftkv hashes new passwords with scrypt
(kv/server/credentials.py); a user keeps a bcrypt hash until its password is changed.

bcrypt comes from the system's libcrypt (libxcrypt, in every Debian and most distributions' base
system) through ctypes, with crypt_rn and a buffer per call, so calls from several threads do not
share its static state. Like scrypt it costs tens of milliseconds (etcd's cost 10): call it in a
worker thread.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hmac
from functools import cache

_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")
_DATA_BYTES = 32768  # sizeof(struct crypt_data) in libxcrypt


def is_bcrypt(stored: bytes) -> bool:
    return stored[:4] in _PREFIXES


@cache
def _libcrypt() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("crypt") or "libcrypt.so.1"
    try:
        lib = ctypes.CDLL(name)
        crypt_rn = lib.crypt_rn
    except (OSError, AttributeError):
        return None
    crypt_rn.restype = ctypes.c_char_p
    crypt_rn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
    return lib


def bcrypt_matches(password: str, stored: bytes) -> bool:
    """Whether `password` is the one `stored` (a bcrypt hash) was made from. False, never an
    error, when libcrypt is missing or refuses the hash: the login is refused as any wrong one."""
    lib = _libcrypt()
    if lib is None or b"\0" in stored or "\0" in password:
        return False
    data = ctypes.create_string_buffer(_DATA_BYTES)
    computed = lib.crypt_rn(password.encode("utf-8"), stored, data, _DATA_BYTES)
    return computed is not None and hmac.compare_digest(computed, stored)
