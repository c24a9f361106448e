"""etcd 3.4's KV, Maintenance and Cluster services on a node's client port, beside the native API
(proto/raftkv_proto/etcd_rpc.proto). Both faces share one log and one MVCC state: a Put here is
seen by a native get and the other way round. The machinery they share (headers, errors, the
write path, forwarding to the leader) is kv/server/etcd_face.py; what differs from etcd is listed
in docs/etcd-compatibility.md."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import zlib
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TypeVar

import grpc

from kv import errors
from kv.client.members import MEMBER_NAME_KEY
from kv.server.etcd_checks import EtcdError, check_delete_range, check_put, check_range, check_txn
from kv.server.etcd_face import EtcdFace
from raftkv_proto.member_ids import member_number, numbered_name
from kv.server.node_calls import TIMEOUT_MESSAGE, begin_node_call, node_call
from raft.core.membership import ChangeKind, MembershipChangeError
from raft.node import errors as node_errors
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2
from raft.node.ports import SnapshotInfo
from snapshot.transfer import chunk_file
from statemachine.alarms import Alarm
from statemachine.etcd_txn import EtcdRefusal, read_only, serializable

T = TypeVar("T")
log = logging.getLogger(__name__)

# What Maintenance.Status reports as the server's version: the etcd API raftkv speaks.
ETCD_API_VERSION = "3.4.0"
_SNAPSHOT_CHUNK = 1 << 20
_SECTOR = 512


class EtcdKVServicer(etcd_rpc_pb2_grpc.KVServicer):
    def __init__(self, face: EtcdFace) -> None:
        self._face = face

    async def Range(self, request: pb.RangeRequest, context: grpc.aio.ServicerContext) -> pb.RangeResponse:
        face = self._face

        async def work() -> pb.RangeResponse:
            check_range(request)
            face.checks.key(request.key)
            if not request.serializable and not face.leads():
                return await face.forward(context, "KV", "Range", request)
            response = await face.handler.range(request, context.time_remaining(), face.gate.caller(context))
            face.header(response.header, response.header.revision)
            return response
        return await face.serve(context, work)

    async def Put(self, request: pb.PutRequest, context: grpc.aio.ServicerContext) -> pb.PutResponse:
        async def work() -> pb.PutResponse:
            check_put(request)
            self._face.checks.put(request.key, request.value)
            txn = await self._write(context, "Put", request, pb.TxnRequest(success=[pb.RequestOp(request_put=request)]))
            if isinstance(txn, pb.PutResponse):
                return txn  # the leader's answer to a forwarded call
            response = txn.responses[0].response_put
            self._face.header(response.header, txn.header.revision)
            return response
        return await self._face.serve(context, work)

    async def DeleteRange(self, request: pb.DeleteRangeRequest,
                          context: grpc.aio.ServicerContext) -> pb.DeleteRangeResponse:
        async def work() -> pb.DeleteRangeResponse:
            check_delete_range(request)
            self._face.checks.key(request.key)
            txn = await self._write(context, "DeleteRange", request,
                                    pb.TxnRequest(success=[pb.RequestOp(request_delete_range=request)]))
            if isinstance(txn, pb.DeleteRangeResponse):
                return txn
            response = txn.responses[0].response_delete_range
            self._face.header(response.header, txn.header.revision)
            return response
        return await self._face.serve(context, work)

    async def Txn(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> pb.TxnResponse:
        async def work() -> pb.TxnResponse:
            check_txn(request)
            self._face.checks.etcd_txn(request)
            if read_only(request):
                return await self._read_txn(request, context)
            if not self._face.leads():
                return await self._face.forward(context, "KV", "Txn", request)
            response = await self._write(context, "Txn", request, request)
            self._face.header(response.header, response.header.revision)
            return response
        return await self._face.serve(context, work)

    async def _read_txn(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> pb.TxnResponse:
        """A read-only Txn, served as a Range is: by this member when every range is serializable,
        else by the leader (a follower forwards it), after a ReadIndex round."""
        face = self._face
        if not serializable(request) and not face.leads():
            return await face.forward(context, "KV", "Txn", request)
        response = await face.handler.read_txn(request, context.time_remaining(), face.gate.caller(context))
        face.header(response.header, response.header.revision)
        return response

    async def Compact(self, request: pb.CompactionRequest,
                      context: grpc.aio.ServicerContext) -> pb.CompactionResponse:
        face = self._face

        async def work() -> pb.CompactionResponse:
            if not face.leads():
                return await face.forward(context, "KV", "Compact", request)
            revision = await face.handler.compact(request.revision, context.time_remaining(), face.gate.caller(context))
            response = pb.CompactionResponse()
            face.header(response.header, revision)
            return response
        return await face.serve(context, work)

    async def _write(self, context: grpc.aio.ServicerContext, method: str, request: object,
                     txn: pb.TxnRequest) -> object:
        """The write through the log on the leader (a TxnResponse), or the leader's answer to
        `request` forwarded from a follower."""
        face = self._face
        if not face.leads():
            return await face.forward(context, "KV", method, request)
        return await face.handler.txn(txn, context.time_remaining(), face.gate.caller(context))


class EtcdMaintenanceServicer(etcd_rpc_pb2_grpc.MaintenanceServicer):
    def __init__(self, face: EtcdFace) -> None:
        self._face = face

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        face = self._face

        async def work() -> pb.StatusResponse:
            status = face.node.status()
            response = pb.StatusResponse(
                version=ETCD_API_VERSION, dbSize=face.fsm.size_bytes(), dbSizeInUse=face.fsm.in_use_bytes(),
                leader=member_number(status["leader"]) if status["leader"] else 0,
                raftIndex=status["commit_index"], raftTerm=status["term"], raftAppliedIndex=status["applied_index"],
                errors=[f"memberID:{member_number(a.member_id)} alarm:{a.name} " for a in face.fsm.alarms.listed()])
            face.header(response.header)
            return response
        return await face.serve(context, work)

    async def Hash(self, request: pb.HashRequest, context: grpc.aio.ServicerContext) -> pb.HashResponse:
        """etcd's Hash, a testing tool that hashes a member's whole backend: here a CRC-32 of this
        member's whole state (ReadView.state_hash: keys, history, auth), equal on members that have
        applied the same entries, never equal to etcd's. Root only while auth is on, as etcd's."""
        face = self._face

        async def work() -> pb.HashResponse:
            _check_maintainer(face, context)
            digest = await asyncio.to_thread(face.fsm.state_hash)
            response = pb.HashResponse(hash=zlib.crc32(bytes.fromhex(digest)))
            face.header(response.header)
            return response
        return await face.serve(context, work)

    async def HashKV(self, request: pb.HashKVRequest, context: grpc.aio.ServicerContext) -> pb.HashKVResponse:
        face = self._face

        async def work() -> pb.HashKVResponse:
            _check_maintainer(face, context)
            try:
                digest, revision, compacted = await asyncio.to_thread(face.fsm.hash_kv, request.revision)
            except EtcdRefusal as refusal:
                raise EtcdError(grpc.StatusCode.OUT_OF_RANGE, str(refusal)) from None
            response = pb.HashKVResponse(hash=digest, compact_revision=compacted)
            face.header(response.header, revision)
            return response
        return await face.serve(context, work)

    async def Alarm(self, request: pb.AlarmRequest, context: grpc.aio.ServicerContext) -> pb.AlarmResponse:
        """etcd's Alarm (its applier's answers): GET lists the alarms of a type (NONE: all), whatever
        member it names; ACTIVATE raises the alarm for the member id given, any id, 0 included
        (python-etcd3's default), and answers with it; DEACTIVATE clears that one alarm and answers
        with it, or with nothing when it was not raised. Raising NONE changes nothing (etcd 3.4.23
        stops on it: its store takes no empty key)."""
        face = self._face

        async def work() -> pb.AlarmResponse:
            action, kind = request.action, request.alarm
            if action != pb.AlarmRequest.GET and not face.leads():
                return await face.forward(context, "Maintenance", "Alarm", request)
            if action == pb.AlarmRequest.GET:
                return _alarm_response(a for a in face.fsm.alarms.listed() if kind in (pb.NONE, a.alarm))
            if kind == pb.NONE:
                return pb.AlarmResponse()
            member = _alarm_member(face, request.memberID)
            before = face.fsm.alarms.alarms
            await face.handler.alarm(kv_pb2.AlarmRequest(action=action, member_id=member, alarm=kind),
                                     context.time_remaining(), face.gate.caller(context))
            target = Alarm(member, kind)
            raised = action == pb.AlarmRequest.ACTIVATE or target in before
            return _alarm_response([target] if raised else [])  # etcd's AlarmResponse carries no header
        return await face.serve(context, work)

    async def Defragment(self, request: pb.DefragmentRequest,
                         context: grpc.aio.ServicerContext) -> pb.DefragmentResponse:
        """LMDB reuses the pages deletes and compactions free, so there is nothing to defragment."""
        async def work() -> pb.DefragmentResponse:
            _check_maintainer(self._face, context)
            response = pb.DefragmentResponse()
            self._face.header(response.header)
            return response
        return await self._face.serve(context, work)

    async def Snapshot(self, request: pb.SnapshotRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.SnapshotResponse]:
        """A raftkv snapshot file of this member's state, as etcd's snapshot is of its member's:
        the file's bytes padded to 512, then their sha256 (the trailer etcdctl's snapshot save checks).
        Root only while auth is on."""
        face = self._face

        async def take() -> SnapshotInfo:
            _check_maintainer(face, context)
            node = face.node
            return await node_call(node, lambda: node.take_snapshot(at_least=node.applied_index),
                                   context.time_remaining(), TIMEOUT_MESSAGE)
        info = await face.serve(context, take)
        digest = hashlib.sha256()
        sent = 0
        chunks = chunk_file(info.path, _SNAPSHOT_CHUNK)
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            digest.update(chunk.data)
            sent += len(chunk.data)
            response = pb.SnapshotResponse(blob=chunk.data, remaining_bytes=info.file_size - sent)
            face.header(response.header)
            yield response
        # etcdctl takes a stream whose length is 32 past a multiple of 512 (a database of whole
        # sectors, then the sum) as complete: zeros pad the file to a sector, inside the sum.
        padding = bytes(-sent % _SECTOR)
        digest.update(padding)
        response = pb.SnapshotResponse(blob=padding + digest.digest(), remaining_bytes=0)
        face.header(response.header)
        yield response

    async def MoveLeader(self, request: pb.MoveLeaderRequest,
                         context: grpc.aio.ServicerContext) -> pb.MoveLeaderResponse:
        """Hand leadership to the voter `targetID` (node.transfer_leadership) and answer once it
        leads, as etcd does; only the leader takes it ("etcdserver: not leader" elsewhere, as etcd:
        etcdctl move-leader finds the leader among its endpoints). A raftkv client is sent to the
        leader instead, may leave targetID 0 for the voter furthest along, and learns the new
        leader from the answer's trailing metadata (kv.errors.LEADER_ID_KEY)."""
        face = self._face

        async def work() -> pb.MoveLeaderResponse:
            node = face.node
            raftkv_client = errors.LEADER_HINTS_KEY in dict(context.invocation_metadata() or ())
            if not face.leads():
                if raftkv_client:
                    face.forward_metadata(context)  # raises the redirect to the leader
                raise NOT_LEADER
            face.gate.check_root(face.gate.caller(context))
            membership = node.membership
            target: str | None = None
            if request.targetID or not raftkv_client:
                target = next((m for m in membership.voters if member_number(m) == request.targetID), None)
                if target is None:
                    raise BAD_TRANSFEREE  # not a member, or a learner
            if target != node.id:
                try:
                    new_leader = await node.transfer_leadership(target)
                except ValueError as refusal:
                    raise EtcdError(BAD_TRANSFEREE.code, f"{BAD_TRANSFEREE} ({refusal})") from None
                except TimeoutError:
                    raise TRANSFER_TIMED_OUT from None
                except node_errors.NotLeaderError:
                    raise NOT_LEADER from None
                if target is not None and new_leader != target:
                    raise EtcdError(TRANSFER_TIMED_OUT.code, f"{TRANSFER_TIMED_OUT} ({new_leader} leads, not {target})")
            else:
                new_leader = target
            log.info("leadership moved from %s to %s at the request of a client", node.id, new_leader)
            context.set_trailing_metadata(((errors.LEADER_ID_KEY, new_leader),))
            response = pb.MoveLeaderResponse()
            face.member_header(response.header)
            return response
        return await face.serve(context, work)


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
            response = pb.MemberListResponse(members=member_protos(face))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberAdd(self, request: pb.MemberAddRequest, context: grpc.aio.ServicerContext) -> pb.MemberAddResponse:
        face = self._face

        async def work() -> pb.MemberAddResponse:
            if not face.leads():
                return await face.forward(context, "Cluster", "MemberAdd", request, carry=(MEMBER_NAME_KEY,))
            _check_admin(face, context)
            address = peer_address_of(request.peerURLs)
            membership = face.node.membership
            if any(membership.address(m) == address for m in membership.members):
                raise PEER_URL_EXISTS
            name = _new_member_name(context, membership.members)
            if not request.isLearner:
                _check_quorum(face, len(membership.voters) + 1, _started(face, membership.voters), allow_second=True)
            kind = ChangeKind.ADD_LEARNER if request.isLearner else ChangeKind.ADD_VOTER
            await _change(face, context, kind, name, address)
            response = pb.MemberAddResponse(members=member_protos(face))
            response.member.CopyFrom(next(m for m in response.members if m.name == name))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberRemove(self, request: pb.MemberRemoveRequest,
                           context: grpc.aio.ServicerContext) -> pb.MemberRemoveResponse:
        face = self._face

        async def work() -> pb.MemberRemoveResponse:
            if not face.leads():
                return await face.forward(context, "Cluster", "MemberRemove", request)
            _check_admin(face, context)
            membership = face.node.membership
            member = _member_of(face, request.ID)
            if membership.is_voter(member):
                remaining = [v for v in membership.voters if v != member]
                _check_quorum(face, len(remaining), _started(face, remaining))
            await _change(face, context, ChangeKind.REMOVE, member)
            response = pb.MemberRemoveResponse(members=member_protos(face))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberUpdate(self, request: pb.MemberUpdateRequest,
                           context: grpc.aio.ServicerContext) -> pb.MemberUpdateResponse:
        """A member's peer URL cannot change in raftkv (a configuration names each member's
        address, and the core has no change for it): the same address is accepted as it is,
        another refused, saying what to do instead."""
        face = self._face

        async def work() -> pb.MemberUpdateResponse:
            if not face.leads():
                return await face.forward(context, "Cluster", "MemberUpdate", request)
            _check_admin(face, context)
            membership = face.node.membership
            member = _member_of(face, request.ID)
            address = peer_address_of(request.peerURLs)
            if address != membership.address(member):
                if any(membership.address(m) == address for m in membership.members if m != member):
                    raise PEER_URL_EXISTS
                raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, UPDATE_REFUSED.format(member=member))
            response = pb.MemberUpdateResponse(members=member_protos(face))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)

    async def MemberPromote(self, request: pb.MemberPromoteRequest,
                            context: grpc.aio.ServicerContext) -> pb.MemberPromoteResponse:
        face = self._face

        async def work() -> pb.MemberPromoteResponse:
            if not face.leads():
                return await face.forward(context, "Cluster", "MemberPromote", request)
            _check_admin(face, context)
            membership = face.node.membership
            member = _member_of(face, request.ID)
            if membership.is_voter(member):
                raise NOT_LEARNER
            _check_in_sync(face, member)
            # etcd counts the learner as started: it is in sync, so the leader hears from it.
            _check_quorum(face, len(membership.voters) + 1, _started(face, membership.voters) + 1)
            await _change(face, context, ChangeKind.PROMOTE, member)
            response = pb.MemberPromoteResponse(members=member_protos(face))
            face.member_header(response.header)
            return response
        return await face.serve(context, work)


