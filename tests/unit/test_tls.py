"""TLS pieces without node processes: the certificates `raftkv certs` makes (loaded and verified by
Python's own ssl module), kv.TLS, what a client is told for each kind of handshake failure (against
real in-process gRPC servers, since the hints follow what gRPC reports), and which ports
`raftkv serve` warns about."""
from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kv import TLS, Client, embedded
from kv.errors import UnavailableError
from kv.server.tls import is_loopback, plaintext_warnings
from kv.tools.certs import DEFAULT_HOSTS, CertFiles, ensure_ca, issue
from kv.tools.cluster_up import free_ports
from raft.node.config import NodeConfig, Security, TLSFiles
from raftkv_proto import kv_pb2_grpc

REFUSED_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class Certs:
    ca: CertFiles
    member: CertFiles  # n1: 127.0.0.1 and localhost
    alice: CertFiles  # a client's
    rogue_ca: CertFiles  # another CA, same subject name as the first
    mallory: CertFiles  # a client's, signed by the rogue CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    rogue = directory / "rogue"
    return Certs(ensure_ca(directory), issue(directory, "n1", DEFAULT_HOSTS), issue(directory, "alice", server=False),
                 ensure_ca(rogue), issue(rogue, "mallory", server=False))


# ---- raftkv certs --------------------------------------------------------------------------------

def handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> ssl.SSLObject:
    """A TLS handshake between the two contexts in memory; the client's SSLObject once it is done.
    Raises ssl.SSLError when either side refuses."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(from_server, from_client, server_hostname=server_hostname)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        to_server.write(from_client.read())
        from_server.write(to_client.read())
        if all(done.values()):
            return client_side
    raise AssertionError("the handshake did not finish")


def server_context(member: CertFiles, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(member.cert, member.key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: Path, own: CertFiles | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if own is not None:
        context.load_cert_chain(own.cert, own.key)
    return context


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "n1"])
def test_a_member_certificate_verifies_against_the_ca_for_each_name_it_carries(certs: Certs, host: str) -> None:
    tls = handshake(server_context(certs.member), client_context(certs.ca.cert), host)
    assert dict(x[0] for x in tls.getpeercert()["subject"])["commonName"] == "n1"


def test_a_member_certificate_does_not_verify_for_another_host_or_against_another_ca(certs: Certs) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(server_context(certs.member), client_context(certs.ca.cert), "n2")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_context(certs.member), client_context(certs.rogue_ca.cert), "127.0.0.1")


def test_a_client_certificate_is_accepted_by_a_server_requiring_one_of_its_ca(certs: Certs) -> None:
    handshake(server_context(certs.member, certs.ca.cert), client_context(certs.ca.cert, certs.alice), "n1")
    with pytest.raises(ssl.SSLError):
        handshake(server_context(certs.member, certs.ca.cert), client_context(certs.ca.cert, certs.mallory), "n1")


def test_the_certificates_carry_the_documented_names_and_usages(certs: Certs) -> None:
    member = x509.load_pem_x509_certificate(certs.member.cert.read_bytes())
    sans = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert member.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "n1"
    assert sans.get_values_for_type(x509.DNSName) == ["n1", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert set(member.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}

    alice = x509.load_pem_x509_certificate(certs.alice.cert.read_bytes())
    assert alice.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    assert list(alice.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        alice.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert oct(certs.alice.key.stat().st_mode & 0o777) == "0o600"


def test_the_ca_is_made_once_and_reused(certs: Certs) -> None:
    assert ensure_ca(certs.ca.cert.parent) == certs.ca
    assert ensure_ca(certs.ca.cert.parent).cert.read_bytes() == certs.ca.cert.read_bytes()


# ---- kv.TLS ----------------------------------------------------------------------------------

def test_tls_from_env_reads_the_three_variables_and_is_none_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("RAFTKV_CACERT", "RAFTKV_CERT", "RAFTKV_KEY"):
        monkeypatch.delenv(variable, raising=False)
    assert TLS.from_env() is None
    monkeypatch.setenv("RAFTKV_CACERT", "/certs/ca.pem")
    assert TLS.from_env() == TLS(Path("/certs/ca.pem"))
    monkeypatch.setenv("RAFTKV_CERT", "/certs/alice.pem")
    monkeypatch.setenv("RAFTKV_KEY", "/certs/alice-key.pem")
    assert TLS.from_env() == TLS(Path("/certs/ca.pem"), Path("/certs/alice.pem"), Path("/certs/alice-key.pem"))


def test_tls_wants_a_certificate_and_its_key_together() -> None:
    with pytest.raises(ValueError, match="together"):
        TLS("ca.pem", cert_file="alice.pem")
    with pytest.raises(ValueError, match="together"):
        TLS(key_file="alice-key.pem")


def test_a_file_that_cannot_be_read_is_named_when_the_client_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"ca_file \\(--cacert\\) {tmp_path}/missing.pem: No such file"):
        Client("127.0.0.1:1", tls=TLS(tmp_path / "missing.pem"))


# ---- what a failed handshake tells the user -----------------------------------------------------

@dataclass(frozen=True)
class Server:
    address: str


def serve(certs: Certs, tls: bool, client_cert_auth: bool = False,
          member: CertFiles | None = None) -> Iterator[Server]:
    """An in-process gRPC server with the KV service (unimplemented: every call that reaches it
    fails UNIMPLEMENTED, which shows the connection itself was made)."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    kv_pb2_grpc.add_KVServicer_to_server(kv_pb2_grpc.KVServicer(), server)
    member = member or certs.member
    if tls:
        credentials = grpc.ssl_server_credentials([(member.key.read_bytes(), member.cert.read_bytes())],
                                                  root_certificates=certs.ca.cert.read_bytes(),
                                                  require_client_auth=client_cert_auth)
        port = server.add_secure_port("127.0.0.1:0", credentials)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield Server(f"127.0.0.1:{port}")
    finally:
        server.stop(None)


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[Server]:
    yield from serve(certs, tls=True)


