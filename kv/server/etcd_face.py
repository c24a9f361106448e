"""What every etcd service on a node shares (kv/server/etcd_services.py, etcd_watch.py,
etcd_lease.py): the layer of operations under it (KVHandler, whose checks, gate and state it
exposes), the response header, etcd's errors, and forwarding to the leader.

Any member answers every request, as etcd does. A follower sends a write, and a linearizable
read, on to the leader over the leader's client port, with the caller's token, and returns the
leader's answer: a client that holds one endpoint (etcdctl picks any) never sees "not leader".
etcd forwards inside Raft and serves linearizable reads on the follower by ReadIndex; raftkv
forwards the gRPC call (docs/etcd-compatibility.md). A forwarded call that meets a member that is
no longer the leader is not sent on again: it fails as etcd's "leader changed", which etcd
clients retry.

Member and cluster ids: raftkv names members by strings ("n1"); etcd by uint64. The uint64 is
the first 8 bytes of the sha256 of the name, the same on every member and across restarts."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from kv import errors
from kv.server.auth_gate import TOKEN_METADATA_KEY, token_of
from kv.server.etcd_checks import EtcdError
from kv.server.kv_handler import KVHandler
from kv.server.server_group import MAX_SEND_BYTES
from kv.server.node_calls import not_leader
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.member_ids import member_number
from raftkv_proto import etcd_rpc_pb2_grpc

T = TypeVar("T")
log = logging.getLogger(__name__)

# Metadata on a call a follower forwards: the leader that finds it is no longer leader says so
# instead of forwarding again.
FORWARDED_METADATA_KEY = "raftkv-forwarded"

NO_LEADER = EtcdError(grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
LEADER_CHANGED = EtcdError(grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed")
NO_SPACE = EtcdError(grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")
TIMED_OUT = EtcdError(grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
TOO_MANY_REQUESTS = EtcdError(grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests")


def etcd_error(e: BaseException) -> BaseException:
    """The etcd error a raftkv error stands for (etcd's codes and messages), else `e`."""
    if isinstance(e, EtcdError):
        return e
    if isinstance(e, errors.NotLeaderError):
        return NO_LEADER if e.leader_id is None else LEADER_CHANGED
    if isinstance(e, errors.TimeoutError):
        return TIMED_OUT
    if isinstance(e, errors.DiskFullError):
        return NO_SPACE
    if isinstance(e, errors.QueueFullError):
        return TOO_MANY_REQUESTS
    if isinstance(e, errors.RaftKVError):
        return EtcdError(e.code, str(e))
    return e


class EtcdFace:
    """One node's etcd face: the services call `serve` with their work."""

    def __init__(self, handler: KVHandler, channel_credentials: grpc.ChannelCredentials | None) -> None:
        self.handler = handler  # the layer of operations: the work of every request
        node = self.node = handler.node
        self.fsm = handler.fsm
        self.checks = handler.checks  # the request checks every face shares
        self.gate = handler.gate  # who calls and what they may do
        self.auth = handler.auth
        self.cluster_number = member_number(node.cluster_id)
        self.member_number = member_number(node.id)
        self._credentials = channel_credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        await asyncio.gather(*(channel.close() for channel in channels.values()), return_exceptions=True)

    # ---- headers and errors --------------------------------------------------------------------

    def header(self, header: pb.ResponseHeader, revision: int | None = None) -> None:
        """Fill a response header as etcd's does; `revision` None: the store's now."""
        self.member_header(header)
        header.revision = self.fsm.revision if revision is None else revision

    def member_header(self, header: pb.ResponseHeader) -> None:
        """The member's part of a header (etcd's Cluster service sends no revision): who answered,
        in which cluster and term. A forwarded answer gets it too, as etcd's member that received a
        call answers it."""
        header.cluster_id = self.cluster_number
        header.member_id = self.member_number
        header.raft_term = self.node.core.term

    async def serve(self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[T]]) -> T:
        """Run `work`; any error ends the call with etcd's code and message (a raftkv client's
        "not leader" with kv.errors' metadata: forward_metadata)."""
        try:
            return await work()
        except _Redirect as e:
            await errors.abort(context, e.error)
            raise  # unreachable: abort raises
        except (errors.RaftKVError, EtcdError) as e:
            error = etcd_error(e)
            assert isinstance(error, EtcdError)
            await context.abort(error.code, str(error))
            raise  # unreachable: abort raises

    @staticmethod
    def when_sent(context: grpc.aio.ServicerContext) -> Callable[[Callable[[], None]], None]:
        """How KVHandler learns that this call has ended (its reply sent, or the call gone): a
        large reply's bytes are counted against the member's budget until then."""
        return lambda release: context.add_done_callback(lambda _: release())

    # ---- leadership and forwarding -----------------------------------------------------------

    def leads(self) -> bool:
        return self.node.leader == self.node.id

    async def forward(self, context: grpc.aio.ServicerContext, service: str, method: str, request: Any,
                      carry: tuple[str, ...] = ()) -> Any:
        """`request` sent on to the leader's `service`.`method`, with the caller's token and the
        caller's metadata keys named in `carry`; its answer, or its refusal as this call's."""
        metadata = self.forward_metadata(context)
        sent = dict(context.invocation_metadata() or ())
        metadata.extend((key, sent[key]) for key in carry if key in sent)
        stub = getattr(etcd_rpc_pb2_grpc, f"{service}Stub")(self.leader_channel())
        try:
            response = await getattr(stub, method)(request, metadata=metadata, timeout=context.time_remaining())
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAVAILABLE and not (e.details() or "").startswith("etcdserver:"):
                raise LEADER_CHANGED from None  # the leader went away under the call
            raise EtcdError(code, e.details() or code.name) from None
        if response.HasField("header"):
            self.member_header(response.header)
        return response

    def forward_metadata(self, context: grpc.aio.ServicerContext) -> list[tuple[str, str]]:
        """What a call forwarded to the leader carries: the mark that it was forwarded (a call
        forwarded once is never forwarded again) and the caller's token."""
        sent = dict(context.invocation_metadata() or ())
        if FORWARDED_METADATA_KEY in sent:
            raise LEADER_CHANGED
        if errors.LEADER_HINTS_KEY in sent:  # a raftkv client: it goes to the leader itself
            leader = self.node.leader
            raise _Redirect(not_leader(self.node, leader))
        metadata: list[tuple[str, str]] = [(FORWARDED_METADATA_KEY, self.node.id)]
        token = token_of(context)
        if token is not None:
            metadata.append((TOKEN_METADATA_KEY, token))
        elif self.auth.enabled:
            # The caller proved who it is by its certificate, which cannot travel: it must call the
            # leader itself.
            raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                            f"etcdserver: not leader (a client known by its certificate alone calls the "
                            f"leader itself, {self.node.leader})")
        return metadata

    def leader_channel(self) -> grpc.aio.Channel:
        leader = self.node.leader
        address = self.node.transport.client_address(leader) if leader is not None else None
        if address is None:
            raise NO_LEADER
        return self._channel(address)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            # The leader's answer may be as large as any member sends (a large Range forwarded).
            options = [("grpc.max_receive_message_length", MAX_SEND_BYTES)]
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            self._channels[address] = channel
        return channel


class _Redirect(Exception):
    """A call a raftkv client made of a follower: answered as a native call's NOT_LEADER."""

    def __init__(self, error: errors.NotLeaderError) -> None:
        super().__init__(str(error))
        self.error = error