# ---- etcd's errors of the Cluster service and MoveLeader (etcd 3.4's rpctypes/error.go) ------------

MEMBER_NOT_FOUND = EtcdError(grpc.StatusCode.NOT_FOUND, "etcdserver: member not found")
PEER_URL_EXISTS = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: Peer URLs already exists")
BAD_URLS = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: given member URLs are invalid")
NOT_ENOUGH_STARTED = EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                               "etcdserver: re-configuration failed due to not enough started members")
NOT_LEARNER = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: can only promote a learner member")
LEARNER_NOT_READY = EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                              "etcdserver: can only promote a learner member which is in sync with leader")
NOT_LEADER = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: not leader")
BAD_TRANSFEREE = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
# etcd maps its ErrTimeoutLeaderTransfer to no gRPC code: it reaches the client as UNKNOWN.
TRANSFER_TIMED_OUT = EtcdError(grpc.StatusCode.UNKNOWN, "etcdserver: request timed out, leader transfer took too long")
UPDATE_REFUSED = ("raftkv cannot change a member's peer address (MemberUpdate): add a member under a new id at "
                  "the new address (raftkv member add NEW_ID --peer-address HOST:PORT --learner, start it with "
                  "raftkv serve --join, raftkv member promote NEW_ID), then remove {member}: a removed id is "
                  "never used again")
