"""Typed errors of the client API, and how they travel as gRPC statuses.

The server aborts with a gRPC status code, a message a person can act on, and trailing metadata
"raftkv-error" = the error's `kind`; NOT_LEADER adds "raftkv-leader-id" and "raftkv-leader-address".
The client turns the status back into the same exception class with `from_rpc_error`."""
from __future__ import annotations

import grpc

from raftkv_proto import kv_pb2
from raftkv_proto.request_limits import DEFAULT_MAX_REQUEST_BYTES, FLAG, OVERSIZED_MARK

ERROR_KEY = "raftkv-error"
LEADER_ID_KEY = "raftkv-leader-id"
LEADER_ADDRESS_KEY = "raftkv-leader-address"
# Sent by raftkv's clients on their etcd-API calls: a follower answers NOT_LEADER with the leader's
# address (as native calls get) rather than forwarding the call, so the client goes to the leader.
LEADER_HINTS_KEY = "raftkv-leader-hints"


class RaftKVError(Exception):
    kind = "INTERNAL"
    code = grpc.StatusCode.INTERNAL
    retryable = False

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((ERROR_KEY, self.kind),)


class NotLeaderError(RaftKVError):
    """This node is not the leader; `leader_address` says where the leader is, when known."""

    kind = "NOT_LEADER"
    code = grpc.StatusCode.FAILED_PRECONDITION
    retryable = True

    def __init__(self, leader_id: str | None = None, leader_address: str | None = None, message: str | None = None):
        self.leader_id = leader_id or None
        self.leader_address = leader_address or None
        where = f"{self.leader_id} at {self.leader_address}" if self.leader_address else "not known yet"
        super().__init__(message or f"not the leader; the leader is {where}")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return super().metadata() + ((LEADER_ID_KEY, self.leader_id or ""), (LEADER_ADDRESS_KEY, self.leader_address or ""))


class UnavailableError(RaftKVError):
    """No node could serve the request (unreachable, no leader elected, quorum lost)."""

    kind = "UNAVAILABLE"
    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class TimeoutError(RaftKVError):  # noqa: A001 - the client API's name for it
    """The request did not complete within its timeout. A write may still be applied later,
    at most once."""

    kind = "TIMEOUT"
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    retryable = True


class InvalidArgumentError(RaftKVError):
    """The request itself is wrong (empty or oversized key, oversized value, malformed request)."""

    kind = "INVALID_ARGUMENT"
    code = grpc.StatusCode.INVALID_ARGUMENT


class WrongClusterError(RaftKVError):
    """A peer or request belongs to another cluster, or names a member this cluster does not have."""

    kind = "WRONG_CLUSTER"
    code = grpc.StatusCode.FAILED_PRECONDITION


class QueueFullError(RaftKVError):
    """Too many requests are waiting on this node; back off and retry."""

    kind = "QUEUE_FULL"
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True


class ReplyTooLargeError(RaftKVError):
    """The answer would be larger than the node sends in one message (a Range over too many or
    too large values): refused before it was built. Ask for less: a limit, keys_only, a page."""

    kind = "REPLY_TOO_LARGE"
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DiskFullError(RaftKVError):
    """The node's disk (or LMDB map) is full: writes are refused, reads still work."""

    kind = "DISK_FULL"
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnknownSessionError(RaftKVError):
    """The write's client id names no client session the cluster keeps: never issued by
    RegisterClient, expired (see the README, Limits and errors), or with a wrong secret. Nothing
    of this attempt was applied. kv.Client then registers a new session and sends the write again
    if no earlier attempt of it can have been applied; otherwise it raises this error, and whether
    an earlier attempt was applied is unknown."""

    kind = "UNKNOWN_SESSION"
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDeniedError(RaftKVError):
    """Auth is on and the request's user may not do this (read or write these keys, run an
    admin command, use another user's client session): "etcdserver: permission denied"."""

    kind = "PERMISSION_DENIED"
    code = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(RaftKVError):
    """Auth is on and the request names no valid user: no token, an expired, forged or revoked
    one ("etcdserver: invalid auth token"), or a wrong name or password at login. kv.Client
    logs in again once with its password when its token is refused."""

    kind = "UNAUTHENTICATED"
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPreconditionError(RaftKVError):
    """The auth state does not allow the change (user name already exists, role name not
    found, root user does not exist, ...): etcd's message says which."""

    kind = "FAILED_PRECONDITION"
    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFoundError(RaftKVError):
    """What the request names does not exist: etcd's "requested lease not found"."""

    kind = "NOT_FOUND"
    code = grpc.StatusCode.NOT_FOUND


