"""Certificates, keys, CAs and revocation lists read again when their files change, without a
restart (docs/security.md, "Rotating certificates and revoking them").

etcd reads its certificate and key again at every handshake. Here each handshake asks a
`Reloading` for its value, which looks at the files' stat (modification time, size, inode) and
builds the value again only when that changed: new connections get the new files, connections
already made keep theirs. A build that fails - a key written before its certificate, a half
written file, a file moved away for a moment - leaves the last good value in use: the member
serves on with the old files, logs the failure once, and tries again when the files change next.
Only the first build, at start, raises.

`serving_context` is how a listener whose SSLContext is fixed when it starts (asyncio's
start_server, the peer listener) takes a new one per connection: OpenSSL calls the context's
server-name callback for every ClientHello (with or without SNI), and the callback moves the
connection to the current context, whose certificate, key and CA store then serve the handshake.

`Revocations` is etcd's --client-crl-file / --peer-crl-file: the serial numbers a CRL lists, and a
certificate refused when its serial is one of them (etcd compares serials only, not the issuer,
and neither checks the CRL's signature or dates: the file is the operator's)."""
from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from cryptography import x509

log = logging.getLogger(__name__)

T = TypeVar("T")

# A file's (mtime_ns, size, inode), or None while it cannot be stat'ed.
Stamp = tuple[tuple[int, int, int] | None, ...]


def stamp(paths: Sequence[Path]) -> Stamp:
    """What tells that any of `paths` changed: a rewrite, a rename over it, a truncation."""
    found: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(found)


class Reloading(Generic[T]):
    """A value built from `paths` by `build()` (ValueError or OSError when the files do not make
    one), built again by `current()` when the files changed. `what` names it in the log. Safe to
    call from any thread (gRPC calls its certificate fetcher on its own)."""

    def __init__(self, paths: Sequence[Path], build: Callable[[], T], what: str) -> None:
        self._paths = tuple(paths)
        self._build = build
        self._what = what
        self._lock = threading.Lock()
        self._stamp = stamp(self._paths)
        self._value = build()  # at start a failure is the caller's: the member does not start
        self._failing = False

    def current(self) -> T:
        now = stamp(self._paths)
        if now == self._stamp:
            return self._value
        with self._lock:
            if now != self._stamp:
                self._rebuild(now)
            return self._value

    def _rebuild(self, before: Stamp) -> None:
        try:
            value = self._build()
        except (ValueError, OSError, ssl.SSLError) as e:
            if not self._failing:
                log.warning("%s changed but cannot be loaded (%s); serving with the files loaded before until "
                            "they can", self._what, e)
            self._failing = True
            self._stamp = before  # tried again at the next change
            return
        self._value = value
        if self._failing:
            log.warning("%s loaded again: new connections use the new files", self._what)
        else:
            log.info("%s changed: new connections use the new files", self._what)
        self._failing = False
        # A file that moved on while it was read is read again at the next call.
        self._stamp = before if stamp(self._paths) == before else ()


def serving_context(current: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """A context to start a TLS listener with that hands every new connection to `current()` (the
    contexts must share their verify mode: it is set per connection from the first)."""
    first = current()

    def to_current(connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                   context: ssl.SSLContext) -> None:
        latest = current()
        if latest is not context:
            connection.context = latest

    first.sni_callback = to_current
    return first


def revoked_serials(crl_file: Path) -> frozenset[int]:
    """The serial numbers a CRL (PEM or DER) lists; ValueError naming the file when it is neither."""
    data = crl_file.read_bytes()
    try:
        crl = x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data)
    except ValueError as e:
        raise ValueError(f"{crl_file}: not a certificate revocation list (PEM or DER): {e}") from None
    return frozenset(revoked.serial_number for revoked in crl)


class Revocations:
    """The CRL in `crl_file`, read again when it changes. `what` names the flag in messages."""

    def __init__(self, crl_file: Path, what: str) -> None:
        self.what = what
        self._serials = Reloading([crl_file], lambda: revoked_serials(crl_file), f"{what} {crl_file}")

    def revoked(self, serial: int) -> bool:
        return serial in self._serials.current()

    def refusal(self, serial: int) -> str | None:
        """Why a certificate with `serial` is refused, None when it is not."""
        if not self.revoked(serial):
            return None
        return f"certificate serial {serial:x} is revoked ({self.what})"

    def refusal_of(self, peercert: dict[str, Any] | None) -> str | None:
        """refusal() of a verified certificate in ssl's getpeercert() form (None, {}: none shown)."""
        if not peercert or "serialNumber" not in peercert:
            return None
        return self.refusal(int(peercert["serialNumber"], 16))