# A learner is in sync (may be promoted) once it holds this share of the leader's log (etcd's readyPercent).
READY_SHARE = 0.9
# The names MemberAdd gives a member when the caller names none (etcd's MemberAdd carries no name).
GENERATED_NAME = "m{:08x}"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
def member_protos(face: EtcdFace) -> list[pb.Member]:
    """The members of the latest configuration as etcd lists them: voters, then learners, each by
    name; peerURLs from the address it was added with, clientURLs from where it takes clients
    (empty until it has been heard from, as etcd's unstarted member)."""
    node = face.node
    security = node.config.security
    peer_scheme = "https" if security.peer.enabled else "http"
    client_scheme = "https" if security.client.enabled else "http"
    membership = node.membership
    out = []
    for learner, members in ((False, membership.voters), (True, membership.learners)):
        for member in sorted(members):
            peer = members[member] or node.config.peers.get(member)
            client = node.transport.client_address(member)
            out.append(pb.Member(ID=member_number(member), name=member, isLearner=learner,
                                 peerURLs=[f"{peer_scheme}://{peer}"] if peer else [],
                                 clientURLs=[f"{client_scheme}://{client}"] if client else []))
    return out


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


def _new_member_name(context: grpc.aio.ServicerContext, taken: Sequence[str]) -> str:
    """The name a raftkv client sent (MEMBER_NAME_KEY), else a generated one, as m + 8 hex digits."""
    sent = dict(context.invocation_metadata() or ()).get(MEMBER_NAME_KEY)
    if sent is not None:
        if not _NAME.fullmatch(sent):
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT,
                            f"bad member name {sent!r}: letters, digits, '.', '_' and '-', at most 63, "
                            "starting with a letter or digit")
        if sent in taken:
            raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, f"etcdserver: member ID already exist ({sent})")
        return sent
    while True:
        name = GENERATED_NAME.format(secrets.randbits(32))
        if name not in taken:
            return name