class RevisionError(RaftKVError):
    """A read or compaction at a revision the store cannot serve: below the compacted revision
    ("required revision has been compacted") or above the store's ("is a future revision"), with
    etcd's message."""

    kind = "OUT_OF_RANGE"
    code = grpc.StatusCode.OUT_OF_RANGE


class CorruptClusterError(RaftKVError):
    """A CORRUPT alarm is raised: every member refuses writes (etcd's "etcdserver: corrupt
    cluster") until an operator has replaced the damaged member's data and disarmed it; reads go on."""

    kind = "CORRUPT"
    code = grpc.StatusCode.DATA_LOSS


_BY_KIND: dict[str, type[RaftKVError]] = {
    cls.kind: cls
    for cls in (RaftKVError, NotLeaderError, UnavailableError, TimeoutError, InvalidArgumentError,
                WrongClusterError, QueueFullError, ReplyTooLargeError, DiskFullError, UnknownSessionError,
                PermissionDeniedError, UnauthenticatedError, FailedPreconditionError, RevisionError,
                NotFoundError, CorruptClusterError)
}


def _from_kind(kind: str | None, details: str, leader_id: str | None, leader_address: str | None) -> RaftKVError | None:
    """The error of a known kind, with its message; None for an unknown kind."""
    if kind == NotLeaderError.kind:
        return NotLeaderError(leader_id, leader_address, details or None)
    if kind in _BY_KIND:
        return _BY_KIND[kind](details)
    return None


def of_kind(kind: str, message: str) -> RaftKVError:
    """The error of `kind` (a refusal the state machine recorded: PERMISSION_DENIED, ...)."""
    known = _from_kind(kind, message, None, None)
    return known if known is not None else RaftKVError(f"{kind}: {message}")


def oversized_message(details: str) -> str:
    """What a client is told for a request gRPC refused as larger than the node's limit; `details`
    is gRPC's own account ("...Received message larger than max (N vs. LIMIT)")."""
    return (f"the request is larger than the node accepts ({details}); the limit is raftkv serve's "
            f"{FLAG} (default {DEFAULT_MAX_REQUEST_BYTES}): send less in one request (split a batch, "
            "a value over several keys) or raise the flag on every node")


def from_rpc_error(err: grpc.RpcError) -> RaftKVError:
    """The typed error a failed RPC stands for."""
    meta = dict(err.trailing_metadata() or ())
    details = err.details() or ""
    known = _from_kind(meta.get(ERROR_KEY), details, meta.get(LEADER_ID_KEY), meta.get(LEADER_ADDRESS_KEY))
    if known is not None:
        return known
    code = err.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TimeoutError(details or "deadline exceeded")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return UnavailableError(details or "node unavailable")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDeniedError(details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(details)
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return RevisionError(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(details)
    if code == grpc.StatusCode.DATA_LOSS:
        return CorruptClusterError(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        # The kinds that share this code (NOT_LEADER, UNKNOWN_SESSION, ...) always travel with
        # their kind; one without is a plain refusal (etcd's, on the etcd face).
        return FailedPreconditionError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if OVERSIZED_MARK in details.lower():
            # gRPC refused the message itself: no retry can make it fit.
            return InvalidArgumentError(oversized_message(details))
        return QueueFullError(details)
    return RaftKVError(f"{code.name}: {details}")


async def abort(context: grpc.aio.ServicerContext, error: RaftKVError) -> None:
    """Abort a server-side call with `error` (raises, as grpc's abort does)."""
    context.set_trailing_metadata(error.metadata())
    await context.abort(error.code, str(error))


def stream_error(error: RaftKVError) -> kv_pb2.StreamError:
    """`error` as a refusal on KV.Stream: what a unary call's status and metadata would say."""
    leader = (error.leader_id or "", error.leader_address or "") if isinstance(error, NotLeaderError) else ("", "")
    return kv_pb2.StreamError(kind=error.kind, message=str(error), leader_id=leader[0], leader_address=leader[1])


def from_stream_error(refusal: kv_pb2.StreamError) -> RaftKVError:
    """The typed error a refusal on KV.Stream stands for."""
    known = _from_kind(refusal.kind, refusal.message, refusal.leader_id, refusal.leader_address)
    return known if known is not None else RaftKVError(f"{refusal.kind}: {refusal.message}")
