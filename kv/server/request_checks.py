"""The request checks every face shares: raftkv's own limits on what a write may carry, made before
anything is proposed, for the native API, etcd's API and the embedded node alike.

The limits are the node's (`Limits`: --max-value-bytes, the key limit) and the store's (32 KiB
keys, statemachine/commands.py MAX_KEY_BYTES), and a write's keys and values together stay under
`CommandLimits.max_total_bytes`. A refusal is kv.errors' InvalidArgumentError with a message that
names the limit; each face renders it in its own codes (etcd's: INVALID_ARGUMENT with the same
message). What etcd's own gRPC layer checks first, with etcd's messages, is
kv/server/etcd_checks.py.

The same rules that do not depend on configuration are checked again when a committed entry is
applied (statemachine/apply_batch.py), so a request that got past a face (a member of an older
version, a bug in a face) is still refused alike on every replica rather than stopping one."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from kv import errors
from raft.node.config import Limits
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import kv_pb2
from statemachine.commands import CommandLimits, validate_header, validate_key, validate_ops, validate_value
from statemachine.errors import InvalidCommandError


class RequestChecks:
    """One node's checks, from its limits. Each raises errors.InvalidArgumentError."""

    def __init__(self, limits: Limits) -> None:
        self.limits = CommandLimits(max_key_bytes=limits.max_key_bytes, max_value_bytes=limits.max_value_bytes)

    def key(self, key: bytes) -> None:
        """A key to read or delete: non-empty and within the key limit."""
        try:
            validate_key(key, self.limits.max_key_bytes)
        except InvalidCommandError as exc:
            raise errors.InvalidArgumentError(str(exc)) from None

    def put(self, key: bytes, value: bytes) -> None:
        try:
            validate_key(key, self.limits.max_key_bytes)
            validate_value(value, self.limits.max_value_bytes)
        except InvalidCommandError as exc:
            raise errors.InvalidArgumentError(str(exc)) from None

    def ops(self, ops: Sequence[kv_pb2.Op]) -> None:
        """A native batch: its op count, each op, and its keys and values in all."""
        try:
            validate_ops(ops, self.limits)
        except InvalidCommandError as exc:
            raise errors.InvalidArgumentError(str(exc)) from None

    def header(self, header: kv_pb2.WriteHeader) -> None:
        try:
            validate_header(header)
        except InvalidCommandError as exc:
            raise errors.InvalidArgumentError(str(exc)) from None

    def etcd_txn(self, request: pb.TxnRequest) -> None:
        """Every op of every branch, nested transactions included: the keys of ranges and deletes
        and the keys and values of puts within their limits, and the puts' keys and values in all
        within a write's total (etcd's own checks, etcd_checks.check_txn, come first)."""
        total = 0
        for op in _ops(request):
            kind = op.WhichOneof("request")
            if kind == "request_put":
                put = op.request_put
                self.put(put.key, put.value)
                total += len(put.key) + len(put.value)
            elif kind == "request_range":
                self.key(op.request_range.key)
            elif kind == "request_delete_range":
                self.key(op.request_delete_range.key)
        if total > self.limits.max_total_bytes:
            raise errors.InvalidArgumentError(
                f"the transaction's puts total {total} bytes of keys and values, over the maximum of "
                f"{self.limits.max_total_bytes} bytes per write; split it into smaller transactions")


def _ops(request: pb.TxnRequest) -> Iterator[pb.RequestOp]:
    """The ops of both branches of `request` and of its nested transactions."""
    for op in (*request.success, *request.failure):
        if op.WhichOneof("request") == "request_txn":
            yield from _ops(op.request_txn)
        else:
            yield op
