"""etcd's stubs as raftkv's clients use them: every call asks a follower for a "not leader" answer
naming the leader (kv.errors.LEADER_HINTS_KEY) instead of being forwarded, so a client that makes
only etcd-API calls (txn, get at a revision, leases) learns the leader as its native calls do and
pays no extra hop after the first. `client_stub` puts them beside raftkv's own KV stub."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kv.errors import LEADER_HINTS_KEY
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2_grpc

_HINTS = (LEADER_HINTS_KEY, "1")


class LeaderHinted:
    """Wraps a generated stub (sync or grpc.aio): its methods take the same arguments."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)

        def call(*request: Any, metadata: Any = None, **kwargs: Any) -> Any:  # a stream call of grpc.aio takes none
            return method(*request, metadata=(*(metadata or ()), _HINTS), **kwargs)
        return call


def client_stub(channel: Any) -> kv_pb2_grpc.KVStub:
    """The stub a client's calls take, on `channel` (sync or grpc.aio): raftkv's KV service, with
    etcd's services on the same channel beside it, where kv.client.revisions', lease's and
    members' calls find them."""
    stub = kv_pb2_grpc.KVStub(channel)
    stub.etcd = LeaderHinted(etcd_rpc_pb2_grpc.KVStub(channel))  # type: ignore[attr-defined]
    stub.etcd_lease = LeaderHinted(etcd_rpc_pb2_grpc.LeaseStub(channel))  # type: ignore[attr-defined]
    stub.etcd_members = (etcd_rpc_pb2_grpc.ClusterStub(channel),  # type: ignore[attr-defined]
                         etcd_rpc_pb2_grpc.MaintenanceStub(channel))
    return stub
