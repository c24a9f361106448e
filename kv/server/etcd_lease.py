"""etcd's Lease service on a node's client port: Grant, Revoke, KeepAlive (a stream), TimeToLive
and Leases, over the replicated lease state (statemachine/leases.py) and the leader's Lessor
(kv/server/lessor.py). A follower sends Grant, Revoke, TimeToLive and each keep-alive on to the
leader, as etcd's members do."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from kv.server.etcd_checks import EtcdError
from kv.server.etcd_face import LEADER_CHANGED, EtcdFace
from kv.server.lessor import Lessor
from kv.server.node_calls import read_barrier
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from statemachine.leases import MAX_LEASE_TTL

TTL_TOO_LARGE = EtcdError(grpc.StatusCode.OUT_OF_RANGE, "etcdserver: too large lease TTL")


class EtcdLeaseServicer(etcd_rpc_pb2_grpc.LeaseServicer):
    def __init__(self, face: EtcdFace, lessor: Lessor) -> None:
        self._face = face
        self._lessor = lessor

    async def LeaseGrant(self, request: pb.LeaseGrantRequest,
                         context: grpc.aio.ServicerContext) -> pb.LeaseGrantResponse:
        face = self._face

        async def work() -> pb.LeaseGrantResponse:
            if request.TTL > MAX_LEASE_TTL:
                raise TTL_TOO_LARGE
            if not face.leads():
                return await face.forward(context, "Lease", "LeaseGrant", request, anyone=True)
            face.gate.check_token(context)  # etcd grants a lease to anyone, but refuses a bad token
            lease, ttl, revision = await self._lessor.grant(request.ID, request.TTL, context.time_remaining())
            response = pb.LeaseGrantResponse(ID=lease, TTL=ttl)
            face.header(response.header, revision)
            return response
        return await face.serve(context, work)

    async def LeaseRevoke(self, request: pb.LeaseRevokeRequest,
                          context: grpc.aio.ServicerContext) -> pb.LeaseRevokeResponse:
        face = self._face

        async def work() -> pb.LeaseRevokeResponse:
            if not face.leads():
                return await face.forward(context, "Lease", "LeaseRevoke", request)
            # The caller must be allowed to write every key attached (checked when applied, as etcd's
            # authApplierV3); one that names no one is refused at once, even for a lease without
            # keys (docs/etcd-compatibility.md).
            revision = await self._lessor.revoke(request.ID, context.time_remaining(), face.gate.caller(context))
            response = pb.LeaseRevokeResponse()
            face.header(response.header, revision)
            return response
        return await face.serve(context, work)

    async def LeaseTimeToLive(self, request: pb.LeaseTimeToLiveRequest,
                              context: grpc.aio.ServicerContext) -> pb.LeaseTimeToLiveResponse:
        face = self._face

        async def work() -> pb.LeaseTimeToLiveResponse:
            if not face.leads():
                return await face.forward(context, "Lease", "LeaseTimeToLive", request, anyone=True)
            remaining = self._lessor.remaining(request.ID)
            if remaining is None:
                response = pb.LeaseTimeToLiveResponse(ID=request.ID, TTL=-1)  # etcd's answer for no such lease
            else:
                response = pb.LeaseTimeToLiveResponse(ID=request.ID, TTL=remaining,
                                                      grantedTTL=face.fsm.leases.ttls.get(request.ID, 0))
                if request.keys:
                    response.keys.extend(await asyncio.to_thread(face.fsm.lease_keys, request.ID))
            face.header(response.header)
            return response
        return await face.serve(context, work)

    async def LeaseLeases(self, request: pb.LeaseLeasesRequest,
                          context: grpc.aio.ServicerContext) -> pb.LeaseLeasesResponse:
        face = self._face

        async def work() -> pb.LeaseLeasesResponse:
            response = pb.LeaseLeasesResponse(leases=[pb.LeaseStatus(ID=lease) for lease in sorted(face.fsm.leases.ttls)])
            face.header(response.header)
            return response
        return await face.serve(context, work)

    async def LeaseKeepAlive(self, requests: AsyncIterator[pb.LeaseKeepAliveRequest],
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LeaseKeepAliveResponse]:
        """Each keep-alive answered in order with the lease's TTL (0: no such lease), renewed by the
        leader once it has confirmed it still leads; a follower relays them to the leader on one
        stream of its own, and ends this stream with UNAVAILABLE when that stream breaks (the
        client opens a new one, as etcd's clients do)."""
        face = self._face
        upstream: _Upstream | None = None
        try:
            async for request in requests:
                if face.leads() and upstream is None:
                    response = pb.LeaseKeepAliveResponse(ID=request.ID)
                    face.header(response.header)  # before the renewal, as etcd
                    await face.serve(context, lambda: read_barrier(face.node, "lease", context.time_remaining()))
                    ttl = await face.serve(context, lambda: self._lessor.keep_alive(request.ID, context.time_remaining()))
                    if ttl is None:  # the lead was lost meanwhile: never "no such lease" for that
                        await face.serve(context, _leader_changed)
                    response.TTL = ttl
                    yield response
                    continue
                if upstream is None:
                    upstream = _Upstream(face, context)
                yield await face.serve(context, lambda: upstream.exchange(request))  # type: ignore[union-attr]
        finally:
            if upstream is not None:
                upstream.close()


class _Upstream:
    """One keep-alive stream from a follower to the leader, request by request."""

    def __init__(self, face: EtcdFace, context: grpc.aio.ServicerContext) -> None:
        self._face = face
        self._context = context
        self._call: grpc.aio.StreamStreamCall | None = None

    async def exchange(self, request: pb.LeaseKeepAliveRequest) -> pb.LeaseKeepAliveResponse:
        if self._call is None:
            channel = self._face.leader_channel()
            self._call = etcd_rpc_pb2_grpc.LeaseStub(channel).LeaseKeepAlive(metadata=self._face.forward_metadata(
                self._context, anyone=True))
        try:
            await self._call.write(request)
            response = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise LEADER_CHANGED from e
        if response is grpc.aio.EOF:
            raise LEADER_CHANGED
        self._face.member_header(response.header)
        return response

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()


async def _leader_changed() -> None:
    """A keep-alive that found its member no longer leading: etcd's "leader changed", which its
    clients answer by sending the keep-alive again on a new stream."""
    raise LEADER_CHANGED
