"""`raftkv certs`: a private CA and certificates for trying TLS out (docs/security.md).

    raftkv certs ./certs --members n1,n2,n3 --hosts 127.0.0.1,localhost --clients root,alice

writes ca.pem / ca-key.pem (made once, reused on later runs), and for each member and client NAME
NAME.pem / NAME-key.pem. A member's certificate names the member id (CN and a DNS SAN, which is
what the peer port checks a member's messages against) and each of --hosts (the names clients and
members dial it by) except the other members' ids, since a certificate that names a member id
speaks for that member; it serves and dials, so it holds both the server and client usages. A
client's certificate names the user (CN), which is who the client is when the node requires client
certificates. Keys are ECDSA P-256. Production clusters should use their own PKI."""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kv.tools.arguments import Formatter, positive_int

CA_NAME = "ca"
DEFAULT_DAYS = 365
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True, slots=True)
class CertFiles:
    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))


def ensure_ca(directory: Path, days: int = DEFAULT_DAYS, name: str | None = None) -> CertFiles:
    """The CA in `directory` (ca.pem, ca-key.pem), made when absent, named `name`, by default
    "raftkv CA" and 8 random hex digits: two CAs trusted side by side, as while moving to a new
    one, need names of their own (OpenSSL finds a certificate's issuer by name)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(directory / f"{CA_NAME}.pem", directory / f"{CA_NAME}-key.pem")
    if files.cert.exists() and files.key.exists():
        return files
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(name if name is not None else f"raftkv CA {secrets.token_hex(4)}")
    cert = (_validity(x509.CertificateBuilder(), days).subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write_key(key, files.key)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def _subject_names(names: list[str]) -> list[x509.GeneralName]:
    general: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # in order, once each
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(name.strip("[]"))))
        except ValueError:
            general.append(x509.DNSName(name))
    return general


def issue(directory: Path, name: str, hosts: list[str] | tuple[str, ...] = (), server: bool = True,
          days: int = DEFAULT_DAYS) -> CertFiles:
    """A certificate for `name` (CN, and a DNS SAN when `server`) signed by the CA in `directory`,
    written as NAME.pem and NAME-key.pem. `server`: a member's (serves and dials, named by its id
    and `hosts`); otherwise a client's (dials only, named by its CN)."""
    ca_files = ensure_ca(directory, days)
    ca_key = serialization.load_pem_private_key(ca_files.key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca_files.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (_validity(x509.CertificateBuilder(), days).subject_name(_name(name)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(_subject_names([name, *hosts])), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    files = CertFiles(directory / f"{name}.pem", directory / f"{name}-key.pem")
    _write_key(key, files.key)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def _names(text: str) -> list[str]:
    return [n for n in (part.strip() for part in text.split(",")) if n]


def add_certs_command(commands: Any) -> None:
    certs = commands.add_parser(
        "certs", formatter_class=Formatter, help="make a CA and certificates to try TLS with",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    certs.add_argument("directory", type=Path, help="where the files go (created if missing)")
    certs.add_argument("--members", type=_names, default=[], metavar="ID,...",
                       help="member ids: one certificate each, for both --cert-file and --peer-cert-file")
    certs.add_argument("--hosts", type=_names, default=list(DEFAULT_HOSTS), metavar="HOST,...",
                       help="names and IP addresses members are reached at (every member's certificate names all)")
    certs.add_argument("--clients", type=_names, default=[], metavar="USER,...",
                       help="client certificates, one per user name (its CN)")
    certs.add_argument("--days", type=positive_int, default=DEFAULT_DAYS, help="how long the certificates are valid")
    certs.set_defaults(run=_run, command_parser=certs)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not args.members and not args.clients:
        parser.error("name at least one certificate to make: --members and/or --clients")
    ca = ensure_ca(args.directory, args.days)
    print(f"CA: {ca.cert}")
    for member in args.members:
        hosts = [h for h in args.hosts if h not in args.members]
        files = issue(args.directory, member, hosts, server=True, days=args.days)
        print(f"member {member}: {files.cert} {files.key}")
    for client in args.clients:
        files = issue(args.directory, client, server=False, days=args.days)
        print(f"client {client}: {files.cert} {files.key}")
    return 0
