"""The cluster's members on kv.Client: list, add, remove, promote and move them, and move the
leadership, through etcd's Cluster service (kv/server/etcd_cluster.py) and Maintenance.MoveLeader.
Mixed into Client as Maintenance is; the calls use its connections, retries and credentials, and
go to the leader (a follower answers NOT_LEADER naming it: kv/client/leader_hints.py).

Members are named by raftkv's member ids ("n4"); etcd's uint64 id of a member is derived from its
name (raftkv_proto.member_ids.member_number). Refusals raise kv.errors' types with etcd's messages, e.g.
FailedPreconditionError("etcdserver: can only promote a learner member which is in sync with
leader"), NotFoundError("etcdserver: member not found").

    with Client("127.0.0.1:7001") as c:
        c.member_add("n4", "127.0.0.1:7104", learner=True)  # then: raftkv serve --id n4 --join ...
        c.member_promote("n4")                               # once it has caught up
        c.member_remove("n3")
        c.member_update("n2", "127.0.0.1:7202")             # then restart n2 with --listen-peer there
        c.move_leader("n4")
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kv.errors import LEADER_HINTS_KEY, LEADER_ID_KEY, UnavailableError
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from raftkv_proto.member_ids import member_number, numbered_name

# gRPC metadata of a MemberAdd: the new member's name (etcd's MemberAdd carries none; without it,
# the cluster names the member "m" + 8 hex digits).
MEMBER_NAME_KEY = "raftkv-member-name"
HINTS = (LEADER_HINTS_KEY, "1")


def has_name(member: str) -> bool:
    """Whether the member id `member` is a name given to the member, not the one a nameless member
    goes by until it starts (its etcd id as raftkv_proto.member_ids.numbered_name writes it)."""
    return numbered_name(member_number(member)) != member


def member_dict(m: pb.Member) -> dict[str, Any]:
    """A member as kv.Client returns it: id (raftkv's name; a nameless member's is "#" and its
    etcd id in hex, which raftkv's commands take), member_id (etcd's, as a number), learner,
    peer_address and client_address (host:port, None when unknown), and etcd's URLs."""
    return {
        "id": m.name or numbered_name(m.ID),
        "member_id": m.ID,
        "learner": m.isLearner,
        "peer_address": _host_port(m.peerURLs[0]) if m.peerURLs else None,
        "client_address": _host_port(m.clientURLs[0]) if m.clientURLs else None,
        "peer_urls": list(m.peerURLs),
        "client_urls": list(m.clientURLs),
    }


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


class Members:
    """Mixed into kv.Client: what these calls use of it."""

    _call: Callable[..., Any]

    def member_list(self) -> list[dict[str, Any]]:
        """Every member of the cluster's latest configuration, voters then learners (member_dict)."""
        response = self._call(lambda stub: cluster_call(stub, "MemberList"), pb.MemberListRequest())
        return [member_dict(m) for m in response.members]

    def member_add(self, name: str, peer_address: str, learner: bool = False) -> dict[str, Any]:
        """Add the member `name`, which its peers will reach at `peer_address` (host:port), as a
        learner (it catches up, counts in no quorum, and is promoted later: member_promote) or
        as a voter. Returns the new member (member_dict). Then start it, on an empty data
        directory, with `raftkv serve --id NAME --join ENDPOINTS`. The cluster refuses a voter
        when a majority of the voters after it would not be reachable (etcd's strict check), a
        peer address a member has, and a name that is taken."""
        request = pb.MemberAddRequest(peerURLs=[peer_address], isLearner=learner)
        response = self._call(lambda stub: cluster_call(stub, "MemberAdd", ((MEMBER_NAME_KEY, name),)), request)
        return member_dict(response.member)

    def member_remove(self, name: str) -> list[dict[str, Any]]:
        """Remove the member `name` (a voter only if the voters left keep a reachable majority);
        returns the members after. The removed member stops serving once it learns it."""
        response = self._call(lambda stub: cluster_call(stub, "MemberRemove"),
                              pb.MemberRemoveRequest(ID=member_number(name)))
        return [member_dict(m) for m in response.members]

    def member_promote(self, name: str) -> list[dict[str, Any]]:
        """Make the learner `name` a voter; refused while it holds less than 90% of the leader's
        log (etcd's rule). Returns the members after."""
        response = self._call(lambda stub: cluster_call(stub, "MemberPromote"),
                              pb.MemberPromoteRequest(ID=member_number(name)))
        return [member_dict(m) for m in response.members]

    def member_update(self, name: str, peer_address: str) -> list[dict[str, Any]]:
        """Move the member `name` to the peer address `peer_address` (host:port), through the log
        (the voters stay as they are); its peers dial it there once the change is applied, so
        restart it to take peers there (serve --listen-peer). Returns the members after. Refused
        for an address another member has (etcd's "Peer URLs already exists")."""
        response = self._call(lambda stub: cluster_call(stub, "MemberUpdate"),
                              pb.MemberUpdateRequest(ID=member_number(name), peerURLs=[peer_address]))
        return [member_dict(m) for m in response.members]

    def move_leader(self, to: str | None = None) -> str:
        """Hand the leadership to the voter `to` (None: the voter furthest along) and return the
        new leader's id once it leads. The old leader takes no writes meanwhile (a few round
        trips); kv.errors.FailedPreconditionError for a target that cannot lead ("etcdserver: bad
        leader transferee"), RaftKVError when the transfer did not complete in time."""
        _, trailing = self._call(_move_leader, move_leader_request(to))
        return new_leader_of(trailing)


def move_leader_request(to: str | None) -> pb.MoveLeaderRequest:
    """MoveLeader to the voter `to`, or (targetID 0, raftkv's) to the voter furthest along."""
    return pb.MoveLeaderRequest(targetID=member_number(to) if to else 0)


def new_leader_of(trailing: dict[str, Any]) -> str:
    """The new leader's id, from MoveLeader's trailing metadata."""
    leader = trailing.get(LEADER_ID_KEY)
    if not leader:
        raise UnavailableError("the leader answered MoveLeader without naming the new leader")
    return str(leader)


def cluster_call(stub: Any, method: str, extra: tuple[tuple[str, str], ...] = ()) -> Callable[..., Any]:
    """The Cluster service's `method` on the channel of `stub` (the client's per-endpoint KV stub),
    asking a follower for a NOT_LEADER answer (kv/client/leader_hints.py), with `extra` metadata."""
    call = getattr(member_stubs(stub)[0], method)

    def send(request: Any, timeout: float, metadata: Any = None) -> Any:
        return call(request, timeout=timeout, metadata=(*(metadata or ()), HINTS, *extra))
    return send


def _move_leader(stub: Any) -> Callable[..., Any]:
    """Maintenance.MoveLeader, returning (response, trailing metadata as a dict)."""
    call = member_stubs(stub)[1].MoveLeader

    def send(request: Any, timeout: float, metadata: Any = None) -> Any:
        response, rpc = call.with_call(request, timeout=timeout, metadata=(*(metadata or ()), HINTS))
        return response, dict(rpc.trailing_metadata() or ())
    return send


def member_stubs(stub: Any) -> tuple[etcd_rpc_pb2_grpc.ClusterStub, etcd_rpc_pb2_grpc.MaintenanceStub]:
    """etcd's Cluster and Maintenance stubs on the channel kv.Client keeps for `stub`'s endpoint
    (set there as `etcd_members`)."""
    found: tuple[etcd_rpc_pb2_grpc.ClusterStub, etcd_rpc_pb2_grpc.MaintenanceStub] = stub.etcd_members
    return found
