"""etcd 3.4's Cluster service on a node's client port: the members of the latest configuration in
the member's log (raft/core/membership.py), and their changes through the log. What differs from
etcd is listed in docs/etcd-compatibility.md; the other etcd services are kv/server/etcd_services.py."""
from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import grpc

from kv.client.members import MEMBER_NAME_KEY, has_name
from kv.server.etcd_checks import EtcdError
from kv.server.etcd_face import EtcdFace
from kv.server.node_calls import TIMEOUT_MESSAGE, begin_node_call
from raft.core.membership import ChangeKind, Membership, MembershipChangeError
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from raftkv_proto.member_ids import member_number, numbered_name

log = logging.getLogger(__name__)


class EtcdClusterServicer(etcd_rpc_pb2_grpc.ClusterServicer):
    """etcd's Cluster service over the node's membership (raft/core/membership.py): the latest
    configuration in the member's log, voters and learners, each with the peer address it was
    added with. Changes run on the leader (a follower forwards them, as writes), one at a time,
    under etcd's strict reconfiguration check (`_check_quorum`); each answers once its
    configuration is applied on the leader. What differs from etcd: docs/etcd-compatibility.md."""

    def __init__(self, face: EtcdFace) -> None:
        self._face = face

    async def MemberList(self, request: pb.MemberListRequest,
                         context: grpc.aio.ServicerContext) -> pb.MemberListResponse:
        face = self._face

        async def work() -> pb.MemberListResponse:
            response = pb.MemberListResponse(members=member_protos(face, context))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberAdd(self, request: pb.MemberAddRequest, context: grpc.aio.ServicerContext) -> pb.MemberAddResponse:
        face = self._face

        async def work() -> pb.MemberAddResponse:
            if not face.leads():
                return await _forwarded(face, context, "MemberAdd", request, carry=(MEMBER_NAME_KEY,))
            _check_admin(face, context)
            address = peer_address_of(request.peerURLs)
            membership = face.node.membership
            if any(membership.address(m) == address for m in membership.members) or \
                    address == face.node.transport.peer_address:
                raise PEER_URL_EXISTS
            name = _new_member_name(context, membership)
            if not request.isLearner:
                _check_quorum(face, len(membership.voters) + 1, _started(face, membership.voters), allow_second=True)
            kind = ChangeKind.ADD_LEARNER if request.isLearner else ChangeKind.ADD_VOTER
            await _take_peers(face, context)
            await _change(face, context, kind, name, address)
            response = pb.MemberAddResponse(members=member_protos(face, context))
            response.member.CopyFrom(next(m for m in response.members if m.ID == member_number(name)))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberRemove(self, request: pb.MemberRemoveRequest,
                           context: grpc.aio.ServicerContext) -> pb.MemberRemoveResponse:
        face = self._face

        async def work() -> pb.MemberRemoveResponse:
            if not face.leads():
                return await _forwarded(face, context, "MemberRemove", request)
            _check_admin(face, context)
            membership = face.node.membership
            member = _member_of(face, request.ID)
            if membership.is_voter(member):
                remaining = [v for v in membership.voters if v != member]
                _check_quorum(face, len(remaining), _started(face, remaining))
            await _change(face, context, ChangeKind.REMOVE, member)
            response = pb.MemberRemoveResponse(members=member_protos(face, context))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberUpdate(self, request: pb.MemberUpdateRequest,
                           context: grpc.aio.ServicerContext) -> pb.MemberUpdateResponse:
        """etcd's MemberUpdate: the member's peer URL changes through the log (an update: its
        address, nothing else; the voters stay), and its peers dial the new address once it is
        applied. A member restarted to take peers there is reached again. With the metadata
        `raftkv-member-name`, it is a member starting under that name that takes the place of the
        nameless member added for it (`_take_name`)."""
        face = self._face

        async def work() -> pb.MemberUpdateResponse:
            if not face.leads():
                return await _forwarded(face, context, "MemberUpdate", request, carry=(MEMBER_NAME_KEY,))
            name = dict(context.invocation_metadata() or ()).get(MEMBER_NAME_KEY)
            if name is None:
                _check_admin(face, context)
            member = _member_of(face, request.ID)
            address = peer_address_of(request.peerURLs)
            membership = face.node.membership
            if any(membership.address(m) == address for m in membership.members if m != member):
                raise PEER_URL_EXISTS
            if name is None:
                await _change(face, context, ChangeKind.UPDATE, member, address)
            else:
                await _take_name(face, context, member, address, name)
            response = pb.MemberUpdateResponse(members=member_protos(face, context))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberPromote(self, request: pb.MemberPromoteRequest,
                            context: grpc.aio.ServicerContext) -> pb.MemberPromoteResponse:
        face = self._face

        async def work() -> pb.MemberPromoteResponse:
            if not face.leads():
                return await _forwarded(face, context, "MemberPromote", request)
            _check_admin(face, context)
            membership = face.node.membership
            member = _member_of(face, request.ID)
            if membership.is_voter(member):
                raise NOT_LEARNER
            _check_in_sync(face, member)
            # etcd counts the learner as started: it is in sync, so the leader hears from it.
            _check_quorum(face, len(membership.voters) + 1, _started(face, membership.voters) + 1)
            await _change(face, context, ChangeKind.PROMOTE, member)
            response = pb.MemberPromoteResponse(members=member_protos(face, context))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)


