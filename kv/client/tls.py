"""TLS for the client's connections to the nodes' client port (`raftkv serve --cert-file ...`).

    Client(endpoints, tls=TLS(ca_file="certs/ca.pem"))                       # server-verified TLS
    Client(endpoints, tls=TLS("certs/ca.pem", "certs/alice.pem", "certs/alice-key.pem"))  # and a client cert

The names follow etcdctl's --cacert, --cert and --key, as do the variables TLS.from_env() reads.
When a connection fails in its handshake, gRPC says so in terms of OpenSSL; `handshake_hint`
turns the cases we can recognise into what to check (docs/security.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

CACERT_VARIABLE = "RAFTKV_CACERT"
CERT_VARIABLE = "RAFTKV_CERT"
KEY_VARIABLE = "RAFTKV_KEY"
# What a hinted error message carries before the hint (kv/client/retries.py keeps it in summaries).
HINT_MARK = "(TLS: "


@dataclass(frozen=True, slots=True)
class TLS:
    """PEM files for TLS to the nodes. ca_file (the CLI's --cacert): the CA that signed the nodes'
    certificates (None: the system's trusted roots); cert_file and key_file (--cert, --key),
    together: this client's certificate, for nodes started with --client-cert-auth."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert_file", "key_file"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key: give cert_file and key_file together "
                             "(--cert and --key)")

    @classmethod
    def from_env(cls) -> TLS | None:
        """TLS from $RAFTKV_CACERT, $RAFTKV_CERT and $RAFTKV_KEY; None when none of them is set."""
        ca, cert, key = (os.environ.get(v) or None for v in (CACERT_VARIABLE, CERT_VARIABLE, KEY_VARIABLE))
        if ca is None and cert is None and key is None:
            return None
        return cls(ca, cert, key)  # type: ignore[arg-type]

    @property
    def has_client_cert(self) -> bool:
        return self.cert_file is not None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files, read now (once per Client). ValueError naming
        the file when one cannot be read."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "ca_file (--cacert)"),
            private_key=_read(self.key_file, "key_file (--key)"),
            certificate_chain=_read(self.cert_file, "cert_file (--cert)"))


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as e:
        raise ValueError(f"TLS {what} {path}: {e.strerror or e}") from None


def open_channel(address: str, credentials: grpc.ChannelCredentials | None,
                 options: tuple[tuple[str, int], ...] = ()) -> grpc.Channel:
    """A channel to `address`: TLS with `credentials`, plaintext without."""
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


def handshake_hint(details: str, tls: TLS | None) -> str | None:
    """What to check when gRPC's account of a failed connection (`details`) looks like a TLS
    mismatch between this client (`tls`) and the node; None when it does not.

    What gRPC (1.85) reports, case by case: a TLS client to a plaintext node: "Tls handshake
    failed ... WRONG_VERSION_NUMBER"; a node certificate that the CA does not sign: "Tls handshake
    failed ... CERTIFICATE_VERIFY_FAILED" or "certificate signature failure"; a certificate that
    does not name the dialled host: "Hostname Verification Check failed". Where the node refuses
    (a plaintext client to a TLS node; a client with no certificate, or one the node's CA did not
    sign, under --client-cert-auth) the client only sees "Socket closed" as it connects, which a
    node dying at that moment, or a proxy whose node is down, also causes: those hints say "if"."""
    text = details.lower()
    if "hostname verification" in text:
        return ("the node's certificate does not name the host dialled: dial a name or IP address its certificate "
                "lists (raftkv certs --hosts)")
    if "tls handshake failed" in text or "ssl_error" in text:
        if "wrong_version_number" in text:
            return ("the node does not speak TLS: is it started with --cert-file/--key-file? If not, connect "
                    "without --cacert/--cert/--key")
        if "certificate" in text:  # CERTIFICATE_VERIFY_FAILED, "certificate signature failure", ...
            return ("the node's certificate was not accepted: is --cacert the CA that signed the node's certificate "
                    "(its --cert-file)?")
        return "the TLS handshake failed for the reason gRPC gives before this hint"
    if "failed to connect" not in text or "socket closed" not in text:
        return None
    if tls is None:
        return ("the node closed the connection as it was set up: if it serves TLS (--cert-file), give --cacert "
                "(TLS.ca_file); if not, it may have gone down")
    if not tls.has_client_cert:
        return ("the node closed the connection in the TLS handshake: if it requires client certificates "
                "(--client-cert-auth), give --cert/--key")
    return ("the node closed the connection in the TLS handshake: if it requires client certificates, is --cert "
            "signed by the CA it trusts (its --trusted-ca-file)?")


def with_hint(message: str, tls: TLS | None) -> str:
    """`message`, followed by the TLS hint that fits it, if any (once)."""
    if HINT_MARK in message:
        return message
    hint = handshake_hint(message, tls)
    return f"{message} {HINT_MARK}{hint})" if hint else message
