"""The embedded API: a node in this process, used through kv.Client's methods without a gRPC hop,
closed and reopened with its data intact; and its gRPC server reachable by a remote client."""
from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from kv import TLS, Client, embedded, errors
from kv.tools.certs import DEFAULT_HOSTS, ensure_ca, issue
from kv.tools.cluster_up import free_ports
from raftkv_proto import kv_pb2, kv_pb2_grpc
from raft.core.config import CoreConfig
from raft.node.config import Security, StorageConfig, TLSFiles, Tuning

FAST = CoreConfig(election_timeout_ms=300, heartbeat_interval_ms=30, lease_ms=250, push_timeout_ms=300)


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (kv.tools.cluster_up.free_ports),
    where no other process's connection takes it by chance before the test listens on it."""
    return free_ports(1)[0]


# Quick ticks and small stores: NodeConfig's layers as an embedding service passes them.
SMALL = dict(tuning=Tuning(tick_interval_ms=5), storage=StorageConfig(log_max_bytes=64 << 20, state_max_bytes=64 << 20))


def open_node(data_dir: Path, port: int) -> embedded.EmbeddedNode:
    return embedded.open(data_dir, listen=f"127.0.0.1:{port}", core=FAST, **SMALL)


def test_put_get_delete_scan_batch_close_reopen(tmp_path: Path) -> None:
    port = free_port()
    with open_node(tmp_path, port) as db:
        index = db.put(b"user/1", b"alice")  # waits for the election within the timeout
        assert index >= 1
        db.put("user/2", "bob")
        db.put(b"other", b"x")
        assert db.get(b"user/1") == b"alice"
        assert db.get(b"user/1", consistency="stale") == b"alice"
        assert db.get(b"user/1", consistency="lease") == b"alice"
        assert db.get(b"missing") is None
        assert db.scan(prefix=b"user/") == [(b"user/1", b"alice"), (b"user/2", b"bob")]
        assert db.scan(start=b"o", end=b"user/2") == [(b"other", b"x"), (b"user/1", b"alice")]
        assert db.scan(limit=1) == [(b"other", b"x")]
        assert db.scan(prefix=b"user/", keys_only=True) == [(b"user/1", b""), (b"user/2", b"")]
        assert db.delete(b"other") is True
        assert db.delete(b"other") is False
        assert db.batch(puts={b"a": b"1", b"user/1": b"alice2"}, deletes=[b"user/2"]) == [False, True, True]
        with pytest.raises(errors.InvalidArgumentError, match="^key is empty"):
            db.put(b"", b"v")
        with pytest.raises(errors.InvalidArgumentError, match="32768-byte key limit"):
            db.get(b"k" * 40000)
        [status] = db.status()
        assert (status["id"], status["role"], status["leader"]) == ("n1", "leader", "n1")
        assert status["applied_index"] == status["commit_index"] >= index
        # The node's gRPC server serves remote clients at the same time.
        with grpc.insecure_channel(db.address) as channel:
            reply = kv_pb2_grpc.KVStub(channel).Get(kv_pb2.GetRequest(key=b"a"), timeout=5)
            assert reply.found and reply.value == b"1"
    with pytest.raises(errors.UnavailableError):
        db.get(b"a")  # closed

    with open_node(tmp_path, port) as db:  # reopen: everything acknowledged is still there
        assert db.get(b"user/1") == b"alice2"
        assert db.get(b"a") == b"1"
        assert db.get(b"user/2") is None
        assert db.scan() == [(b"a", b"1"), (b"user/1", b"alice2")]


