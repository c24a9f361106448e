"""A three-node cluster inside the test process (kv.server.server.start_server, which carries the Export
service), on one background event loop; the tests also reach a node's state machine directly (to
write a snapshot file at a known index)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kv.tools.cluster_up import free_ports, release_ports
from kv.server.export_service import ExportHandler
from kv.server.server import RunningServer, start_server
from raft.core.config import CoreConfig
from raft.node.config import NodeConfig, Security, StorageConfig


@dataclass
class ExportNode:
    running: RunningServer
    exports: ExportHandler


async def start_node(config: NodeConfig) -> ExportNode:
    running = await start_server(config)
    return ExportNode(running, running.exports)


class InProcessCluster:
    """`security(member id)`, when given, is each member's (TLS on its client port, say)."""

    def __init__(self, base: Path, size: int = 3, security: Callable[[str], Security] | None = None) -> None:
        ports = self.ports = free_ports(2 * size)  # a client and a peer port per member
        names = [f"n{i + 1}" for i in range(size)]
        listen = {nid: f"127.0.0.1:{port}" for nid, port in zip(names, ports)}
        peers = {nid: f"127.0.0.1:{port}" for nid, port in zip(names, ports[size:])}
        self.endpoints = ",".join(listen.values())
        core = CoreConfig()
        self.configs = [NodeConfig(node_id=nid, listen=listen[nid], peers=dict(peers), data_dir=base / nid, core=core,
                                   storage=StorageConfig(fsync=False, state_max_bytes=1 << 30, log_max_bytes=1 << 30),
                                   security=security(nid) if security is not None else Security())
                        for nid in names]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raftkv-test-cluster", daemon=True)
        self._thread.start()
        self.nodes: list[ExportNode] = []
        for config in self.configs:
            self.nodes.append(self.run(start_node(config)))
        self.run(asyncio.wait_for(self.nodes[0].running.node.wait_for_leader(), 20))

    def run(self, coro, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def leader(self) -> ExportNode:
        leader_id = self.run(asyncio.wait_for(self.nodes[0].running.node.wait_for_leader(), 20))
        return next(n for n in self.nodes if n.running.node.id == leader_id)

    def close(self) -> None:
        for node in self.nodes:
            self.run(node.running.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        release_ports(self.ports)