def _member_of(face: EtcdFace, number: int) -> str:
    """The member whose etcd id is `number`: etcd's "member not found" when there is none."""
    member = next((m for m in face.node.membership.members if member_number(m) == number), None)
    if member is None:
        raise MEMBER_NOT_FOUND
    return member


def _check_admin(face: EtcdFace, context: grpc.aio.ServicerContext) -> None:
    """etcd allows membership changes to root alone while auth is on."""
    face.gate.check_root(face.gate.caller(context))


def _check_maintainer(face: EtcdFace, context: grpc.aio.ServicerContext) -> None:
    """etcd's authMaintenanceServer (Hash, HashKV, Defragment, Snapshot): root only while auth
    is on, refused with the auth store's own error, which etcd 3.4 passes on unmapped: code
    UNKNOWN, "auth: permission denied" (or "auth: user name is empty", "auth: invalid auth token")."""
    try:
        face.gate.check_root(face.gate.caller(context))
    except errors.RaftKVError as e:
        raise EtcdError(grpc.StatusCode.UNKNOWN, str(e).replace("etcdserver: ", "auth: ", 1)) from None


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


def _alarm_member(face: EtcdFace, number: int) -> str:
    """The raftkv name of etcd member id `number`: a member's, else one that stands for the number."""
    members = face.node.membership.members or face.node.config.members
    return next((m for m in members if member_number(m) == number), None) or numbered_name(number)


def _alarm_response(alarms: Iterable[Alarm]) -> pb.AlarmResponse:
    return pb.AlarmResponse(alarms=[pb.AlarmMember(memberID=member_number(a.member_id), alarm=a.alarm) for a in alarms])