def test_follower_refuses_writes_with_leader_address(tmp_path: Path) -> None:
    """The not-leader hint carries the leader's advertised client address (here "localhost:PORT",
    while it listens on 127.0.0.1:PORT), never its peer address."""
    peers = {f"n{i}": f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    client_ports = {nid: free_port() for nid in peers}
    nodes = [embedded.open(tmp_path / nid, node_id=nid, listen=f"127.0.0.1:{client_ports[nid]}", peers=peers,
                           advertise_client=f"localhost:{client_ports[nid]}", core=FAST, **SMALL)
             for nid in peers]
    try:
        nodes[0].put(b"k", b"v")  # waits out the election; succeeds only if n1 leads
    except errors.NotLeaderError as e:
        assert e.leader_id in peers and e.leader_address == f"localhost:{client_ports[e.leader_id]}"
        leader = next(n for n in nodes if n.config.node_id == e.leader_id)
        leader.put(b"k", b"v")
    else:
        leader = nodes[0]
    assert leader.address == f"localhost:{client_ports[leader.config.node_id]}"
    for follower in (n for n in nodes if n is not leader):
        with pytest.raises(errors.NotLeaderError) as err:
            follower.delete(b"k")
        assert err.value.leader_address == leader.address
    with Client([leader.address], timeout=5) as client:  # the advertised address reaches it
        assert client.get(b"k") == b"v"
    for n in nodes:
        n.close()


def test_second_node_on_a_taken_port_refuses_to_start(tmp_path: Path) -> None:
    port = free_port()
    with open_node(tmp_path / "a", port) as db:
        with pytest.raises(OSError, match="cannot listen"):
            open_node(tmp_path / "b", port)
        db.put(b"still", b"serving")
        assert db.get(b"still") == b"serving"


def test_stop_does_not_wait_for_idle_client_streams(tmp_path: Path) -> None:
    """A kv.Client keeps its request streams open between calls. Stopping the node must end them
    rather than wait out the shutdown grace (here 60 s; the wait allows 20 s, which only a stop
    that waits for the streams can exceed); a client still gets a clear error afterwards."""
    port = free_port()
    db = open_node(tmp_path, port)
    client = Client([db.address], timeout=5)
    try:
        db.put(b"k", b"v")  # elected
        for _ in range(3):
            assert client.get(b"k") == b"v"
        assert client._streams is not None and client._streams._idle[db.address]  # one open, idle
        db._submit(db._running.stop(grace=60)).result(20)
        with pytest.raises(errors.UnavailableError):
            client.get(b"k")
    finally:
        client.close()
        db.close()


def test_with_auth_enabled_local_calls_are_made_as_the_nodes_user(tmp_path: Path) -> None:
    port = free_port()
    with embedded.open(tmp_path, listen=f"127.0.0.1:{port}", core=FAST, user="alice", password="alice-pw",
                       **SMALL) as db:
        db.put(b"app/1", b"v")  # auth is off: no one is checked
        with Client(db.address, timeout=10) as admin:
            admin.user_add("root", "root-pw")
            admin.user_grant_role("root", "root")
            admin.user_add("alice", "alice-pw")
            admin.role_add("reader")
            admin.role_grant_permission("reader", "app/", prefix=True, perm="read")
            admin.user_grant_role("alice", "reader")
            admin.auth_enable()
        assert db.get(b"app/1") == b"v"
        with pytest.raises(errors.PermissionDeniedError):
            db.put(b"app/2", b"v")
        db._password = "wrong"
        db._token = None
        with pytest.raises(errors.UnauthenticatedError):
            db.get(b"app/1")


def tls_security(certs: Path, client_cert_auth: bool = False) -> Security:
    """TLS on the client port with a member certificate n1 made in `certs`."""
    ca = ensure_ca(certs)
    member = issue(certs, "n1", DEFAULT_HOSTS)
    return Security(client=TLSFiles(member.cert, member.key, ca.cert, client_cert_auth))


def test_an_embedded_node_with_tls_hands_out_clients_that_use_it(tmp_path: Path) -> None:
    security = tls_security(tmp_path / "certs", client_cert_auth=True)
    with embedded.open(tmp_path / "data", listen=f"127.0.0.1:{free_port()}", core=FAST, security=security,
                       **SMALL) as db:
        db.put("local", "1")  # the local API needs no TLS
        assert db.client_tls == TLS(security.client.trusted_ca_file, security.client.cert_file,
                                    security.client.key_file)
        with db.client() as client:  # over the network, with the node's CA and certificate
            client.put("remote", "2")
            assert client.get("local") == b"1"
        assert db.get("remote") == b"2"
        with Client([db.address], timeout=3.0) as plaintext, pytest.raises(errors.UnavailableError, match="TLS: "):
            plaintext.get("local")


def test_a_plaintext_embedded_node_hands_out_plaintext_clients(tmp_path: Path) -> None:
    with open_node(tmp_path, free_port()) as db:
        assert db.client_tls is None
        with db.client() as client:
            client.put("k", "v")
            assert client.get("k") == b"v"


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("127.0.0.1", False)])
def test_a_client_port_open_beyond_loopback_without_tls_is_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str, warned: bool) -> None:
    port = free_port()
    with caplog.at_level(logging.WARNING, logger="kv.server.tls"):
        with embedded.open(tmp_path, listen=f"{host}:{port}", advertise_client=f"127.0.0.1:{port}", core=FAST,
                           **SMALL):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = (f"node n1: clients on {host}:{port} are not encrypted or authenticated: anyone who reaches the "
                "port can read and write; give --cert-file/--key-file (docs/security.md)")
    assert warnings == ([expected] if warned else [])