@pytest.fixture(scope="module")
def mtls_server(certs: Certs) -> Iterator[Server]:
    yield from serve(certs, tls=True, client_cert_auth=True)


@pytest.fixture(scope="module")
def plaintext_server(certs: Certs) -> Iterator[Server]:
    yield from serve(certs, tls=False)


def refusal(address: str, tls: TLS | None) -> str:
    """The error a Client gets from `address`."""
    with Client([address], timeout=REFUSED_TIMEOUT_S, tls=tls, streams=False) as client:
        with pytest.raises(UnavailableError) as refused:
            client.get("k")
    return str(refused.value)


def test_a_plaintext_client_of_a_tls_node_is_told_to_give_the_ca(tls_server: Server) -> None:
    assert "if it serves TLS (--cert-file), give --cacert" in refusal(tls_server.address, None)


def test_a_tls_client_of_a_plaintext_node_is_told_it_does_not_speak_tls(plaintext_server: Server,
                                                                        certs: Certs) -> None:
    assert "the node does not speak TLS" in refusal(plaintext_server.address, TLS(certs.ca.cert))


def test_a_client_trusting_another_ca_is_told_to_check_it(tls_server: Server, certs: Certs) -> None:
    message = refusal(tls_server.address, TLS(certs.rogue_ca.cert))
    assert "(TLS: the node's certificate was not accepted: is --cacert the CA that signed" in message


def test_a_client_without_a_certificate_is_told_the_node_may_require_one(mtls_server: Server, certs: Certs) -> None:
    assert "if it requires client certificates (--client-cert-auth), give --cert/--key" in refusal(
        mtls_server.address, TLS(certs.ca.cert))


def test_a_client_with_a_foreign_certificate_is_told_to_check_it(mtls_server: Server, certs: Certs) -> None:
    message = refusal(mtls_server.address, TLS(certs.ca.cert, certs.mallory.cert, certs.mallory.key))
    assert "if it requires client certificates, is --cert signed by the CA it trusts" in message


def test_a_client_dialling_a_name_the_certificate_lacks_is_told_so(certs: Certs) -> None:
    only_localhost = issue(certs.ca.cert.parent, "n9", ["localhost"])
    for server in serve(certs, tls=True, member=only_localhost):
        assert "does not name the host dialled" in refusal(server.address, TLS(certs.ca.cert))


