"""A node's gRPC servers share its listen port (kv/server/server_group.py): every server listens, every
kv.Client brings its own connection, and the port stays refused to a second process."""
from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from kv import Client
from kv.server.server import start_server
from kv.server.server_group import ServerGroup, refuse_taken_port
from kv.tools.cluster_up import free_ports
from raft.node.config import NodeConfig, StorageConfig
from raft.transport.address import split_address as split_listen
from tests.unit.test_embedded import free_port, open_node

_LISTEN, _ESTABLISHED = "0A", "01"


def sockets_on_port(port: int, state: str, anyone: bool = False) -> int:
    """How many TCP sockets of this process have local port `port` in `state`; with `anyone`, of
    every process in this network namespace (a socket in TIME_WAIT belongs to no process).

    Other processes on the machine (other test runs) can hold sockets on the same port number, on
    another address or as the local end of a connection: only this process's sockets say what the
    code under test opened and closed."""
    own = set()
    if not anyone:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed meanwhile (the listing's own descriptor)
                continue
            if target.startswith("socket:["):
                own.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if (int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state
                        and (anyone or fields[9] in own)):
                    count += 1
    return count


def test_every_server_of_a_node_listens_and_each_client_has_its_own_connection(tmp_path: Path) -> None:
    port = free_port()
    with open_node(tmp_path, port) as db:  # grpc_servers at its default
        assert sockets_on_port(port, _LISTEN) == db.config.tuning.grpc_servers > 1
        db.put(b"k", b"v")
        clients = [Client([f"127.0.0.1:{port}"]) for _ in range(5)]
        try:
            for c in clients:
                assert c.get(b"k") == b"v"
            # The node's side of each connection: one per client (they would share one otherwise).
            assert sockets_on_port(port, _ESTABLISHED) == len(clients)
        finally:
            for c in clients:
                c.close()


def test_port_zero_binds_every_server_to_the_port_the_first_one_got() -> None:
    async def main() -> None:
        group = ServerGroup.bind("127.0.0.1:0", 3, [])
        try:
            await group.start()
            assert group.port != 0 and len(group.servers) == 3
            assert sockets_on_port(group.port, _LISTEN) == 3
        finally:
            await group.stop(None)
    asyncio.run(main())


def test_a_port_another_group_listens_on_is_refused() -> None:
    """SO_REUSEPORT alone would let the second group in; the probe refuses it."""
    async def main() -> None:
        first = ServerGroup.bind("127.0.0.1:0", 2, [])
        try:
            await first.start()
            with pytest.raises(OSError, match="cannot listen on .*another process"):
                ServerGroup.bind(f"127.0.0.1:{first.port}", 2, [])
        finally:
            await first.stop(None)
    asyncio.run(main())


def test_a_port_a_plain_socket_listens_on_is_refused() -> None:
    with socket.socket() as other:
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1"):
            refuse_taken_port(f"127.0.0.1:{port}", "127.0.0.1", port)


def test_connections_left_in_time_wait_do_not_block_a_restart() -> None:
    """A node killed and restarted on its port finds its old connections in TIME_WAIT."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the listening side closes first: its end goes to TIME_WAIT
        client.recv(1)
        client.close()
    assert sockets_on_port(port, "06", anyone=True) >= 1  # 06: TIME_WAIT
    refuse_taken_port(f"127.0.0.1:{port}", "127.0.0.1", port)  # does not raise


@pytest.mark.parametrize("bad", ["7001", "host:", "host:http", "host:70000"])
def test_a_listen_address_without_a_port_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="expected host:port"):
        split_listen(bad)


def test_ipv6_listen_addresses_split() -> None:
    assert split_listen("[::1]:7001") == ("[::1]", 7001)


def test_a_group_stopped_before_it_started_frees_its_port() -> None:
    """A bound grpc.aio server that never started keeps listening through stop() unless the
    group starts it first (a failed start_server stops a group it never started)."""
    async def main() -> None:
        group = ServerGroup.bind("127.0.0.1:0", 2, [])
        assert sockets_on_port(group.port, _LISTEN) == 2
        await group.stop(None)
        assert sockets_on_port(group.port, _LISTEN) == 0

    asyncio.run(main())


def test_a_node_that_fails_to_start_frees_its_port_and_stores(tmp_path: Path) -> None:
    """An embedding service can fix what stopped a node from starting (here: its peer port is
    taken) and start it again in the same process, on the same port and data directory."""
    async def main() -> None:
        port = free_port()
        with socket.socket() as blocker:
            # Not a port from the kernel's ephemeral range: once the blocker closes, another
            # process's connection could take that one before the node listens on it.
            (peer_port,) = free_ports(1)
            blocker.bind(("127.0.0.1", peer_port))
            blocker.listen()
            peers = {"n1": f"127.0.0.1:{peer_port}", "n2": f"127.0.0.1:{free_port()}", "n3": f"127.0.0.1:{free_port()}"}
            config = NodeConfig(node_id="n1", listen=f"127.0.0.1:{port}", peers=peers, data_dir=tmp_path / "n1",
                                storage=StorageConfig(log_max_bytes=64 << 20, state_max_bytes=64 << 20))
            with pytest.raises(OSError, match=f"cannot listen for peers on 127.0.0.1:{peer_port} \\(--listen-peer\\)"):
                await start_server(config)
            assert sockets_on_port(port, _LISTEN) == 0
        server = await start_server(config)  # the peer port is free now
        try:
            assert sockets_on_port(port, _LISTEN) == config.tuning.grpc_servers
            assert sockets_on_port(peer_port, _LISTEN) == 1
        finally:
            await server.stop()

    asyncio.run(main())
