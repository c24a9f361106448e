"""Mutual TLS between members (raft/transport/peer_tls.py) between real sockets on 127.0.0.1:
TLS links carry messages, probes and snapshot streams; a plaintext dialer, a certificate that
names another member than the hello claims (or no member at all) and a listener whose certificate
names another member than the one dialled are all refused before any Raft message is read, with
a reason, logged once. Certificates are made in the test (kv.tools.certs). The tests that touch
the handshake run on both asyncio's loop and uvloop (the node's default)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509

from raftkv_proto import raft_pb2
from raft.node.config import Security, TLSFiles
from raft.node.ports import ClientAddresses
from raft.transport.frames import FrameReader
from raft.transport.peer_listener import PeerListener
from raft.transport.peer_tls import check_names_member, listener_context, names, shown
from raft.transport.peer_protocol import PeerRefused
from kv.tools.certs import ensure_ca, issue
from tests.integration.peer_tls import write_crl
from tests.unit.test_transport import (
    META,
    WAIT_S,
    Node,
    Recorder,
    batch_frame,
    file_chunks,
    heartbeat,
    hello_frame,
    snapshot_info,
    until,
)
from raft.transport.codec import to_proto

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
LISTENER_LOG = "raft.transport.peer_listener"
LINKS_LOG = "raft.transport.peer_links"


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[], Coroutine[Any, Any, None]]], None]:
    """run(main): main() on the loop of the test's parameter, within 60 s."""
    def run_main(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            runner.run(asyncio.wait_for(main(), 60))
    return run_main


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA with members n1..n3 and a client-only certificate for alice (CN alice); and in
    other/ another CA with its own n1."""
    directory = tmp_path_factory.mktemp("certs")
    ensure_ca(directory)
    for member in ("n1", "n2", "n3"):
        issue(directory, member, ["127.0.0.1", "localhost"], server=True)
    issue(directory, "alice", server=False)
    issue(directory / "other", "n1", ["127.0.0.1", "localhost"], server=True)
    return directory


def peer_tls(certs: Path, name: str, client_cert_auth: bool = True, ca: Path | None = None) -> Security:
    """Security with peer TLS from NAME.pem / NAME-key.pem in `certs`, trusting ca.pem there."""
    return Security(peer=TLSFiles(certs / f"{name}.pem", certs / f"{name}-key.pem",
                                  ca or certs / "ca.pem", client_cert_auth))


def listener_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LISTENER_LOG]


async def wait_checks(node: Node, peer: str, times: int) -> None:
    """Let the link to `peer` end `times` more attempts (it dials again after each)."""
    link = node.link(peer)
    for _ in range(times):
        link.checked.clear()
        node.transport.send([heartbeat(1, src=node.config.node_id, dst=peer)])
        await asyncio.wait_for(link.checked.wait(), WAIT_S)


def client_context(certs: Path, name: str | None) -> ssl.SSLContext:
    """A hand-made dialer's TLS: trusts the CA, presents NAME's certificate (None: none)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(certs / "ca.pem")
    if name is not None:
        context.load_cert_chain(certs / f"{name}.pem", certs / f"{name}-key.pem")
    return context


async def tls_exchange(port: int, context: ssl.SSLContext, data: bytes) -> tuple[list[bytes], bool]:
    """As test_transport.raw_exchange, over TLS."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        writer.write(data)
        received = await asyncio.wait_for(reader.read(), WAIT_S)
        return FrameReader(1 << 20).feed(received), reader.at_eof()
    finally:
        writer.close()


# ---- names -------------------------------------------------------------------------------------

def test_a_certificate_names_its_cn_and_dns_sans_and_not_its_ip_sans() -> None:
    cert = {"subject": ((("commonName", "n3"),),),
            "subjectAltName": (("DNS", "n3"), ("IP Address", "127.0.0.1"), ("DNS", "localhost"))}
    assert names(cert) == {"n3", "localhost"}
    assert shown(cert) == "n3 and localhost" and shown(None) == "nothing"
    check_names_member(cert, "n3", "it")
    with pytest.raises(PeerRefused, match="^the certificate names n3 and localhost, not n2$"):
        check_names_member(cert, "n2", "the certificate")
    with pytest.raises(PeerRefused, match="names nothing, not 127.0.0.1"):
        check_names_member(cert | {"subject": ()} | {"subjectAltName": (("IP Address", "127.0.0.1"),)},
                           "127.0.0.1", "it")


# ---- TLS links -----------------------------------------------------------------------------------

def test_tls_links_carry_messages_probes_and_a_snapshot_stream(run: Any, certs: Path) -> None:
    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}, security=peer_tls(certs, "n2"), disk=(7, 6, 120)) as n2:
            async with Node("n1", {"n2": n2.address}, security=peer_tls(certs, "n1")) as n1:
                n1.transport.send([heartbeat(i) for i in range(10)])
                await n1.link_settles("n2", lambda link: link.connection is not None)
                for i in range(10, 100):
                    n1.transport.send([heartbeat(i)])
                await until(lambda: len(n2.inbound.delivered) == 100, n2.inbound.changed)
                assert [m.seq for m in n2.inbound.delivered] == list(range(100))  # type: ignore[attr-defined]
                # Both ends of the link are TLS, and each saw the other's member certificate.
                (accepted,) = n2.transport.listener.connections  # type: ignore[union-attr]
                assert accepted._transport.get_extra_info("ssl_object") is not None
                assert "n1" in names(accepted._transport.get_extra_info("peercert"))
                assert "n2" in names(n1.link("n2").connection.peercert())
                assert n2.transport.client_address("n1") == "client-of-n1.example:7001"
                assert await n1.transport.probe() == {"n2": (7, 6, 120)}
                # The node holds the stream after its first chunk, so the chunks behind it back up
                # (the TLS transport pauses reading) and flow on once it takes them again.
                n2.inbound.gate = asyncio.Event()
                pieces = [bytes([i]) * 70_000 for i in range(20)]
                sending = asyncio.create_task(n1.transport.send_snapshot(
                    "n2", 9, META, snapshot_info(sum(map(len, pieces))), file_chunks(pieces), WAIT_S))
                await until(lambda: n2.inbound.snapshots and n2.inbound.snapshots[0]["chunks"], n2.inbound.changed)
                n1.transport.send([heartbeat(100)])  # meanwhile messages flow on the link's own connection
                await until(lambda: len(n2.inbound.delivered) == 101, n2.inbound.changed)
                assert not sending.done()
                n2.inbound.gate.set()
                assert await sending == (True, "")
                record = n2.inbound.snapshots[0]
                assert record["chunks"] == [c async for c in file_chunks(pieces)]
                assert n1.transport.links.dropped("n2") == 0 and n1.inbound.gone == []

    run(main)


# ---- refused dialers ---------------------------------------------------------------------------

def test_a_plaintext_dialer_is_refused_before_any_frame_and_logged_once(
        run: Any, certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LISTENER_LOG)

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}, security=peer_tls(certs, "n2")) as n2:
            # What a forger would send: a hello under n1's id and a heartbeat of a far higher term.
            reader, writer = await asyncio.open_connection("127.0.0.1", n2.port)
            writer.write(hello_frame("n1", "n2") + batch_frame(to_proto(heartbeat(1, term=1000))))
            assert FrameReader(1 << 20).feed(await asyncio.wait_for(reader.read(), WAIT_S)) == []
            writer.close()
            # A member without --peer-cert-file: refused again and again, logged once.
            async with Node("n1", {"n2": n2.address}) as n1:
                await wait_checks(n1, "n2", 3)
                assert n1.link("n2").connection is None
            assert n2.inbound.delivered == [] and n2.transport.client_address("n1") is None
            lines = listener_lines(caplog)
            assert len(lines) == 1, lines
            assert "refused a peer connection from ('127.0.0.1', " in lines[0]
            assert "TLS handshake failed: " in lines[0] and "(a plaintext peer? one without --peer-cert-file?" in lines[0]

    run(main)


@pytest.mark.parametrize("name, shown_names", [("n3", "n3 and localhost"), ("alice", "alice")],
                         ids=["another-member", "client-only"])
def test_a_certificate_that_does_not_name_the_member_the_hello_claims_is_refused(
        run: Any, certs: Path, caplog: pytest.LogCaptureFixture, name: str, shown_names: str) -> None:
    """n3's certificate (or alice's, who is no member) with a hello from n2: refused with the
    reason, logged once, and nothing reaches the node."""
    caplog.set_level(logging.INFO, logger=LISTENER_LOG)
    caplog.set_level(logging.INFO, logger=LINKS_LOG)
    expected = f"the certificate of this connection names {shown_names}, not n2"

    async def main() -> None:
        async with Node("n1", {"n2": "127.0.0.1:1"}, security=peer_tls(certs, "n1")) as n1:
            frames, closed = await tls_exchange(n1.port, client_context(certs, name), hello_frame(
                "n2", "n1") + batch_frame(to_proto(heartbeat(1, src="n2", dst="n1", term=1000))))
            assert closed and len(frames) == 1
            assert raft_pb2.PeerHelloReply.FromString(frames[0]).refusal == expected
            if name == "n3":  # a member's transport (alice has no server certificate to run one)
                async with Node("n2", {"n1": n1.address}, security=peer_tls(certs, "n3")) as impostor:
                    await wait_checks(impostor, "n1", 3)
                    assert impostor.link("n1").last_refusal == expected
            assert n1.inbound.delivered == [] and n1.transport.client_address("n2") is None
            lines = listener_lines(caplog)
            assert len(lines) == 1 and lines[0].endswith(expected), lines

    run(main)


def test_a_listener_whose_certificate_names_another_member_is_refused_by_the_dialer(
        run: Any, certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """n1 dials n2's address and finds n3's certificate there: no hello, no message, no probe
    answer, no snapshot; the link's refusal says why."""
    caplog.set_level(logging.INFO, logger=LINKS_LOG)

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}, security=peer_tls(certs, "n3")) as wrong:
            async with Node("n1", {"n2": wrong.address}, security=peer_tls(certs, "n1")) as n1:
                await wait_checks(n1, "n2", 3)
                expected = (f"the certificate of {wrong.address} names n3 and localhost, not n2: is {wrong.address} "
                            f"n2's peer address, and n2's --peer-cert-file its own?")
                assert n1.link("n2").last_refusal == expected
                assert [r.getMessage() for r in caplog.records if "refused our connection" in r.getMessage()] == [
                    f"peer n2 at {wrong.address} refused our connection: {expected}"]
                assert await n1.transport.probe() == {}
                ok, why = await n1.transport.send_snapshot("n2", 9, META, snapshot_info(3), file_chunks([b"abc"]),
                                                           WAIT_S)
                assert not ok and why == f"no snapshot for n2: {expected}"
                assert n1.inbound.gone == []  # up, but not who we meant to reach
            assert wrong.inbound.delivered == [] and wrong.inbound.snapshots == []
            assert wrong.transport.client_address("n1") is None  # no hello ever went out

    run(main)


