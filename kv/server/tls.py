"""TLS on a node's client port (--listen, and the JSON gateway's --listen-client-http-urls): the
gRPC server credentials and the gateway's context of --cert-file, --key-file, --trusted-ca-file and
--client-cert-auth, read again when the files change; --client-crl-file's refusal of revoked
client certificates; the credentials a member dials the other members' client ports with (its
state checks ask their Status), and the warning for a port open to the network without TLS
(docs/security.md).

The gRPC port takes its files through grpcio's dynamic credentials: gRPC asks for them at every
handshake, and gets a new configuration only when the files changed and make a consistent whole
(the key is the certificate's; the CA parses) - until then the last good one serves, as
raft/transport/tls_reload.py does for the other listeners.

The revocation list on the gRPC port: grpcio 1.85 has no CRL option for a server, so the check
runs before every call's handler (kv/server/input_checks.py): the serial of the certificate the
client verified with (gRPC's auth context, x509_pem_cert) against --client-crl-file's, and a call
from a revoked one ends UNAUTHENTICATED. etcd checks when the connection is made and closes it (its
client sees UNAVAILABLE); here the connection stays, each of its calls refused
(docs/etcd-compatibility.md). The gateway, which accepts its connections itself, closes a revoked
client's connection after the handshake, as etcd does."""
from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from raft.node.config import NodeConfig, Security, TLSFiles
from raft.transport.address import socket_host, split_address
from raft.transport.tls_reload import Reloading, Revocations, serving_context

log = logging.getLogger(__name__)

_PEM_CERT = "x509_pem_cert"
# Serials of the client certificates seen lately, by PEM: parsed once per certificate, not per call.
_SERIALS_KEPT = 1024


@dataclass(frozen=True, slots=True)
class PemFiles:
    """The client port's files as gRPC takes them: bytes."""

    key: bytes
    chain: bytes
    ca: bytes | None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(self.key, self.chain)], root_certificates=self.ca)


def read_pem_files(files: TLSFiles) -> PemFiles:
    """The files' bytes; ValueError when they are not a certificate, its own key and a CA (a key
    written before its certificate, a file half written)."""
    assert files.cert_file is not None and files.key_file is not None
    pem = PemFiles(files.key_file.read_bytes(), files.cert_file.read_bytes(),
                   files.trusted_ca_file.read_bytes() if files.trusted_ca_file is not None else None)
    try:
        certificate = x509.load_pem_x509_certificates(pem.chain)[0]
        key = serialization.load_pem_private_key(pem.key, password=None)
        if pem.ca is not None:
            x509.load_pem_x509_certificates(pem.ca)
    except (ValueError, TypeError) as e:
        raise ValueError(f"cert_file {files.cert_file}, key_file {files.key_file}, trusted_ca_file "
                         f"{files.trusted_ca_file}: {e}") from None
    if _public(certificate.public_key()) != _public(key.public_key()):
        raise ValueError(f"key_file {files.key_file} is not the key of cert_file {files.cert_file}")
    return pem


def _public(key: object) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,  # type: ignore[attr-defined]
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def gateway_context(files: TLSFiles) -> ssl.SSLContext:
    """The client port's TLS for the gateway: its certificate and key, its CA and client-cert-auth."""
    assert files.cert_file is not None and files.key_file is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert_file, files.key_file)
    if files.trusted_ca_file is not None:
        context.load_verify_locations(files.trusted_ca_file)
    context.verify_mode = ssl.CERT_REQUIRED if files.client_cert_auth else ssl.CERT_NONE
    return context


@dataclass(frozen=True, slots=True)
class ClientPortFiles:
    pem: PemFiles  # for gRPC
    gateway: ssl.SSLContext
    member: grpc.ChannelCredentials | None  # member_channel_credentials


