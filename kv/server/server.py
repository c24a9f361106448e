"""A raftkv node as a process: the log (raft/log) and the LMDB state, the Raft driver with its peer
transport on --listen-peer (raft/transport/tcp_transport.py), and its gRPC services for clients
(KV, export) on --listen, served by a group of grpc.aio servers (kv/server/server_group.py).

    serve(config)                       # blocks until SIGINT / SIGTERM or the node's removal
                                        # from the cluster (what `raftkv serve` runs)
    running = await start_server(config)  # on a running loop; `await running.stop()` when done
"""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from kv.server.data_dir import DataDirLock, DataDirSpace, RejoinFile
from kv.server.auth_service import AuthHandler
from kv.server.export_service import ExportHandler, ExportServicer
from kv.server.node_snapshots import NodeSnapshots
from kv.server.observability import Observability
from kv.server.replaceable_state import ReplaceableStateMachine
from kv.server.member_channels import MemberChannels
from kv.server.server_group import MAX_SEND_BYTES, ServerGroup
from kv.server.state_check import CorruptionAlarm, PeerStatuses, StateChecker
from kv.server.tls import ClientPortTLS, warn_if_plaintext
from kv.server.etcd_auth import EtcdAuthServicer
from kv.server.etcd_face import EtcdFace
from kv.server.etcd_cluster import EtcdClusterServicer
from kv.server.etcd_gateway import EtcdGateway, grpc_services, local_address
from kv.server.etcd_services import EtcdKVServicer, EtcdMaintenanceServicer
from kv.server.etcd_lease import EtcdLeaseServicer
from kv.server.etcd_watch import EtcdWatchServicer
from kv.server.auto_compaction import AutoCompactor
from kv.server.lessor import Lessor
from kv.server.watch_hub import WatchHub
from kv.server.kv_handler import KVHandler
from kv.server.kv_service import KVServicer
from raftkv_proto import etcd_rpc_pb2_grpc, export_pb2_grpc, kv_pb2_grpc
from raft.log import WalLogStore, open_log_store
from raft.node.cluster_id import resolve_cluster_id
from raft.node.config import NodeConfig
from raft.node.node import RaftNode
from raft.node.joining import disk_state
from raft.node.recovery import reconcile_state_and_log
from raft.transport.address import split_address
from raft.transport.tcp_transport import TcpTransport
from statemachine.errors import StateFullError
from snapshot.install import recover_state_dir
from statemachine.alarms import AlarmHolder
from statemachine.auth_state import AuthHolder
from statemachine.kv_state import KVStateMachine
from statemachine.leases import LeaseHolder

log = logging.getLogger(__name__)

# How long in-flight client calls get to finish on shutdown before they are cancelled.
SHUTDOWN_GRACE_S = 1.0


@dataclass(slots=True)
class RunningServer:
    config: NodeConfig
    node: RaftNode
    handler: KVHandler
    log_store: WalLogStore
    fsm: ReplaceableStateMachine
    servers: ServerGroup
    exports: ExportHandler
    kv_service: KVServicer
    data_dir_lock: DataDirLock
    state_checker: StateChecker
    auth: AuthHandler
    observability: Observability
    etcd: EtcdFace
    watches: WatchHub
    lessor: Lessor
    compactor: AutoCompactor
    gateway: EtcdGateway | None
    _stopped: bool = False

    async def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stop taking calls, stop the node (waiting for its log and apply threads), then close the
        stores. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        await self.state_checker.stop()
        await self.observability.stop()
        await self.kv_service.end_streams()
        if self.gateway is not None:
            await self.gateway.stop()
        await self.servers.stop(grace)
        await self.handler.close()
        await self.watches.stop()
        await self.lessor.stop()
        await self.compactor.stop()
        await self.etcd.close()
        await self.node.stop()
        self.exports.close()  # release pinned read transactions before the environment closes
        self.fsm.close()
        self.log_store.close()
        self.data_dir_lock.release()
        log.info("node %s stopped", self.config.node_id)


