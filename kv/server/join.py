"""Joining an existing cluster (`raftkv serve --join HOST:PORT,...`).

A member is added first (`raftkv member add`, etcd's MemberAdd), then started empty with --join
and the client addresses of some members. It asks them, once, for the cluster id and the member
list, checks that it is among the members under its --id, and starts knowing no configuration
(NodeConfig.join). A member etcd's MemberAdd added has no name (etcd's request carries none): the
member started with --id NAME at its peer address takes its place under NAME, as an etcd member
publishes its name when it starts (MemberUpdate with the name, kv/server/etcd_services.py's
`_take_name`; decision 0068): it founds nothing and votes for no one; the leader sends it the log or a
snapshot, and with them the configurations, as to any lagging follower. A learner stays one until
promoted.

The cluster id is stored in the data directory on this first start, as any member's is; a later
start with --join asks nothing again."""
from __future__ import annotations

import time
from dataclasses import replace

import grpc

from kv.client.members import MEMBER_NAME_KEY
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
                cluster_id, members = _ask(endpoint, credentials)
                members = _named(endpoint, credentials, config, members)
            except grpc.RpcError as e:
                reasons.append(f"{endpoint}: {e.details() or e.code().name}")  # type: ignore[attr-defined]
                continue
            peers = {m.name: _host_port(m.peerURLs[0]) if m.peerURLs else "" for m in members if m.name}
            if config.node_id in peers:
                return _joined(config, cluster_id, peers)
            reasons.append(f"{endpoint}: {config.node_id} is not a member (members: {', '.join(sorted(peers))}"
                           f"{_nameless_note(members)})")
        if time.monotonic() >= deadline:
            break
        time.sleep(RETRY_PAUSE_S)
    if all("is not a member" in r for r in reasons):
        raise JoinError(f"{config.node_id} is not a member of the cluster: add it first, e.g. raftkv member add "
                        f"{config.node_id} --peer-address HOST:PORT --learner --endpoints {endpoints[0]} "
                        f"({'; '.join(reasons)})")
    raise JoinError("no member answered at --join: " + "; ".join(reasons))


def _named(endpoint: str, credentials: grpc.ChannelCredentials | None, config: NodeConfig,
           members: list[etcd_pb.Member]) -> list[etcd_pb.Member]:
    """The members, after this node took the place of the nameless member at its peer address,
    if the cluster does not name it and has one there (the members as they were otherwise)."""
    own = config.peers.get(config.node_id) or config.listen_peer
    if own is None or any(m.name == config.node_id for m in members):
        return members
    nameless = next((m for m in members if not m.name and m.peerURLs and _host_port(m.peerURLs[0]) == own), None)
    if nameless is None:
        return members
    request = etcd_pb.MemberUpdateRequest(ID=nameless.ID, peerURLs=list(nameless.peerURLs))
    try:
        with _channel(endpoint, credentials) as channel:
            answer = etcd_grpc.ClusterStub(channel).MemberUpdate(
                request, timeout=ASK_TIMEOUT_S, metadata=((MEMBER_NAME_KEY, config.node_id),))
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):  # type: ignore[attr-defined]
            raise JoinError(f"{config.node_id} cannot take the place of the nameless member {nameless.ID:x} at "
                            f"{own}: {e.details()}") from None  # type: ignore[attr-defined]
        raise
    return list(answer.members)


def _nameless_note(members: list[etcd_pb.Member]) -> str:
    at = [_host_port(m.peerURLs[0]) for m in members if not m.name and m.peerURLs]
    return f"; nameless at {', '.join(at)}: start there to take that place" if at else ""


def _joined(config: NodeConfig, cluster_id: str, peers: dict[str, str]) -> NodeConfig:
    if config.listen_peer is None and not peers[config.node_id] and config.node_id not in config.peers:
        raise JoinError(f"the cluster knows no peer address for {config.node_id}: give --listen-peer")
    own = config.peers.get(config.node_id) or peers[config.node_id]
    joined = replace(config, join=True, cluster_id=cluster_id, peers={**peers, **config.peers, config.node_id: own})
    joined.validate_addresses()
    return joined


def _channel(endpoint: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    return (grpc.secure_channel(endpoint, credentials) if credentials is not None
            else grpc.insecure_channel(endpoint))


def _ask(endpoint: str, credentials: grpc.ChannelCredentials | None) -> tuple[str, list[etcd_pb.Member]]:
    """(cluster id, the members) as the member at `endpoint` knows them."""
    with _channel(endpoint, credentials) as channel:
        status = kv_pb2_grpc.KVStub(channel).Status(kv_pb2.StatusRequest(), timeout=ASK_TIMEOUT_S)
        members = etcd_grpc.ClusterStub(channel).MemberList(etcd_pb.MemberListRequest(), timeout=ASK_TIMEOUT_S)
    return status.cluster_id, list(members.members)


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")
