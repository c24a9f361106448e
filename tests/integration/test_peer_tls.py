"""Mutual TLS between members on real processes (docs/security.md, "Mutual TLS between members"):
three members with --peer-cert-file, --peer-key-file, --peer-trusted-ca-file and
--peer-client-cert-auth elect a leader and replicate; and the forgery of issue 26 - a hello under a
member's id, then an APPEND and a heartbeat from a far higher term - is refused on every member,
whether it comes in plaintext or over TLS with another member's certificate, and changes nothing:
term, leader and data stay as they were."""
from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from kv import Client
from raftkv_proto import raft_pb2
from raft.core.messages import HeartbeatRequest, PushRequest, PushType
from raft.core.types import Entry, EntryType
from raft.transport.codec import encode_batch
from raft.transport.frames import frame
from statemachine.commands import encode_command, put_op
from tests.integration.cluster import STEADY_TIMING, Cluster, wait_until
from tests.integration.peer_tls import use_peer_tls
from tests.integration.peer_wire import assert_closed, connect, hello_frame, read_frame

KEYS = [f"tls/{i}".encode() for i in range(20)]
FORGED_KEY = b"forged"


@pytest.fixture
def tls_cluster(make_cluster: Callable[..., Cluster], tmp_path: Path) -> Cluster:
    # The test checks that no forged message moved the term: steady timing, no spurious election.
    cluster = use_peer_tls(make_cluster(3, extra_args=STEADY_TIMING, start=False), tmp_path / "certs")
    cluster.start()
    return cluster


def forged_batch(claimed: str, target: str, term: int, last_index: int, last_term: int) -> bytes:
    """What a forger sends as `claimed`, encoded as a real member encodes it: an APPEND of a put
    committed at once, and a heartbeat, both from a far higher term."""
    append = PushRequest(src=claimed, dst=target, term=term, type=PushType.APPEND, pre_index=last_index,
                         pre_term=last_term, commit_index=last_index + 1,
                         entries=[Entry(last_index + 1, term, EntryType.NORMAL,
                                        encode_command([put_op(FORGED_KEY, b"owned")]))])
    heartbeat = HeartbeatRequest(src=claimed, dst=target, term=term, commit_index=last_index + 1, seq=1)
    return frame(encode_batch([append, heartbeat]))


def read_to_end(sock: socket.socket) -> bytes:
    """What the node sends before it closes; a reset counts as the end."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def tls_connect(cluster: Cluster, node_id: str, certs: Path, as_member: str) -> ssl.SSLSocket:
    """A TLS connection to `node_id`'s peer port presenting `as_member`'s certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(certs / "ca.pem")
    context.load_cert_chain(certs / f"{as_member}.pem", certs / f"{as_member}-key.pem")
    return context.wrap_socket(connect(cluster, node_id))


def test_members_with_mutual_tls_elect_replicate_and_refuse_forged_peers(tls_cluster: Cluster,
                                                                         tmp_path: Path) -> None:
    cluster = tls_cluster
    certs = tmp_path / "certs"
    leader = cluster.wait_for_leader()
    client = cluster.client()
    for key in KEYS:
        client.put(key, key + b"-value")
    written = cluster.status(leader)
    for node in cluster.nodes:
        cluster.wait_applied(node, written["commit_index"])
    before = cluster.statuses()
    cluster_id, term = written["cluster_id"], written["term"]
    members = sorted(cluster.nodes)

    for i, target in enumerate(members):
        claimed, certificate = members[(i + 1) % 3], members[(i + 2) % 3]
        forged = forged_batch(claimed, target, term + 100, before[target]["last_index"], term)
        # In plaintext: the TLS handshake fails; not a byte comes back, and the hello is never read.
        with connect(cluster, target) as sock:
            sock.sendall(hello_frame(cluster_id, claimed, target) + forged)
            assert read_to_end(sock) == b""
        # Over TLS with another member's certificate: the hello is refused with the reason.
        with tls_connect(cluster, target, certs, certificate) as sock:
            sock.sendall(hello_frame(cluster_id, claimed, target) + forged)
            reply = raft_pb2.PeerHelloReply.FromString(read_frame(sock))
            assert reply.refusal == (f"the certificate of this connection names {certificate} and localhost, "
                                     f"not {claimed}") and not reply.node_id
            assert_closed(sock)

    after = cluster.statuses()
    assert {n: (s["term"], s["leader"]) for n, s in after.items()} == {n: (term, leader) for n in members}
    assert after[leader]["role"] == "leader"
    assert client.get(FORGED_KEY) is None
    for node in members:  # every replica, as it has it
        with Client([cluster.nodes[node].address], timeout=5.0) as local:
            assert local.get(FORGED_KEY, consistency="stale") is None
            assert [local.get(key, consistency="stale") for key in KEYS] == [key + b"-value" for key in KEYS]
        log = cluster.nodes[node].log_path.read_text()
        assert "TLS handshake failed: " in log and "a plaintext peer?" in log, cluster.nodes[node].log_tail()
        assert "the certificate of this connection names" in log
    # The cluster still takes writes.
    client.put(b"tls/after", b"yes")
    assert wait_until("the write after the forgeries", lambda: client.get(b"tls/after")) == b"yes"
