"""Mutual TLS between members (docs/security.md, "Mutual TLS between members"; decision 0060).

With `--peer-cert-file`, `--peer-key-file` and `--peer-trusted-ca-file`, every connection on the
peer port is TLS: the MESSAGES links, the PROBEs and the snapshot streams. A member's identity is
its member id, named by its certificate (the CN or a DNS SAN, as `raftkv certs` writes them):

- the listener takes a hello only from a connection whose verified certificate names the hello's
  from_id (with `--peer-client-cert-auth` every dialer must present one; without it a dialer may
  present none, and its hello is then taken under whatever member id it claims, as etcd does);
- the dialer talks only to a listener whose verified certificate names the member it meant to
  reach.

Why the member id and not the dialled host name: members reach each other by whatever address
their --peers entry says - an IP, a load balancer, a fault proxy in the tests - and several
members may share one name (all of `raftkv certs`' member certificates name every --hosts entry).
The address says where the bytes go; the member id is who answers, and it is what each Raft
message claims. So the dialer checks the member id (after the chain, against the trusted CA) and
not the address: a certificate need not name the IP it is reached at, and a certificate that names
the IP but another member is refused.

The files are read again when they change (raft/transport/tls_reload.py): the listener's context per
accepted connection, the dialer's per dial; links already up keep the files they were made with.
With --peer-crl-file the listener refuses a dialer whose certificate the list revokes, as etcd's
peer listener does (the dialing side checks no CRL, in etcd neither)."""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from raft.node.config import TLSFiles
from raft.transport.peer_protocol import PeerRefused
from raft.transport.tls_reload import Reloading, Revocations, serving_context

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2

PeerCert = dict[str, Any]


def listener_context(files: TLSFiles) -> ssl.SSLContext:
    """The listener's side: our certificate; a dialer's certificate checked against
    trusted_ca_file - required with client_cert_auth, else checked when one is presented (so a
    member that presents its certificate is still held to its member id)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    _load(context, files)
    context.verify_mode = ssl.CERT_REQUIRED if files.client_cert_auth else ssl.CERT_OPTIONAL
    return context


def dial_context(files: TLSFiles) -> ssl.SSLContext:
    """The dialer's side: the listener's certificate checked against trusted_ca_file, and ours
    presented (a listener with client_cert_auth accepts nothing else). No hostname check: the
    member id is checked instead (check_names_member, and this module's docstring)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_VERSION
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    _load(context, files)
    return context


@dataclass(frozen=True, slots=True)
class PeerContexts:
    listening: ssl.SSLContext
    dialing: ssl.SSLContext


class ReloadingPeerTLS:
    """Both sides' contexts, built again from the files once they change (one check of the files
    and one warning for both when they do not load)."""

    def __init__(self, files: TLSFiles) -> None:
        paths = [path for path in (files.cert_file, files.key_file, files.trusted_ca_file) if path is not None]
        self._contexts = Reloading(paths, lambda: PeerContexts(listener_context(files), dial_context(files)),
                                   "peer certificate files")

    def listener_context(self) -> ssl.SSLContext:
        """The context to start the listener with: each connection gets the files as they are then."""
        return serving_context(lambda: self._contexts.current().listening)

    def dial_context(self) -> ssl.SSLContext:
        """The context for a dial now."""
        return self._contexts.current().dialing


def peer_revocations(files: TLSFiles) -> Revocations | None:
    """The revocations of --peer-crl-file, None without one."""
    return None if files.crl_file is None else Revocations(files.crl_file, "--peer-crl-file")


def _load(context: ssl.SSLContext, files: TLSFiles) -> None:
    """Our certificate and key, and the CA to check the other side against; ValueError naming the
    files when they do not load (a cert and key that do not match, a file that is not PEM)."""
    assert files.cert_file is not None and files.key_file is not None and files.trusted_ca_file is not None
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"peer_cert_file {files.cert_file} with peer_key_file {files.key_file}: cannot load "
                         f"them as a certificate and its key: {e}") from None
    try:
        context.load_verify_locations(files.trusted_ca_file)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"peer_trusted_ca_file {files.trusted_ca_file}: cannot load it as PEM certificates: "
                         f"{e}") from None


def _ordered_names(peercert: PeerCert | None) -> list[str]:
    """The CN(s), then the DNS SANs, once each."""
    if not peercert:
        return []
    found = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]
    found += [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    return list(dict.fromkeys(found))


def names(peercert: PeerCert | None) -> set[str]:
    """What a verified certificate (ssl's getpeercert() form) names: its CN and DNS SANs."""
    return set(_ordered_names(peercert))


def shown(peercert: PeerCert | None) -> str:
    """The names, for a person: "n3", "n3 and localhost", "n3, a and b", "nothing"."""
    found = _ordered_names(peercert)
    if not found:
        return "nothing"
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} and {found[-1]}"


def check_not_revoked(peercert: PeerCert | None, revocations: Revocations | None) -> None:
    """PeerRefused when the verified certificate's serial is in the revocation list."""
    why = None if revocations is None else revocations.refusal_of(peercert)
    if why is not None:
        raise PeerRefused(f"the certificate of this connection: {why}")


def check_names_member(peercert: PeerCert | None, member: str, whose: str, hint: str = "") -> None:
    """PeerRefused ("{whose} names n3, not n2{hint}") unless the certificate names `member`."""
    if member not in names(peercert):
        raise PeerRefused(f"{whose} names {shown(peercert)}, not {member}{hint}")


def handshake_refusal(member: str, address: str, error: ssl.SSLError) -> PeerRefused:
    """Why dialling `member` at `address` with TLS failed, with what to check."""
    reason = error.reason or ""
    if isinstance(error, ssl.SSLCertVerificationError):
        hint = f"is {member}'s --peer-cert-file signed by the CA in our --peer-trusted-ca-file?"
    elif "ALERT" in reason:
        hint = (f"{member} refused our certificate: is our --peer-cert-file signed by the CA in its "
                f"--peer-trusted-ca-file?")
    else:
        hint = f"does {member} run with --peer-cert-file?"
    return PeerRefused(f"TLS handshake with {member} at {address} failed: {error}: {hint}")
