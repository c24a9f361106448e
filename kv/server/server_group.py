"""ServerGroup: a node's gRPC services on several grpc.aio servers that share one listen address.

Why several: a grpc.aio server asks gRPC core for one new call at a time. Its accept loop awaits
each call, which crosses from gRPC's poller thread to the event loop, before it asks for the next.
On a busy node that loop, not the CPU, caps how fast calls come in, and reads that could have
shared one ReadIndex round arrive one by one (16 clients' linearizable gets: 1.26 gets per round
with one server). Each extra server is one more accept loop. The servers bind the same port with
SO_REUSEPORT and the kernel spreads incoming connections over them, so the gain needs several
client connections: each `kv.Client` has its own (README, Performance).

SO_REUSEPORT would also let a second process of the same user bind the port and take half the
connections. So the group first checks with a plain bind that nothing listens there yet, and
refuses to start otherwise. Two nodes started within the same millisecond on one port could still
both pass; that is an operator's mistake this check makes visible in every other case.

    group = ServerGroup.bind("127.0.0.1:7001", count=4, services=[(add_FooServicer_to_server, foo)])
    # with TLS (kv/server/tls.py): ServerGroup.bind(..., credentials=ClientPortTLS(files).grpc_credentials)
    await group.start(); ...; await group.stop(grace)
"""
from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from raft.transport.address import split_address
from kv.server.input_checks import CallerCheck, add_servicer
from raftkv_proto.request_limits import DEFAULT_MAX_REQUEST_BYTES

# (generated add_XServicer_to_server, servicer): one servicer instance serves every server.
Service = tuple[Callable[[Any, Any], None], Any]

# Largest message a node sends a client: a scan page and a pipeline's batch of replies stay well
# within it (kv/server/kv_service.py, kv/server/pipeline_call.py), as do export batches and
# snapshot chunks; an etcd Range or read-only Txn over more is refused before it is built
# (kv/server/reply_budget.py). etcd's server sends up to 2 GiB (math.MaxInt32).
MAX_SEND_BYTES = 64 << 20

# Options for the node's grpc.aio servers: accept the clients' keepalive pings (without these a
# server answers frequent pings with GOAWAY "too_many_pings") and messages up to the node's
# request limit, which gRPC enforces before it builds a message; SO_REUSEPORT for the group, with
# its own check that no other process listens on the port.
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
]


def server_options(max_request_bytes: int) -> list[tuple[str, int]]:
    """A group server's options, refusing messages over `max_request_bytes` from clients."""
    return [("grpc.max_receive_message_length", max_request_bytes), *SERVER_OPTIONS, ("grpc.so_reuseport", 1)]


@dataclass(slots=True)
class ServerGroup:
    servers: list[grpc.aio.Server]
    port: int  # the bound port (the one asked for, or the one chosen for port 0)
    started: int = 0  # how many of `servers` (from the first) were started

    @classmethod
    def bind(cls, listen: str, count: int, services: Sequence[Service],
             max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
             credentials: Callable[[], grpc.ServerCredentials] | None = None,
             caller_check: CallerCheck | None = None) -> ServerGroup:
        """`count` servers, each carrying every service, bound to `listen` (host:port), refusing
        client messages over `max_request_bytes`, speaking TLS with the credentials `credentials()`
        makes (one per server, each following its certificate files on its own; every server of
        the group speaks TLS: the kernel may hand a connection to any of them), else plaintext;
        every call put to `caller_check` first when given. Raises OSError with the address when
        the port is taken or cannot be bound."""
        if count < 1:
            raise ValueError(f"a node needs at least one gRPC server, not {count}")
        host, port = split_address(listen)
        if port != 0:
            refuse_taken_port(listen, host, port)
        servers: list[grpc.aio.Server] = []
        for _ in range(count):
            server = grpc.aio.server(options=server_options(max_request_bytes))
            for add_to_server, servicer in services:
                add_servicer(server, add_to_server, servicer, caller_check)
            # Port 0: the first server picks the port, the others join it.
            port = _bind(server, f"{host}:{port}", listen, None if credentials is None else credentials())
            servers.append(server)
        return cls(servers, port)

    async def start(self) -> None:
        for server in self.servers[self.started:]:
            await server.start()
            self.started += 1

    async def stop(self, grace: float | None) -> None:
        """Stop every server and free the port, also when the group was never (or only partly)
        started: a grpc.aio server that was bound but never started keeps its listening socket
        through stop() and garbage collection (grpcio 1.85), so such a server is started first.
        It then takes calls for that moment, and a failed start_server answers them UNAVAILABLE."""
        await self.start()
        await asyncio.gather(*(server.stop(grace) for server in self.servers))


def refuse_taken_port(listen: str, host: str, port: int) -> None:
    """OSError when something already listens on host:port (any address host resolves to).
    SO_REUSEADDR lets the probe ignore a previous run's TIME_WAIT connections, never a listener."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {listen}: {e}") from None
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as e:
            # Only a taken port is ours to report: an address family or address this machine
            # lacks (no IPv6 for "localhost") is gRPC's to skip or refuse when it binds.
            if e.errno == errno.EADDRINUSE:
                raise OSError(f"cannot listen on {listen}: {e.strerror}; is another process using the port?") from None


def _bind(server: grpc.aio.Server, address: str, listen: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        port = (server.add_insecure_port(address) if credentials is None
                else server.add_secure_port(address, credentials))
    except RuntimeError as e:  # grpc raises RuntimeError when it cannot bind
        raise OSError(f"cannot listen on {listen}: {e}; is another process using the port?") from e
    if port == 0:
        raise OSError(f"cannot listen on {listen}: is another process using the port?")
    return port