# ---- etcd's errors of the Cluster service (etcd 3.4's rpctypes/error.go) -------------------------

MEMBER_NOT_FOUND = EtcdError(grpc.StatusCode.NOT_FOUND, "etcdserver: member not found")
PEER_URL_EXISTS = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: Peer URLs already exists")
BAD_URLS = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: given member URLs are invalid")
NOT_ENOUGH_STARTED = EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                               "etcdserver: re-configuration failed due to not enough started members")
NOT_LEARNER = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: can only promote a learner member")
LEARNER_NOT_READY = EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                              "etcdserver: can only promote a learner member which is in sync with leader")
# A learner is in sync (may be promoted) once it holds this share of the leader's log (etcd's readyPercent).
READY_SHARE = 0.9
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def member_protos(face: EtcdFace, context: grpc.aio.ServicerContext) -> list[pb.Member]:
    """The members of the latest configuration as etcd lists them: voters, then learners, each by
    name; peerURLs from the address it was added with, clientURLs from where it takes clients
    (empty until it has been heard from, as etcd's unstarted member). Asked through the JSON
    gateway (a context with `over_http`), clientURLs are the members' gateway URLs: a client of
    the gateway (Patroni) replaces its endpoints with them."""
    node = face.node
    over_http = _over_http(context)
    peer_scheme = "https" if node.config.security.peer.enabled else "http"
    membership = node.membership
    out = []
    for learner, members in ((False, membership.voters), (True, membership.learners)):
        for member in sorted(members):
            peer = members[member] or node.config.peers.get(member) or (node.transport.peer_address
                                                                         if member == node.id else "")
            out.append(pb.Member(ID=member_number(member), name=member if has_name(member) else "", isLearner=learner,
                                 peerURLs=[f"{peer_scheme}://{peer}"] if peer else [],
                                 clientURLs=_client_urls(face, member, over_http)))
    return out


def _over_http(context: grpc.aio.ServicerContext) -> bool:
    return getattr(context, "over_http", False)


def _client_urls(face: EtcdFace, member: str, over_http: bool) -> list[str]:
    """Where `member` takes clients: its gRPC port, or asked over the JSON gateway its gateway."""
    transport = face.node.transport
    client = transport.client_http_address(member) if over_http else transport.client_address(member)
    return [f"{'https' if face.node.config.security.client.enabled else 'http'}://{client}"] if client else []


async def _forwarded(face: EtcdFace, context: grpc.aio.ServicerContext, method: str, request: Any,
                     carry: tuple[str, ...] = ()) -> Any:
    """A member change sent on to the leader (face.forward). The leader answered a gRPC call, so
    its members' clientURLs are their gRPC ports; asked over this member's JSON gateway they
    become the members' gateways, as `member_protos` lists them (a client of the gateway, Patroni,
    replaces its endpoints with them)."""
    response = await face.forward(context, "Cluster", method, request, carry=carry)
    if _over_http(context):
        names = {member_number(m): m for m in face.node.membership.members}
        added = [response.member] if isinstance(response, pb.MemberAddResponse) else []
        for member in [*response.members, *added]:
            if member.ID in names:  # else added by the leader, not yet in this log: unstarted, no URL
                member.ClearField("clientURLs")
                member.clientURLs.extend(_client_urls(face, names[member.ID], over_http=True))
    return response


def peer_address_of(urls: Sequence[str]) -> str:
    """The one host:port of a member's peerURLs ("http://host:port", "https://..." or bare
    "host:port"); etcd's "given member URLs are invalid" otherwise."""
    if len(urls) != 1:
        if len(urls) > 1:
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT,
                            "etcdserver: given member URLs are invalid (raftkv takes one peer URL per member)")
        raise BAD_URLS
    url = urls[0].strip()
    scheme, _, rest = url.rpartition("://")
    if scheme not in ("", "http", "https"):
        raise BAD_URLS
    host, _, port = rest.rstrip("/").rpartition(":")
    if not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BAD_URLS
    return f"{host}:{int(port)}"


def _new_member_name(context: grpc.aio.ServicerContext, membership: Membership) -> str:
    """The name a raftkv client sent (MEMBER_NAME_KEY), else none yet: the member is nameless,
    named by a random etcd id (numbered_name) until it starts under its name (_take_name)."""
    sent = dict(context.invocation_metadata() or ()).get(MEMBER_NAME_KEY)
    if sent is not None:
        _check_name(sent, membership)
        return sent
    while True:
        name = numbered_name(secrets.randbits(64))
        if name not in membership and name not in membership.removed and member_number(name):
            return name


