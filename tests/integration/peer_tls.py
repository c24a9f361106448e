"""Members that speak mutual TLS to each other (--peer-cert-file ..., docs/security.md), and to
their clients (--cert-file ...), for the integration and fault tests: certificates made in the
test by kv.tools.certs, and revocation lists (--client-crl-file, --peer-crl-file)."""
from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from kv.client.tls import TLS
from kv.tools.certs import ensure_ca, issue
from tests.integration.cluster import Cluster

HOSTS = ("127.0.0.1", "localhost")


def peer_tls_args(certs: Path, member: str, client_cert_auth: bool = True) -> tuple[str, ...]:
    """`raftkv serve`'s peer TLS flags for `member`, its files in `certs`."""
    flags = ("--peer-cert-file", str(certs / f"{member}.pem"), "--peer-key-file", str(certs / f"{member}-key.pem"),
             "--peer-trusted-ca-file", str(certs / "ca.pem"))
    return flags + (("--peer-client-cert-auth",) if client_cert_auth else ())


def use_peer_tls(cluster: Cluster, certs: Path) -> Cluster:
    """A CA and a certificate per member in `certs`, and every member of the (not yet started)
    cluster given the flags to use them, --peer-client-cert-auth included."""
    ensure_ca(certs)
    for node in cluster.nodes.values():
        assert not node.running, f"{node.id} is already running"
        issue(certs, node.id, HOSTS, server=True)
        node.spec = dataclasses.replace(node.spec, extra_args=(*node.spec.extra_args, *peer_tls_args(certs, node.id)))
    return cluster


def use_tls(cluster: Cluster, certs: Path) -> Cluster:
    """TLS on every link: mutual TLS between the members (use_peer_tls), and on their client ports
    with client certificates required (--cert-file, --key-file, --trusted-ca-file,
    --client-cert-auth); the cluster's clients present a certificate of a client "tester"."""
    use_peer_tls(cluster, certs)
    ca = certs / "ca.pem"
    for node in cluster.nodes.values():
        flags = ("--cert-file", str(certs / f"{node.id}.pem"), "--key-file", str(certs / f"{node.id}-key.pem"),
                 "--trusted-ca-file", str(ca), "--client-cert-auth")
        node.spec = dataclasses.replace(node.spec, extra_args=(*node.spec.extra_args, *flags))
    tester = issue(certs, "tester", server=False)
    cluster.client_tls = TLS(ca, tester.cert, tester.key)
    return cluster


def write_crl(ca_directory: Path, revoked: list[Path], path: Path) -> Path:
    """A CRL signed by the CA in `ca_directory` (ca.pem, ca-key.pem) that revokes the certificates
    in `revoked` (PEM files), written to `path` at once (a rename: a member never reads it half
    written)."""
    ca_key = serialization.load_pem_private_key((ca_directory / "ca-key.pem").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((ca_directory / "ca.pem").read_bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
               .last_update(now - datetime.timedelta(minutes=5)).next_update(now + datetime.timedelta(days=1)))
    for cert_file in revoked:
        serial = x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build())
    crl = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    replace_file(path, crl.public_bytes(serialization.Encoding.PEM))
    return path


def replace_file(path: Path, data: bytes) -> None:
    """`path` holds `data` from one moment to the next, as an operator's `mv` of a finished file."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(data)
    staged.replace(path)