def test_a_tls_dialer_at_a_plaintext_listener_hears_why(run: Any, certs: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LISTENER_LOG)

    async def main() -> None:
        async with Node("n2", {"n1": "127.0.0.1:1"}) as n2:
            async with Node("n1", {"n2": n2.address}, security=peer_tls(certs, "n1")) as n1:
                await wait_checks(n1, "n2", 2)
                refusal = n1.link("n2").last_refusal or ""
                assert refusal.startswith(f"TLS handshake with n2 at {n2.address} failed: "), refusal
                assert refusal.endswith("does n2 run with --peer-cert-file?"), refusal
                ok, why = await n1.transport.send_snapshot("n2", 9, META, snapshot_info(3), file_chunks([b"abc"]),
                                                           WAIT_S)
                assert not ok and why.startswith("TLS handshake with n2"), why
            assert n2.inbound.delivered == []
            lines = listener_lines(caplog)
            assert lines and "speaks plaintext and a TLS client connected to it" in lines[0], lines

    run(main)


def test_certificates_of_another_ca_are_refused_both_ways(run: Any, certs: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LINKS_LOG)

    async def main() -> None:
        foreign = peer_tls(certs / "other", "n1", ca=certs / "other" / "ca.pem")
        async with Node("n2", {"n1": "127.0.0.1:1"}, security=peer_tls(certs, "n2")) as n2:
            # n1 trusts only the other CA: n2's certificate fails its check.
            async with Node("n1", {"n2": n2.address}, security=foreign) as n1:
                await wait_checks(n1, "n2", 1)
                refusal = n1.link("n2").last_refusal or ""
                assert "certificate verify failed" in refusal, refusal
                assert "is n2's --peer-cert-file signed by the CA in our --peer-trusted-ca-file?" in refusal
            # n1 trusts our CA but presents the other CA's certificate: n2 refuses it.
            crossed = Security(peer=TLSFiles(foreign.peer.cert_file, foreign.peer.key_file, certs / "ca.pem", True))
            async with Node("n1", {"n2": n2.address}, security=crossed) as n1:
                await wait_checks(n1, "n2", 1)
                assert n1.link("n2").connection is None
            # TLS 1.3: n1's side of the handshake ended before n2 checked n1's certificate, so n1
            # learns of the refusal as an alert or a close after it, and says what to check.
            assert ("n2 refused our certificate" in caplog.text or
                    "closed before an answer to our hello; does n2 accept our certificate?" in caplog.text), caplog.text
            assert n2.inbound.delivered == []

    run(main)


