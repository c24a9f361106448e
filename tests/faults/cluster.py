"""A cluster of real node processes whose peer links all go through the fault proxies.

It is the integration harness's `Cluster` (processes, SIGKILL / restart / SIGSTOP, status
polling) with one difference: node i's --peers names every other member by the proxy of link
(i, j), in front of that member's peer port; its own entry is its real peer port. Members thus
know each other by different addresses (the cluster id does not depend on them); they are all
given one explicit --cluster-id of the run's own, so that no other run's members are taken in."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from kv import Client
from kv.client.client import CHANNEL_OPTIONS
from kv.client.router import Send
from kv.client.tls import open_channel
from kv.tools.cluster_up import NodeSpec, free_ports
from kv.errors import NotLeaderError
from tests.faults.proxy import DownClose, ProxyNetwork, link_count
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import Cluster, NodeProcess


# The source name of client links.
CLIENTS = "clients"


class RoutedClient(Client):
    """A kv.Client that follows "not leader" hints to the leader's client endpoint.

    A node's hint is the leader's own client address (--listen). With client proxies, a client
    must reach the leader through its proxy, so that the client link's faults apply."""

    def __init__(self, endpoints: list[str], route: Callable[[str], str], **kwargs: Any) -> None:
        super().__init__(endpoints, **kwargs)
        self._route = route

    def _send(self, step: Send) -> Any:
        try:
            return super()._send(step)
        except NotLeaderError as error:
            if error.leader_address:
                error.leader_address = self._route(error.leader_address)
            raise


@dataclass
class FaultCluster(Cluster):
    """`size` members n1..nN behind a ProxyNetwork (`self.network`); `seed` seeds the proxies'
    random choices (jitter, resets). With `client_proxies`, clients from `client()` reach each
    member through a proxy too (links ("clients", nI)), so client connections can be faulted.
    `down_close`: how a proxy closes a connection it accepted while its member is down."""

    seed: int = 0
    client_proxies: bool = False
    down_close: DownClose = DownClose.RESET

    def __post_init__(self) -> None:
        sources = [CLIENTS] if self.client_proxies else []
        # One call for the members' and the proxies' ports: separate calls could repeat a port.
        ports = self.ports = free_ports(2 * self.size + link_count(self.size, len(sources)))
        names = [f"n{i + 1}" for i in range(self.size)]
        listen = {name: f"127.0.0.1:{port}" for name, port in zip(names, ports)}
        peer_ports = {name: f"127.0.0.1:{port}" for name, port in zip(names, ports[self.size:])}
        self.network = ProxyNetwork(peer_ports, self.seed, ports[2 * self.size:], sources, listen,
                                    self.down_close).start()
        cluster_id = f"faults-{uuid.uuid4().hex[:12]}"
        for name in names:
            args = (*self.extra_args, "--cluster-id", cluster_id)
            spec = NodeSpec(name, listen[name], self.base_dir / name, self.network.peers_for(name), args)
            self.nodes[name] = NodeProcess(spec, self.base_dir / f"{name}.log")

    def client(self, node_ids: Iterable[str] | None = None, timeout: float = 10.0, **kwargs: Any) -> Client:
        ids = list(node_ids) if node_ids is not None else list(self.nodes)
        kwargs.setdefault("tls", self.client_tls)
        client = RoutedClient([self.client_endpoint(i) for i in ids], self._route, timeout=timeout, **kwargs)
        self._clients.append(client)
        return client

    def etcd_kv_stub(self, node_id: str) -> etcd_rpc_pb2_grpc.KVStub:
        """etcd's KV service of one member, on a channel of its own (`etcd_channel`)."""
        return etcd_rpc_pb2_grpc.KVStub(self.etcd_channel(node_id))

    def etcd_channel(self, node_id: str) -> grpc.Channel:
        """A channel to one member (through its client proxy when clients go through proxies) for
        etcd's services, of its own (own connection: a local subchannel pool), closed at teardown.
        The reconnect backoff is the native client's (kv.client.client.CHANNEL_OPTIONS): gRPC's
        default grows to 120 s, and a channel to a member killed three times would then fail every
        call long after the member is back."""
        credentials = self.client_tls.credentials() if self.client_tls is not None else None
        channel = open_channel(self.client_endpoint(node_id), credentials, CHANNEL_OPTIONS)
        self._channels.append(channel)
        return channel

    def client_endpoint(self, node_id: str) -> str:
        """Where clients reach `node_id`: its client proxy, or its own address."""
        return self.network.client_address(CLIENTS, node_id) if self.client_proxies else self.nodes[node_id].address

    def _route(self, address: str) -> str:
        member = self.network.member_behind(address)
        return self.client_endpoint(member) if member is not None else address

    def close(self) -> None:
        super().close()
        self.network.close()

    # ---- recovery ------------------------------------------------------------------------------

    def heal_all(self) -> None:
        """Every link healthy, every paused node continued, every dead node started again."""
        self.network.heal()
        for node in self.nodes.values():
            node.resume()
            if not node.running:
                node.start()

    def running_ids(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.running]
