"""The fault proxies on their own, against a local echo server: each mode does what it says."""
from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from kv.tools.cluster_up import free_ports
from tests.faults.proxy import BLACKHOLE, HEALTHY, REJECT, DownClose, LinkFault, ProxyNetwork, flaky

SHORT_S = 0.3


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass  # the proxy reset us: that is what some tests do


@pytest.fixture
def network() -> Iterator[ProxyNetwork]:
    """Members a and b, both "listening" on one echo server: link (a, b) reaches it."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    net = ProxyNetwork({"a": address, "b": address}, seed=1).start()
    yield net
    net.close()
    server.shutdown()
    server.server_close()


def connect(net: ProxyNetwork, src: str = "a", dst: str = "b") -> socket.socket:
    host, port = net.peers_for(src)[dst].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=2)
    sock.settimeout(SHORT_S)
    return sock


def echo(sock: socket.socket, payload: bytes = b"ping") -> bytes:
    sock.sendall(payload)
    received = b""
    while len(received) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_peers_name_the_node_itself_directly_and_others_by_proxy(network: ProxyNetwork) -> None:
    peers = network.peers_for("a")
    assert peers["a"] == network.targets["a"]
    assert peers["b"] == network.links[("a", "b")].address != network.targets["b"]
    assert network.real_address(peers["b"]) == network.targets["b"]


def test_pass_forwards_both_ways(network: ProxyNetwork) -> None:
    with connect(network) as sock:
        assert echo(sock, b"hello" * 1000) == b"hello" * 1000


def test_blackhole_swallows_bytes_and_resets_its_connections_when_it_ends(network: ProxyNetwork) -> None:
    with connect(network) as sock:
        assert echo(sock) == b"ping"
        network.cut(["a"], ["b"])
        with pytest.raises(socket.timeout):
            echo(sock)
        with connect(network) as fresh, pytest.raises(socket.timeout):  # new connections hang too
            echo(fresh)
        network.heal()
        with pytest.raises((ConnectionResetError, BrokenPipeError, socket.timeout)):
            assert echo(sock) == b""  # a tainted connection must not resume
    with connect(network) as sock:
        assert echo(sock) == b"ping"


def test_cut_is_one_way(network: ProxyNetwork) -> None:
    network.cut(["a"], ["b"])
    assert network.fault_of("a", "b") == BLACKHOLE
    assert network.fault_of("b", "a") == HEALTHY
    with connect(network, "b", "a") as sock:
        assert echo(sock) == b"ping"


def test_reject_resets_existing_and_new_connections(network: ProxyNetwork) -> None:
    with connect(network) as sock:
        assert echo(sock) == b"ping"
        network.set_all(REJECT)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            echo(sock)
            echo(sock)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        with connect(network) as sock:  # the reset may come before or after connect returns
            echo(sock)
            echo(sock)


def test_delay_holds_bytes_back_and_keeps_their_order(network: ProxyNetwork) -> None:
    network.set_all(LinkFault(delay_s=0.1, jitter_s=0.02))
    with connect(network) as sock:
        sock.settimeout(2)
        started = time.monotonic()
        for i in range(20):
            sock.sendall(f"{i:03d}".encode())
        received = b""
        while len(received) < 60:
            received += sock.recv(65536)
        # Each direction holds a chunk back by at least 80 ms.
        assert time.monotonic() - started >= 0.16
        assert received == b"".join(f"{i:03d}".encode() for i in range(20))


def test_flaky_links_reset_some_connections(network: ProxyNetwork) -> None:
    network.set_all(flaky(0.0, 0.0, reset_prob=0.5))
    outcomes = []
    for _ in range(10):
        with connect(network) as sock:
            try:
                outcomes.append(echo(sock) == b"ping" and echo(sock) == b"ping")
            except (ConnectionResetError, BrokenPipeError, socket.timeout):
                outcomes.append(False)
    assert False in outcomes
    assert network.links[("a", "b")].resets > 0


def test_client_links_are_faulted_apart_from_peer_links() -> None:
    net = ProxyNetwork({"a": "127.0.0.1:1", "b": "127.0.0.1:2"}, client_sources=["c"],
                       client_targets={"a": "127.0.0.1:3", "b": "127.0.0.1:4"}).start()
    try:
        # Members reach each other's peer ports, clients their client ports.
        assert net.real_address(net.peers_for("a")["b"]) == "127.0.0.1:2"
        assert net.real_address(net.client_address("c", "b")) == "127.0.0.1:4"
        assert net.member_behind(net.client_address("c", "b")) == "b" == net.member_behind("127.0.0.1:4")
        net.set_all(REJECT)
        assert all(net.fault_of("c", m) == HEALTHY for m in "ab")
        net.partition(["a"])
        net.set_clients(BLACKHOLE)
        assert net.fault_of("c", "a") == BLACKHOLE and net.fault_of("a", "b") == BLACKHOLE
        net.heal()
        assert all(link.fault == HEALTHY for link in net.links.values())
    finally:
        net.close()


def test_partition_cuts_every_link_between_groups_both_ways() -> None:
    net = ProxyNetwork({m: "127.0.0.1:1" for m in ("a", "b", "c", "d", "e")}).start()  # no traffic needed
    try:
        net.partition(["a", "b"], ["c"])  # d and e form the third group
        cut = {pair for pair, link in net.links.items() if link.fault == BLACKHOLE}
        groups = [{"a", "b"}, {"c"}, {"d", "e"}]
        expected = {(s, d) for s in "abcde" for d in "abcde"
                    if s != d and not any(s in g and d in g for g in groups)}
        assert cut == expected
        net.heal()
        assert all(link.fault == HEALTHY for link in net.links.values())
    finally:
        net.close()


@pytest.mark.parametrize("down_close", [DownClose.RESET, DownClose.FIN])
def test_a_proxy_accepts_while_its_member_is_down_then_closes(down_close: DownClose) -> None:
    """Nothing listens behind the link: the proxy accepts, then the connection ends (a FIN reads as
    end of stream, a reset as an error). The reset can reach the dialer before its connect() has
    returned (the handshake is done, the error is read back afterwards), so a reset seen by
    connect() counts too; nothing listening at all would be ECONNREFUSED, which does not.

    The FIN is a FIN whatever the dialer sent first: the dialer sends more than the proxy reads
    ahead (asyncio's stream stops reading at 128 KiB), so bytes it has not read are there when it
    gives up on the member (a member writes as soon as it connects); a plain close() would then
    reset the connection."""
    (dead_port,) = free_ports(1)
    net = ProxyNetwork({m: f"127.0.0.1:{dead_port}" for m in "ab"}, down_close=down_close).start()
    try:
        if down_close is DownClose.FIN:
            with connect(net) as sock:
                sock.settimeout(2)
                sock.sendall(b"x" * (1 << 20))
                assert sock.recv(65536) == b""
        else:
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                with connect(net) as sock:
                    sock.settimeout(2)
                    echo(sock)
                    echo(sock)
        assert net.links[("a", "b")].closed_while_down == 1
    finally:
        net.close()


def test_a_holding_proxy_keeps_the_dialer_side_open_after_its_member_died_and_drops_its_bytes() -> None:
    """DownClose.HOLD: the member's end of a proxied connection closes (it died); the dialer's
    end stays open, takes bytes and returns none, and is never connected to the member again, even
    once something listens there. A connection accepted while nothing listens is held too."""
    port = free_ports(1)[0]  # reserved: it is bound again below, after a while unbound
    member = socket.create_server(("127.0.0.1", port))
    net = ProxyNetwork({m: f"127.0.0.1:{port}" for m in "ab"}, down_close=DownClose.HOLD).start()
    try:
        with connect(net) as sock:
            accepted, _ = member.accept()
            sock.sendall(b"before")
            accepted.settimeout(20)
            assert accepted.recv(64) == b"before"
            accepted.close()  # the member dies
            member.close()
            time.sleep(SHORT_S)
            for _ in range(3):
                sock.sendall(b"into the void" * 1000)
                with pytest.raises(socket.timeout):
                    sock.recv(64)
            with connect(net) as while_down:  # nothing listens: accepted, held
                while_down.sendall(b"hello")
                with pytest.raises(socket.timeout):
                    while_down.recv(64)
                link = net.links[("a", "b")]
                deadline = time.monotonic() + 20
                while link.held < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert link.held == 2 and link.closed_while_down == 0
                member = socket.create_server(("127.0.0.1", port))  # the member is back
                member.settimeout(SHORT_S)
                sock.sendall(b"after")
                with pytest.raises(socket.timeout):
                    member.accept()  # the held connection never reaches it
    finally:
        member.close()
        net.close()