def test_without_client_cert_auth_a_dialer_without_a_certificate_is_taken_at_its_word(
        run: Any, certs: Path) -> None:
    """etcd's behaviour without --peer-client-cert-auth, documented as such: identity is then not
    bound. A dialer that presents a certificate is still held to it."""
    async def main() -> None:
        async with Node("n1", {"n2": "127.0.0.1:1"}, security=peer_tls(certs, "n1", client_cert_auth=False)) as n1:
            frames, closed = await tls_exchange(n1.port, client_context(certs, None), hello_frame(
                "n2", "n1", purpose=raft_pb2.PROBE))
            assert raft_pb2.PeerHelloReply.FromString(frames[0]).node_id == "n1"
            frames, closed = await tls_exchange(n1.port, client_context(certs, "n3"), hello_frame("n2", "n1"))
            assert raft_pb2.PeerHelloReply.FromString(frames[0]).refusal.endswith("names n3 and localhost, not n2")
            # With client_cert_auth, no certificate is no handshake (TLS 1.3: the dialer may learn it
            # only as a close, after its own side of the handshake ended).
            async with Node("n3", {"n2": "127.0.0.1:1"}, security=peer_tls(certs, "n3")) as n3:
                try:
                    frames, _ = await tls_exchange(n3.port, client_context(certs, None), hello_frame("n2", "n3"))
                except OSError:  # ssl.SSLError included
                    frames = []
                assert frames == [] and n3.inbound.delivered == []

    run(main)


