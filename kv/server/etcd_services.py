"""etcd 3.4's KV, Maintenance and Cluster services on a node's client port, beside the native API
(proto/raftkv_proto/etcd_rpc.proto). Both faces share one log and one MVCC state: a Put here is
seen by a native get and the other way round. The machinery they share (headers, errors, the
write path, forwarding to the leader) is kv/server/etcd_face.py; what differs from etcd is listed
in docs/etcd-compatibility.md."""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import grpc

from kv.server.etcd_checks import EtcdError, check_delete_range, check_put, check_range, check_txn
from kv.server.etcd_face import EtcdFace, member_number
from kv.server.kv_handler import TIMEOUT_MESSAGE, KVHandler, node_call
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2
from raft.node.ports import SnapshotInfo
from snapshot.transfer import chunk_file
from statemachine.etcd_txn import EtcdRefusal

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
            if not request.serializable and not face.leads():
                return await face.forward(context, "KV", "Range", request)
            face.check_read(face.user(context), request.key, request.range_end)
            await face.barrier(request.serializable, context.time_remaining())
            try:
                if request.range_end:
                    response = await asyncio.to_thread(face.fsm.etcd_range, request)
                else:  # one key: a lookup or two, cheaper on the loop than a thread's hand-off
                    response = face.fsm.etcd_range(request)
            except EtcdRefusal as refusal:
                raise EtcdError(grpc.StatusCode.OUT_OF_RANGE, str(refusal)) from None
            face.header(response.header, response.header.revision)
            return response
        return await face.serve(context, work)

    async def Put(self, request: pb.PutRequest, context: grpc.aio.ServicerContext) -> pb.PutResponse:
        async def work() -> pb.PutResponse:
            check_put(request)
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
            if not self._face.leads():
                return await self._face.forward(context, "KV", "Txn", request)
            response = await self._write(context, "Txn", request, request)
            self._face.header(response.header, response.header.revision)
            return response
        return await self._face.serve(context, work)

    async def Compact(self, request: pb.CompactionRequest,
                      context: grpc.aio.ServicerContext) -> pb.CompactionResponse:
        face = self._face

        async def work() -> pb.CompactionResponse:
            if not face.leads():
                return await face.forward(context, "KV", "Compact", request)
            revision = await face.compact(request.revision, face.user(context), context.time_remaining())
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
        return await face.write(txn, face.user(context), context.time_remaining())


class EtcdMaintenanceServicer(etcd_rpc_pb2_grpc.MaintenanceServicer):
    def __init__(self, face: EtcdFace, handler: KVHandler) -> None:
        self._face = face
        self._handler = handler

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

    async def HashKV(self, request: pb.HashKVRequest, context: grpc.aio.ServicerContext) -> pb.HashKVResponse:
        face = self._face

        async def work() -> pb.HashKVResponse:
            self._handler.check_root(face.user(context))  # etcd: HashKV is an admin's
            try:
                digest, revision, compacted = await asyncio.to_thread(face.fsm.hash_kv, request.revision)
            except EtcdRefusal as refusal:
                raise EtcdError(grpc.StatusCode.OUT_OF_RANGE, str(refusal)) from None
            response = pb.HashKVResponse(hash=digest, compact_revision=compacted)
            face.header(response.header, revision)
            return response
        return await face.serve(context, work)

    async def Alarm(self, request: pb.AlarmRequest, context: grpc.aio.ServicerContext) -> pb.AlarmResponse:
        face = self._face

        async def work() -> pb.AlarmResponse:
            if request.action != pb.AlarmRequest.GET and not face.leads():
                return await face.forward(context, "Maintenance", "Alarm", request)
            member = ""
            if request.memberID:
                member = next((m for m in face.node.config.members if member_number(m) == request.memberID), None)
                if member is None:
                    raise EtcdError(grpc.StatusCode.NOT_FOUND, "etcdserver: member not found")
            await self._handler.alarm(kv_pb2.AlarmRequest(action=request.action, member_id=member, alarm=request.alarm),
                                      context.time_remaining(), face.user(context))
            response = pb.AlarmResponse(alarms=[pb.AlarmMember(memberID=member_number(a.member_id), alarm=a.alarm)
                                                for a in face.fsm.alarms.listed()])
            return response  # etcd's AlarmResponse carries no header
        return await face.serve(context, work)

    async def Defragment(self, request: pb.DefragmentRequest,
                         context: grpc.aio.ServicerContext) -> pb.DefragmentResponse:
        """LMDB reuses the pages deletes and compactions free, so there is nothing to defragment."""
        async def work() -> pb.DefragmentResponse:
            self._handler.check_root(self._face.user(context))
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
            self._handler.check_root(face.user(context))
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


class EtcdClusterServicer(etcd_rpc_pb2_grpc.ClusterServicer):
    def __init__(self, face: EtcdFace) -> None:
        self._face = face

    async def MemberList(self, request: pb.MemberListRequest,
                         context: grpc.aio.ServicerContext) -> pb.MemberListResponse:
        face = self._face

        async def work() -> pb.MemberListResponse:
            config = face.node.config
            peer_scheme = "https" if config.security.peer.enabled else "http"
            client_scheme = "https" if config.security.client.enabled else "http"
            response = pb.MemberListResponse()
            for member in config.members:
                client = face.node.transport.client_address(member)
                peer = config.peers.get(member)
                response.members.add(ID=member_number(member), name=member,
                                     peerURLs=[f"{peer_scheme}://{peer}"] if peer else [],
                                     clientURLs=[f"{client_scheme}://{client}"] if client else [])
            face.member_header(response.header)
            return response
        return await face.serve(context, work)
