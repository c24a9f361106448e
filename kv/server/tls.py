"""TLS on a node's client port (--listen): the gRPC server credentials of --cert-file, --key-file,
--trusted-ca-file and --client-cert-auth, the credentials a member dials the other members' client
ports with (its state checks ask their Status), and the warning for a port open to the network
without TLS (docs/security.md)."""
from __future__ import annotations

import ipaddress
import logging
import socket

import grpc

from raft.node.config import NodeConfig, Security, TLSFiles
from raft.transport.address import socket_host, split_address

log = logging.getLogger(__name__)


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials | None:
    """The client port's credentials; None when it speaks plaintext (no --cert-file)."""
    if not files.enabled:
        return None
    assert files.cert_file is not None and files.key_file is not None  # TLSFiles.check: together
    return grpc.ssl_server_credentials(
        [(files.key_file.read_bytes(), files.cert_file.read_bytes())],
        root_certificates=files.trusted_ca_file.read_bytes() if files.trusted_ca_file is not None else None,
        require_client_auth=files.client_cert_auth)


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
