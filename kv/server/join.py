"""Joining an existing cluster (`raftkv serve --join HOST:PORT,...`).

A member is added first (`raftkv member add`, etcd's MemberAdd), then started empty with --join
and the client addresses of some members. It asks them, once, for the cluster id and the member
list, checks that it is among the members under its --id, and starts knowing no configuration
(NodeConfig.join): it founds nothing and votes for no one; the leader sends it the log or a
snapshot, and with them the configurations, as to any lagging follower. A learner stays one until
promoted.

The cluster id is stored in the data directory on this first start, as any member's is; a later
start with --join asks nothing again."""
from __future__ import annotations

import time
from dataclasses import replace

import grpc

from raft.node.cluster_id import FILE_NAME as CLUSTER_ID_FILE
from raft.node.config import NodeConfig
from raftkv_proto import etcd_rpc_pb2 as etcd_pb
from raftkv_proto import etcd_rpc_pb2_grpc as etcd_grpc
from raftkv_proto import kv_pb2, kv_pb2_grpc

ASK_TIMEOUT_S = 5.0
# How long the endpoints are asked again while none lists this node yet.
JOIN_WAIT_S = 5.0
RETRY_PAUSE_S = 0.2


class JoinError(Exception):
    """The node cannot join: the message says why and what to do."""


def joined_config(config: NodeConfig, endpoints: list[str],
                  credentials: grpc.ChannelCredentials | None = None) -> NodeConfig:
    """`config` for a node that joins the cluster at `endpoints`: join set, the cluster id and the
    members' peer addresses filled in from the cluster on a first start."""
    if (config.data_dir / CLUSTER_ID_FILE).exists():
        return replace(config, join=True)  # joined before: the data directory knows its cluster
    # Right after `member add` a follower may not list the new member for a heartbeat or so:
    # every endpoint is asked, again, until one lists it or JOIN_WAIT_S has passed.
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        reasons: list[str] = []
        for endpoint in endpoints:
            try:
                cluster_id, peers = _ask(endpoint, credentials)
            except grpc.RpcError as e:
                reasons.append(f"{endpoint}: {e.details() or e.code().name}")  # type: ignore[attr-defined]
                continue
            if config.node_id in peers:
                return _joined(config, cluster_id, peers)
            reasons.append(f"{endpoint}: {config.node_id} is not a member (members: {', '.join(sorted(peers))})")
        if time.monotonic() >= deadline:
            break
        time.sleep(RETRY_PAUSE_S)
    if all("is not a member" in r for r in reasons):
        raise JoinError(f"{config.node_id} is not a member of the cluster: add it first, e.g. raftkv member add "
                        f"{config.node_id} --peer-address HOST:PORT --learner --endpoints {endpoints[0]} "
                        f"({'; '.join(reasons)})")
    raise JoinError("no member answered at --join: " + "; ".join(reasons))


def _joined(config: NodeConfig, cluster_id: str, peers: dict[str, str]) -> NodeConfig:
    if config.listen_peer is None and not peers[config.node_id] and config.node_id not in config.peers:
        raise JoinError(f"the cluster knows no peer address for {config.node_id}: give --listen-peer")
    own = config.peers.get(config.node_id) or peers[config.node_id]
    joined = replace(config, join=True, cluster_id=cluster_id, peers={**peers, **config.peers, config.node_id: own})
    joined.validate_addresses()
    return joined


def _ask(endpoint: str, credentials: grpc.ChannelCredentials | None) -> tuple[str, dict[str, str]]:
    """(cluster id, member -> peer address) as the member at `endpoint` knows them."""
    channel = (grpc.secure_channel(endpoint, credentials) if credentials is not None
               else grpc.insecure_channel(endpoint))
    with channel:
        status = kv_pb2_grpc.KVStub(channel).Status(kv_pb2.StatusRequest(), timeout=ASK_TIMEOUT_S)
        members = etcd_grpc.ClusterStub(channel).MemberList(etcd_pb.MemberListRequest(), timeout=ASK_TIMEOUT_S)
    peers = {m.name: _host_port(m.peerURLs[0]) if m.peerURLs else "" for m in members.members}
    return status.cluster_id, peers


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")