async def start_server(config: NodeConfig) -> RunningServer:
    """Open the stores under config.data_dir, start the node (its peer listener on
    config.peer_listen_address) and serve clients on config.listen."""
    config.validate_addresses()
    warn_if_plaintext(config)
    data_dir_lock = DataDirLock(config.data_dir)
    data_dir_lock.acquire(f"raftkv node {config.node_id}, clients on {config.listen}")
    try:
        log_store = open_log_store(config.data_dir, max_bytes=config.storage.log_max_bytes,
                                   fsync=config.storage.fsync)
    except BaseException:
        data_dir_lock.release()
        raise
    fsm: ReplaceableStateMachine | None = None
    node: RaftNode | None = None
    servers: ServerGroup | None = None
    handler: KVHandler | None = None
    watches: WatchHub | None = None
    lessor: Lessor | None = None
    compactor: AutoCompactor | None = None
    gateway: EtcdGateway | None = None
    try:
        state_dir = config.data_dir / "state"
        recover_state_dir(state_dir)  # finish or undo a snapshot install a crash interrupted
        auth = AuthHolder()  # one for the node's life: a snapshot install reopens the state into it
        alarms = AlarmHolder()  # likewise
        leases = LeaseHolder()  # likewise
        fsm = ReplaceableStateMachine(state_dir, lambda d: KVStateMachine(d, map_size=config.storage.state_max_bytes,
                                                                          auth=auth, alarms=alarms, leases=leases))
        cluster_id = resolve_cluster_id(config.data_dir, config.cluster_id, config.members,
                                        config.initial_cluster_token)
        snapshots = NodeSnapshots(config.data_dir / "snapshots", fsm, config.members, cluster_id,
                                  keep=config.storage.snapshots_kept)
        reconcile_state_and_log(log_store, fsm, snapshots)
        transport = TcpTransport(config, cluster_id, lambda: disk_state(log_store))
        node = RaftNode(config, log_store, fsm, transport, cluster_id=cluster_id, snapshots=snapshots,
                        fsm_full_errors=(StateFullError,), rejoin_record=RejoinFile(config.data_dir),
                        disk_space=DataDirSpace(config.data_dir))
        alarm = CorruptionAlarm(node)
        # The peers' status, over their client ports (TLS when those serve it): for the state check
        # and the alarm watch.
        client_tls = ClientPortTLS(config.security) if config.security.client.enabled else None
        member_credentials = client_tls.member_credentials if client_tls is not None else lambda: None
        peer_statuses = PeerStatuses(node, MemberChannels(member_credentials))
        checker = StateChecker(node, fsm, alarm, config.storage.state_check_interval_s, peer_statuses)
        handler = KVHandler(node, fsm, alarm, checker.status)
        auth_handler = AuthHandler(node, handler, config.security.auth_token_ttl_s)
        kv_service = KVServicer(handler, auth_handler)
        exports = ExportHandler(node, fsm)
        observability = Observability.of(node, fsm, handler, kv_service, checker, peer_statuses)
        # The leader's answer may be as large as any member sends (a large Range forwarded).
        etcd = EtcdFace(handler, MemberChannels(member_credentials,
                                                [("grpc.max_receive_message_length", MAX_SEND_BYTES)]))
        watches = handler.watches
        lessor = Lessor(node, fsm, checkpoint_interval_s=config.storage.lease_checkpoint_interval_s)
        compactor = AutoCompactor(node, fsm, config.storage.auto_compaction_mode,
                                  config.storage.auto_compaction_retention)
        services = [
            (kv_pb2_grpc.add_KVServicer_to_server, kv_service),
            (etcd_rpc_pb2_grpc.add_KVServicer_to_server, EtcdKVServicer(etcd)),
            (etcd_rpc_pb2_grpc.add_MaintenanceServicer_to_server, EtcdMaintenanceServicer(etcd)),
            (etcd_rpc_pb2_grpc.add_ClusterServicer_to_server, EtcdClusterServicer(etcd)),
            (etcd_rpc_pb2_grpc.add_AuthServicer_to_server, EtcdAuthServicer(etcd, auth_handler)),
            (etcd_rpc_pb2_grpc.add_LeaseServicer_to_server, EtcdLeaseServicer(etcd, lessor)),
            (etcd_rpc_pb2_grpc.add_WatchServicer_to_server,
             EtcdWatchServicer(etcd, watches, config.limits.max_request_bytes)),
            (export_pb2_grpc.add_ExportServicer_to_server, ExportServicer(exports, handler.gate)),
            observability.health_service,
        ]
        servers = ServerGroup.bind(config.listen, config.tuning.grpc_servers, services,
                                   max_request_bytes=config.limits.max_request_bytes,
                                   credentials=client_tls.grpc_credentials if client_tls is not None else None,
                                   caller_check=(client_tls.refuse_revoked if client_tls is not None
                                                 and client_tls.revocations is not None else None))
        if config.listen_client_http_urls:
            # The same servicer objects as the gRPC port's: one layer under both faces.
            assert observability.endpoints is not None
            gateway = EtcdGateway(config, client_tls, grpc_services(services), observability.endpoints,
                                  lambda: handler.auth.enabled, lambda: local_address(config.listen, servers.port))
        await node.start()
        watches.start()
        lessor.start()
        compactor.start()
        await servers.start()
        if gateway is not None:
            await gateway.start()
        checker.start()
        await observability.start()
    except BaseException:
        # Undo what was started, so that the caller (an embedding service) can fix the cause and
        # start again in the same process: the gRPC port and the peer port free, the stores closed.
        try:
            if gateway is not None:
                await gateway.stop()
            if servers is not None:
                await servers.stop(None)
            if handler is not None:
                await handler.close()
            if watches is not None:
                await watches.stop()
            if lessor is not None:
                await lessor.stop()
            if compactor is not None:
                await compactor.stop()
            if node is not None:
                await node.stop()
        finally:
            if fsm is not None:
                fsm.close()
            log_store.close()
            data_dir_lock.release()
        raise
    peers = ""
    if config.peer_listen_address is not None:
        peers = f", peers on {split_address(config.peer_listen_address)[0]}:{transport.peer_port}"
    tls = " with TLS" + (" and client certificates" if config.security.client.client_cert_auth else "")
    log.info("node %s serving clients on %s%s (advertised as %s)%s (cluster %s, members %s, data in %s)",
             config.node_id, config.listen, tls if config.security.client.enabled else "",
             config.advertised_client_address, peers, node.cluster_id,
             ",".join(config.members), config.data_dir)
    return RunningServer(config, node, handler, log_store, fsm, servers, exports, kv_service, data_dir_lock, checker,
                         auth_handler, observability, etcd, watches, lessor, compactor, gateway)