class ClientPortTLS:
    """The client port's TLS for its gRPC servers, its gateway and this member's calls to the
    other members' client ports, from `security.client` (enabled), read again when the files
    change. Raises ValueError at once when the files do not load."""

    def __init__(self, security: Security) -> None:
        files = self._files = security.client
        assert files.enabled
        paths = [p for p in (files.cert_file, files.key_file, files.trusted_ca_file or security.peer.trusted_ca_file)
                 if p is not None]
        self._loaded = Reloading(paths, lambda: ClientPortFiles(read_pem_files(files), gateway_context(files),
                                                                member_channel_credentials(security)),
                                 "client certificate files")
        self.revocations = (None if files.crl_file is None else
                            Revocations(files.crl_file, "--client-crl-file"))
        self._serials: dict[bytes, int] = {}

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials for one gRPC server: each server asks for new files on its own, so each
        needs its own fetcher to know whether it has been given the latest."""
        served = self._loaded.current().pem

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal served
            latest = self._loaded.current().pem
            if latest == served:
                return None  # gRPC keeps what it has
            served = latest
            return latest.configuration()

        return grpc.dynamic_ssl_server_credentials(served.configuration(), fetch,
                                                   require_client_authentication=self._files.client_cert_auth)

    def member_credentials(self) -> grpc.ChannelCredentials | None:
        """How a new channel to another member's client port is made now (member_channel_credentials)."""
        return self._loaded.current().member

    def gateway_context(self) -> ssl.SSLContext:
        """The context to start the gateway's listener with; each connection gets the files as they are."""
        return serving_context(lambda: self._loaded.current().gateway)

    async def refuse_revoked(self, context: grpc.aio.ServicerContext) -> None:
        """Ends the call UNAUTHENTICATED when the client's certificate is revoked (a CallerCheck)."""
        why = self.revoked_call(context)
        if why is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    def revoked_call(self, context: grpc.aio.ServicerContext) -> str | None:
        pems = context.auth_context().get(_PEM_CERT)
        if not pems or self.revocations is None:
            return None
        return self.revocations.refusal(self._serial(pems[0]))

    def revoked_connection(self, peercert: dict[str, Any] | None) -> str | None:
        """Why the gateway refuses a connection whose verified certificate (ssl's dict form) is
        revoked; None to serve it."""
        return None if self.revocations is None else self.revocations.refusal_of(peercert)

    def _serial(self, pem: bytes) -> int:
        serial = self._serials.get(pem)
        if serial is None:
            if len(self._serials) >= _SERIALS_KEPT:
                self._serials.clear()
            serial = self._serials[pem] = x509.load_pem_x509_certificate(pem).serial_number
        return serial


def member_channel_credentials(security: Security) -> grpc.ChannelCredentials | None:
    """How this member dials the other members' client ports, when they serve TLS (a cluster's
    members share their settings): trusting --trusted-ca-file, else --peer-trusted-ca-file (the CA
    of the members' certificates), else the system's roots; and presenting its own --cert-file as
    its client certificate (a member certificate carries the client usage too), so that members
    started with --client-cert-auth accept it. None: plaintext."""
    files = security.client
    if not files.enabled:
        return None
    assert files.cert_file is not None and files.key_file is not None
    ca_file = files.trusted_ca_file or security.peer.trusted_ca_file
    return grpc.ssl_channel_credentials(
        root_certificates=ca_file.read_bytes() if ca_file is not None else None,
        private_key=files.key_file.read_bytes(), certificate_chain=files.cert_file.read_bytes())


def is_loopback(host: str) -> bool:
    """Whether `host` (as written in an address) reaches this machine only: 127.x, ::1, localhost,
    or a name that resolves only to those. A wildcard ("", 0.0.0.0, ::) binds every interface; a
    name that does not resolve counts as open (the warning errs on the safe side)."""
    bare = socket_host(host)
    if bare is None:
        return False
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        pass
    if bare.lower() == "localhost":
        return True
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    return bool(resolved) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in resolved)


def plaintext_warnings(config: NodeConfig) -> list[str]:
    """One line for each port this node opens beyond its own machine without TLS."""
    warnings = []
    ports = [("clients", config.listen, config.security.client, "can read and write", "--cert-file/--key-file")]
    if config.peer_listen_address is not None:
        ports.append(("peers", config.peer_listen_address, config.security.peer, "can pose as a member",
                      "--peer-cert-file/--peer-key-file"))
    for who, address, files, harm, flags in ports:
        if not files.enabled and not is_loopback(split_address(address)[0]):
            warnings.append(f"{who} on {address} are not encrypted or authenticated: anyone who reaches the port "
                            f"{harm}; give {flags} (docs/security.md)")
    return warnings


def warn_if_plaintext(config: NodeConfig) -> None:
    for warning in plaintext_warnings(config):
        log.warning("node %s: %s", config.node_id, warning)