def test_each_answer_of_a_timed_out_call_keeps_its_tls_hint(tls_server: Server, certs: Certs) -> None:
    """The error of a call that ran out of time sums up what each endpoint answered; a TLS
    mismatch must not read there as a member that is down."""
    message = refusal(tls_server.address, TLS(certs.rogue_ca.cert))
    assert message.startswith("no node served the request within")
    assert "is the member running?" not in message


def test_status_of_a_refusing_node_carries_the_hint(tls_server: Server) -> None:
    with Client([tls_server.address], timeout=REFUSED_TIMEOUT_S) as client:
        (status,) = client.status()
    assert "give --cacert" in status["error"]


def test_the_right_ca_connects(tls_server: Server, certs: Certs) -> None:
    with Client([tls_server.address], timeout=REFUSED_TIMEOUT_S, tls=TLS(certs.ca.cert)) as client:
        (status,) = client.status()
    assert "UNIMPLEMENTED" in status["error"]  # the call reached the (empty) service: TLS worked


# ---- the warning of `raftkv serve` --------------------------------------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("", False), ("[::]", False), ("192.168.1.20", False), ("no-such-host.invalid", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_warnings_name_each_port_open_beyond_loopback_without_tls(certs: Certs) -> None:
    peers = {"n1": "0.0.0.0:7101", "n2": "10.0.0.2:7101"}
    config = NodeConfig(listen="0.0.0.0:7001", advertise_client="10.0.0.1:7001", peers=peers)
    assert plaintext_warnings(config) == [
        "clients on 0.0.0.0:7001 are not encrypted or authenticated: anyone who reaches the port can read and "
        "write; give --cert-file/--key-file (docs/security.md)",
        "peers on 0.0.0.0:7101 are not encrypted or authenticated: anyone who reaches the port can pose as a "
        "member; give --peer-cert-file/--peer-key-file (docs/security.md)"]
    config.security = Security(client=TLSFiles(certs.member.cert, certs.member.key))
    assert [w.split(" ", 1)[0] for w in plaintext_warnings(config)] == ["peers"]
    assert plaintext_warnings(NodeConfig(listen="127.0.0.1:7001", peers={"n1": "127.0.0.1:7101",
                                                                         "n2": "127.0.0.1:7102"})) == []


# ---- every server of a node's group ---------------------------------------------------------------

CONNECTIONS = 40  # the kernel spreads connections over the group's servers (SO_REUSEPORT)


def test_every_server_on_a_tls_nodes_port_speaks_tls_only(certs: Certs, tmp_path: Path) -> None:
    """A node's gRPC servers share its port and the kernel hands each connection to any of them:
    a server of the group left in plaintext would take a share of the plaintext clients."""
    security = Security(client=TLSFiles(certs.member.cert, certs.member.key, certs.ca.cert))
    with embedded.open(tmp_path, listen=f"127.0.0.1:{free_ports(1)[0]}", security=security) as db:
        assert db.config.tuning.grpc_servers > 1
        db.put("k", "v")
        secure = [Client([db.address], timeout=5.0, tls=TLS(certs.ca.cert)) for _ in range(CONNECTIONS)]
        plain = [Client([db.address], timeout=REFUSED_TIMEOUT_S) for _ in range(CONNECTIONS)]
        try:
            assert all("error" not in c.status()[0] for c in secure)
            assert all("give --cacert" in c.status()[0]["error"] for c in plain)
        finally:
            for client in secure + plain:
                client.close()


def test_two_cas_made_apart_have_names_of_their_own_so_both_can_be_trusted_at_once(tmp_path: Path) -> None:
    """While a cluster moves to a new CA its members trust a bundle of both, and a verifier finds a
    certificate's issuer in it by name: with both CAs named alike, the new CA's certificates would
    be checked against the old CA's key."""
    cas = {directory: ensure_ca(tmp_path / directory) for directory in ("old", "new")}
    loaded = [x509.load_pem_x509_certificate(ca.cert.read_bytes()) for ca in cas.values()]
    assert loaded[0].subject != loaded[1].subject
    for directory in cas:
        member = x509.load_pem_x509_certificate(issue(tmp_path / directory, "n1", DEFAULT_HOSTS).cert.read_bytes())
        (issuer,) = [ca for ca in loaded if ca.subject == member.issuer]  # the one the bundle's lookup finds
        member.verify_directly_issued_by(issuer)
