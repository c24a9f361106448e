"""etcd 3.4's KV and Maintenance services on a node's client port, beside the native API
(proto/raftkv_proto/etcd_rpc.proto). Both faces share one log and one MVCC state: a Put here is
seen by a native get and the other way round. The machinery they share (headers, errors, the
write path, forwarding to the leader) is kv/server/etcd_face.py; what differs from etcd is listed
in docs/etcd-compatibility.md; the Cluster service is kv/server/etcd_cluster.py."""
from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

import grpc

from kv import errors
from kv.server.etcd_checks import EtcdError, check_delete_range, check_put, check_range, check_txn
from kv.server.etcd_backup import etcd_snapshot_chunks
from kv.server.etcd_face import EtcdFace
from raftkv_proto.member_ids import member_number, numbered_name
from kv.server.node_calls import TIMEOUT_MESSAGE, node_call, read_barrier
from raft.node import errors as node_errors
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2
from raft.node.ports import SnapshotInfo
from statemachine.alarms import Alarm
from statemachine.etcd_txn import EtcdRefusal, read_only, serializable

T = TypeVar("T")
log = logging.getLogger(__name__)

# What Maintenance.Status reports as the server's version: the etcd API raftkv speaks.
ETCD_API_VERSION = "3.4.0"
_SNAPSHOT_CHUNK = 1 << 20


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
            response = await face.handler.range(request, context.time_remaining(), face.gate.caller(context),
                                               face.when_sent(context))
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
        response = await face.handler.read_txn(request, context.time_remaining(), face.gate.caller(context),
                                             face.when_sent(context))
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
        member it names, linearizably; ACTIVATE raises the alarm for the member id given, any id, 0 included
        (python-etcd3's default), and answers with it; DEACTIVATE clears that one alarm and answers
        with it, or with nothing when it was not raised. Raising NONE changes nothing (etcd 3.4.23
        stops on it: its store takes no empty key)."""
        face = self._face

        async def work() -> pb.AlarmResponse:
            action, kind = request.action, request.alarm
            # etcd's GET goes through its log too: an alarm raised or cleared through any member
            # before it is listed, so the leader answers it after a ReadIndex round.
            if not face.leads():
                return await face.forward(context, "Maintenance", "Alarm", request)
            if action == pb.AlarmRequest.GET:
                await read_barrier(face.node, "linearizable", context.time_remaining())
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
        """An etcd snapshot of this member's state, as etcd's is of its member's: a bbolt database in
        etcd 3.4's layout made from a snapshot taken now, then its sha256 (the trailer etcdctl's
        snapshot save checks): kv/server/etcd_backup.py. Root only while auth is on."""
        face = self._face

        async def take() -> SnapshotInfo:
            _check_maintainer(face, context)
            node = face.node
            return await node_call(node, lambda: node.take_snapshot(at_least=node.applied_index),
                                   context.time_remaining(), TIMEOUT_MESSAGE)
        info = await face.serve(context, take)
        async for blob, remaining in etcd_snapshot_chunks(info.path, _SNAPSHOT_CHUNK):
            response = pb.SnapshotResponse(blob=blob, remaining_bytes=remaining)
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


# ---- etcd's errors of MoveLeader (etcd 3.4's rpctypes/error.go) ----------------------------------

NOT_LEADER = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: not leader")
BAD_TRANSFEREE = EtcdError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
# etcd maps its ErrTimeoutLeaderTransfer to no gRPC code: it reaches the client as UNKNOWN.
TRANSFER_TIMED_OUT = EtcdError(grpc.StatusCode.UNKNOWN, "etcdserver: request timed out, leader transfer took too long")


def _check_maintainer(face: EtcdFace, context: grpc.aio.ServicerContext) -> None:
    """etcd's authMaintenanceServer (Hash, HashKV, Defragment, Snapshot): root only while auth
    is on, refused with the auth store's own error, which etcd 3.4 passes on unmapped: code
    UNKNOWN, "auth: permission denied" (or "auth: user name is empty", "auth: invalid auth token")."""
    try:
        face.gate.check_root(face.gate.caller(context))
    except errors.RaftKVError as e:
        raise EtcdError(grpc.StatusCode.UNKNOWN, str(e).replace("etcdserver: ", "auth: ", 1)) from None


def _alarm_member(face: EtcdFace, number: int) -> str:
    """The raftkv name of etcd member id `number`: a member's, else one that stands for the number."""
    members = face.node.membership.members or face.node.config.members
    return next((m for m in members if member_number(m) == number), None) or numbered_name(number)


def _alarm_response(alarms: Iterable[Alarm]) -> pb.AlarmResponse:
    return pb.AlarmResponse(alarms=[pb.AlarmMember(memberID=member_number(a.member_id), alarm=a.alarm) for a in alarms])
