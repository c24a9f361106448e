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

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from kv import errors
from kv.server.auth_gate import TOKEN_METADATA_KEY, common_name, token_of
from kv.server.etcd_checks import EtcdError
from kv.server.kv_handler import KVHandler
from kv.server.member_channels import MemberChannels
from kv.server.node_calls import not_leader
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.member_ids import member_number
from raftkv_proto import etcd_rpc_pb2_grpc
from statemachine.auth_state import (
    AUTH_FAILED,
    INVALID_AUTH_MGMT,
    INVALID_TOKEN,
    PERMISSION_DENIED,
    ROLE_EMPTY,
    ROLE_EXISTS,
    ROLE_NOT_FOUND,
    ROLE_NOT_GRANTED,
    PERMISSION_NOT_GRANTED,
    ROOT_ROLE_MISSING,
    ROOT_USER_MISSING,
    USER_EMPTY,
    USER_EXISTS,
    USER_NOT_FOUND,
)

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

_C = grpc.StatusCode
# etcd's codes for the auth refusals (rpctypes/error.go), by their message: raftkv's native face
# gives some of them other codes (a failed login is UNAUTHENTICATED there, which its clients
# answer by logging in again), and the one message is what both faces share.
AUTH_CODES: dict[str, grpc.StatusCode] = {
    ROOT_USER_MISSING: _C.FAILED_PRECONDITION, ROOT_ROLE_MISSING: _C.FAILED_PRECONDITION,
    USER_EXISTS: _C.FAILED_PRECONDITION, USER_EMPTY: _C.INVALID_ARGUMENT, USER_NOT_FOUND: _C.FAILED_PRECONDITION,
    ROLE_EXISTS: _C.FAILED_PRECONDITION, ROLE_NOT_FOUND: _C.FAILED_PRECONDITION, ROLE_EMPTY: _C.INVALID_ARGUMENT,
    AUTH_FAILED: _C.INVALID_ARGUMENT, PERMISSION_DENIED: _C.PERMISSION_DENIED,
    ROLE_NOT_GRANTED: _C.FAILED_PRECONDITION, PERMISSION_NOT_GRANTED: _C.FAILED_PRECONDITION,
    INVALID_TOKEN: _C.UNAUTHENTICATED, INVALID_AUTH_MGMT: _C.INVALID_ARGUMENT,
}


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
        message = str(e)
        return EtcdError(AUTH_CODES.get(message, e.code), message)
    return e


def go_error_text(error: EtcdError) -> str:
    """How etcd's Go code prints a gRPC error (a watch's cancel reason): "rpc error: code =
    PermissionDenied desc = etcdserver: permission denied"."""
    name = "Canceled" if error.code == grpc.StatusCode.CANCELLED else \
        "".join(part.capitalize() for part in error.code.name.split("_"))
    return f"rpc error: code = {name} desc = {error}"


class EtcdFace:
    """One node's etcd face: the services call `serve` with their work."""

    def __init__(self, handler: KVHandler, channels: MemberChannels) -> None:
        self.handler = handler  # the layer of operations: the work of every request
        node = self.node = handler.node
        self.fsm = handler.fsm
        self.checks = handler.checks  # the request checks every face shares
        self.gate = handler.gate  # who calls and what they may do
        self.auth = handler.auth
        self.cluster_number = member_number(node.cluster_id)
        self.member_number = member_number(node.id)
        self._channels = channels  # to the other members' client ports (the leader's, to forward)

    async def close(self) -> None:
        await self._channels.close()

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
                      carry: tuple[str, ...] = (), anyone: bool = False) -> Any:
        """`request` sent on to the leader's `service`.`method`, with the caller's token and the
        caller's metadata keys named in `carry`; its answer, or its refusal as this call's.
        `anyone`: the call needs no user (a login, a lease grant), so one that names none goes too."""
        metadata = self.forward_metadata(context, anyone)
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

    def forward_metadata(self, context: grpc.aio.ServicerContext, anyone: bool = False) -> list[tuple[str, str]]:
        """What a call forwarded to the leader carries: the mark that it was forwarded (a call
        forwarded once is never forwarded again) and the caller's token. While auth is on, a call
        without a token that needs a user is answered here, as the leader would answer it: etcd's
        "user name is empty" (it never goes on without a token: the leader would take it for the
        call of this member, whose certificate it presents). `anyone`: the call needs no user."""
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
        elif self.auth.enabled and not anyone:
            if not common_name(context):
                raise errors.UnauthenticatedError(USER_EMPTY)
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
        return self._channels.get(address)


class _Redirect(Exception):
    """A call a raftkv client made of a follower: answered as a native call's NOT_LEADER."""

    def __init__(self, error: errors.NotLeaderError) -> None:
        super().__init__(str(error))
        self.error = error