def event_loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop a node runs on: uvloop when installed ("auto"), which takes about 15% more
    requests per second through the same node than asyncio's own loop (docs/performance.md)."""
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"event loop must be auto, uvloop or asyncio, not {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
            return uvloop.new_event_loop
        except ImportError:
            if choice == "uvloop":
                raise ValueError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
    return asyncio.new_event_loop


def serve(config: NodeConfig, event_loop: str = "auto") -> bool:
    """Run a node until SIGINT or SIGTERM, or until it learns it was removed from the cluster;
    then stop cleanly. Returns whether it ended because it was removed."""
    factory = event_loop_factory(event_loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_serve(config))


async def _serve(config: NodeConfig) -> bool:
    loop_module = type(asyncio.get_running_loop()).__module__.split(".")[0]
    log.info("node %s runs on the %s event loop", config.node_id, loop_module)
    running = await start_server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.info("node %s is already shutting down (%s ignored)", config.node_id, sig.name)
        stop.set()

    # The handlers stay until the stop is done: a second SIGTERM (a process manager's repeat, or
    # a signal to the process group followed by one to the process) would otherwise kill the node
    # half-way through its stop, with its stores still open.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    removed = False
    try:
        # A removed member serves no one and is never a member again: a process kept running
        # would only look alive to whatever supervises it.
        await _first_of(stop, running.node.removed)
        removed = running.node.removed.is_set()
        if removed:
            log.info("node %s shutting down: %s", config.node_id, running.node.stopped)
        else:
            log.info("node %s shutting down", config.node_id)
    finally:
        try:
            await running.stop()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    return removed


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
