"""kv.aio.Client's member calls: kv.Client's (kv/client/members.py), awaited.

    async with kv.aio.Client("127.0.0.1:7001") as c:
        await c.member_add("n4", "127.0.0.1:7104", learner=True)
        await c.member_promote("n4")
        await c.move_leader("n4")
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kv.client.members import (HINTS, MEMBER_NAME_KEY, cluster_call, member_dict, member_stubs, move_leader_request,
                               new_leader_of)
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.member_ids import member_number


class Members:
    """Mixed into kv.aio.Client: what these calls use of it."""

    _call: Callable[..., Awaitable[Any]]

    async def member_list(self) -> list[dict[str, Any]]:
        """kv.Client.member_list."""
        response = await self._call(lambda stub: cluster_call(stub, "MemberList"), pb.MemberListRequest())
        return [member_dict(m) for m in response.members]

    async def member_add(self, name: str, peer_address: str, learner: bool = False) -> dict[str, Any]:
        """kv.Client.member_add."""
        request = pb.MemberAddRequest(peerURLs=[peer_address], isLearner=learner)
        response = await self._call(lambda stub: cluster_call(stub, "MemberAdd", ((MEMBER_NAME_KEY, name),)), request)
        return member_dict(response.member)

    async def member_remove(self, name: str) -> list[dict[str, Any]]:
        """kv.Client.member_remove."""
        response = await self._call(lambda stub: cluster_call(stub, "MemberRemove"),
                                    pb.MemberRemoveRequest(ID=member_number(name)))
        return [member_dict(m) for m in response.members]

    async def member_promote(self, name: str) -> list[dict[str, Any]]:
        """kv.Client.member_promote."""
        response = await self._call(lambda stub: cluster_call(stub, "MemberPromote"),
                                    pb.MemberPromoteRequest(ID=member_number(name)))
        return [member_dict(m) for m in response.members]

    async def member_update(self, name: str, peer_address: str) -> list[dict[str, Any]]:
        """kv.Client.member_update."""
        response = await self._call(lambda stub: cluster_call(stub, "MemberUpdate"),
                                    pb.MemberUpdateRequest(ID=member_number(name), peerURLs=[peer_address]))
        return [member_dict(m) for m in response.members]

    async def move_leader(self, to: str | None = None) -> str:
        """kv.Client.move_leader."""
        _, trailing = await self._call(_move_leader, move_leader_request(to))
        return new_leader_of(trailing)


def _move_leader(stub: Any) -> Callable[..., Awaitable[tuple[Any, dict[str, Any]]]]:
    """Maintenance.MoveLeader on an asyncio channel: (response, trailing metadata as a dict)."""
    call = member_stubs(stub)[1].MoveLeader

    async def send(request: Any, timeout: float, metadata: Any = None) -> tuple[Any, dict[str, Any]]:
        rpc = call(request, timeout=timeout, metadata=(*(metadata or ()), HINTS))
        response = await rpc
        return response, dict(await rpc.trailing_metadata() or ())
    return send
