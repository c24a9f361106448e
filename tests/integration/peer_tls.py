"""Members that speak mutual TLS to each other (--peer-cert-file ..., docs/security.md), and to
their clients (--cert-file ...), for the integration and fault tests: certificates made in the
test by kv.tools.certs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

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