def test_a_tls_listener_takes_one_port_on_every_address_it_binds(run: Any, certs: Path) -> None:
    """As the plaintext listener: "" binds every interface, "localhost" each of its addresses,
    all on the one port that port 0 chose; a port taken is an error that names the flag."""
    async def main() -> None:
        for host in ("", "localhost"):
            listener = PeerListener("n2", "c1", ClientAddresses("client:1"), lambda m: None, Recorder().receive_snapshot,
                                    lambda member, address: None, lambda: (0, 0, 0),
                                    tls=listener_context(peer_tls(certs, "n2").peer))
            port = await listener.start(host, 0)
            try:
                assert listener._server is not None and {s.getsockname()[1] for s in listener._server.sockets} == {port}
                frames, _ = await tls_exchange(port, client_context(certs, "n1"), hello_frame(purpose=raft_pb2.PROBE))
                assert raft_pb2.PeerHelloReply.FromString(frames[0]).node_id == "n2"
                taken = Node("n3", {"n1": "127.0.0.1:1"}, port=port, security=peer_tls(certs, "n3"))
                with pytest.raises(OSError, match=f"cannot listen for peers on 127.0.0.1:{port} \\(--listen-peer\\)"):
                    await taken.transport.start(taken.inbound)
            finally:
                await listener.close()

    run(main)


def test_a_revocation_list_written_while_the_listener_runs_refuses_the_member_it_revokes(
        run: Any, certs: Path, tmp_path: Path) -> None:
    """--peer-crl-file, as etcd's peer listener: a dialer whose certificate the list names is
    refused at its hello (the list read again when it changes); another member is served."""
    crl = write_crl(certs, [], tmp_path / "crl.pem")
    security = Security(peer=dataclasses.replace(peer_tls(certs, "n1").peer, crl_file=crl))
    revoked = x509.load_pem_x509_certificate((certs / "n2.pem").read_bytes()).serial_number

    async def main() -> None:
        async with Node("n1", {"n2": "127.0.0.1:1", "n3": "127.0.0.1:1"}, security=security) as n1:
            probe = hello_frame("n2", "n1", purpose=raft_pb2.PROBE)
            frames, _ = await tls_exchange(n1.port, client_context(certs, "n2"), probe)
            assert raft_pb2.PeerHelloReply.FromString(frames[0]).node_id == "n1"
            write_crl(certs, [certs / "n2.pem"], crl)
            frames, closed = await tls_exchange(n1.port, client_context(certs, "n2"), probe)
            assert closed and raft_pb2.PeerHelloReply.FromString(frames[0]).refusal == (
                f"the certificate of this connection: certificate serial {revoked:x} is revoked (--peer-crl-file)")
            frames, _ = await tls_exchange(n1.port, client_context(certs, "n3"),
                                           hello_frame("n3", "n1", purpose=raft_pb2.PROBE))
            assert raft_pb2.PeerHelloReply.FromString(frames[0]).node_id == "n1"

    run(main)