def _check_name(name: str, membership: Membership) -> None:
    """A name a member may be given: well formed and not a member's (the core refuses a removed one)."""
    if not _NAME.fullmatch(name):
        raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"bad member name {name!r}: letters, digits, '.', '_' and '-', at most 63, "
                        "starting with a letter or digit")
    if name in membership:
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, f"etcdserver: member ID already exist ({name})")


async def _take_name(face: EtcdFace, context: grpc.aio.ServicerContext, member: str, address: str,
                     name: str) -> None:
    """A member starting as `name` (serve --join) takes the place of `member`, nameless (etcd's
    MemberAdd gave it no name) and at the same peer address: `member` is removed and `name` added
    as what it was (learner or voter), two single-server changes (decision 0068). A nameless member
    never ran (no process takes a numbered name), so it holds nothing the cluster needs, and the
    configuration after the two changes has the voters it had, under another name. Asked by the
    member itself, which holds no credentials: it can only name a nameless member, at its address."""
    membership = face.node.membership
    if member == name:
        return  # taken already: an answer that was lost, asked again
    if has_name(member):
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, f"member {member} has a name already: start it as "
                                                             f"{member}, or add {name} as a member of its own")
    if address != membership.address(member):
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                        f"the nameless member {member_number(member):x} takes peers at "
                        f"{membership.address(member)}, not {address}: start {name} with --listen-peer there")
    _check_name(name, membership)
    if name in membership.removed:
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, f"{name} was removed from this cluster, and an id "
                                                             f"is never used again: start the member under a new name")
    learner = member in membership.learners
    await _change(face, context, ChangeKind.REMOVE, member)
    await _change(face, context, ChangeKind.ADD_LEARNER if learner else ChangeKind.ADD_VOTER, name, address)


async def _take_peers(face: EtcdFace, context: grpc.aio.ServicerContext) -> None:
    """Before a member is added: the leader takes peers' connections at the address member_protos
    lists for it, and the configuration names that address. A member started alone (no --peers,
    no --listen-peer) listens for peers only once it has some, and the configuration it started
    with names no address for it (an update adds one, before the new member)."""
    node = face.node
    address = node.membership.address(node.id) or node.transport.peer_address
    try:
        await node.transport.listen_grown(address)
    except OSError as e:
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                        f"{node.id} cannot take its peers' connections at {address} ({e}): restart it with "
                        f"--listen-peer HOST:PORT") from None
    if not node.membership.address(node.id):
        await _change(face, context, ChangeKind.UPDATE, node.id, address)


def _member_of(face: EtcdFace, number: int) -> str:
    """The member whose etcd id is `number`: etcd's "member not found" when there is none."""
    member = next((m for m in face.node.membership.members if member_number(m) == number), None)
    if member is None:
        raise MEMBER_NOT_FOUND
    return member


def _check_admin(face: EtcdFace, context: grpc.aio.ServicerContext) -> None:
    """etcd allows membership changes to root alone while auth is on."""
    face.gate.check_root(face.gate.caller(context))


def _started(face: EtcdFace, voters: Iterable[str]) -> int:
    """How many of `voters` are started, for etcd's strict reconfiguration check: the leader
    (this node) is; another voter is when the leader heard from it within an election timeout."""
    active = face.node.core.recently_active()
    return sum(1 for v in voters if v in active)


def _check_quorum(face: EtcdFace, voters_after: int, started: int, allow_second: bool = False) -> None:
    """etcd's strict reconfiguration check: the configuration after the change must have a
    majority of started voters (etcd lets a one-member cluster add its second). Off with
    --strict-reconfig-check=false."""
    if not face.node.config.strict_reconfig_check or (allow_second and started == 1 and voters_after == 2):
        return
    if started < voters_after // 2 + 1:
        raise NOT_ENOUGH_STARTED


def _check_in_sync(face: EtcdFace, learner: str) -> None:
    """etcd's isLearnerReady: the learner's match index is at least 90% of the leader's."""
    status = face.node.core.status()
    if status.peers.get(learner, 0) < status.last_index * READY_SHARE:
        raise LEARNER_NOT_READY


async def _change(face: EtcdFace, context: grpc.aio.ServicerContext, kind: ChangeKind, member: str,
                  address: str = "") -> None:
    """Propose the change and wait until its configuration is applied (a refusal of the core's
    rules as FAILED_PRECONDITION with its message)."""
    node = face.node
    try:
        await begin_node_call(node, lambda: node.propose_membership(kind, member, address),
                              context.time_remaining(), TIMEOUT_MESSAGE, lambda done: done)
    except MembershipChangeError as refusal:
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, str(refusal)) from None
    log.info("membership: %s %s%s (voters %s, learners %s)", kind.value, member, f" at {address}" if address else "",
             ", ".join(sorted(node.membership.voters)) or "-", ", ".join(sorted(node.membership.learners)) or "-")
