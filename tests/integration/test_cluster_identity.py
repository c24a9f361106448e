"""Members that reach each other by different addresses are one cluster: the cluster id is
derived from the member ids (and --initial-cluster-token), never from the --peers addresses, so
each member may have a --peers map of its own (NAT, proxies, containers)."""
from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


class Forwarder:
    """A TCP forwarder on a free 127.0.0.1 port (`address`) to `target` (host, port): another
    address for the same listener, as a proxy or NAT in front of a member would be. Threads, one
    pair per connection; close() stops accepting and closes every socket it opened."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        # Port 0, bound at once: no other process is waiting to bind a port picked for it.
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._server]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                accepted, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._target)
            except OSError:  # the member is not listening (yet): the dialer sees a close
                accepted.close()
                continue
            with self._lock:
                self._sockets += [accepted, upstream]
            for source, sink in ((accepted, upstream), (upstream, accepted)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets:
                sock.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


@pytest.fixture
def forwarders() -> Iterator[list[Forwarder]]:
    started: list[Forwarder] = []
    yield started
    for forwarder in started:
        forwarder.close()


def test_members_with_their_own_peer_maps_form_one_cluster(make_cluster, forwarders: list[Forwarder]) -> None:
    """n1 reaches the others at 127.0.0.1, n2 at localhost, n3 through forwarders: three
    different --peers maps for the same three listeners."""
    cluster: Cluster = make_cluster(3, start=False)
    real = {node_id: node.peer_address for node_id, node in cluster.nodes.items()}
    forwarders += [Forwarder(("127.0.0.1", _port(address))) for address in real.values()]
    via_forwarder = {member: f.address for member, f in zip(real, forwarders)}
    maps = {
        "n1": dict(real),
        "n2": {member: f"localhost:{_port(address)}" for member, address in real.items()},
        "n3": via_forwarder,
    }
    for node_id, node in cluster.nodes.items():
        peers = {**maps[node_id], node_id: real[node_id]}  # its own entry is where it listens
        node.spec = dataclasses.replace(node.spec, peers=peers)
    assert len({tuple(sorted(node.spec.peers.items())) for node in cluster.nodes.values()}) == 3
    cluster.start()

    cluster.wait_for_leader(timeout=20.0)
    client = cluster.client()
    client.put("identity", "one cluster")
    assert client.get("identity") == b"one cluster"
    statuses = cluster.statuses()
    assert len({s["cluster_id"] for s in statuses.values()}) == 1, statuses
