"""The replicated write command (proto kv_pb2.Command) and the checks made before proposing one.

Every client write (Put, Delete, Batch) becomes one `Command`: an optional WriteHeader
(client_id, seq) for exactly-once retries and a list of ops, each a put or a delete. A
RegisterClient becomes one with a `registration` (the secret the leader chose) and nothing else;
the client id it issues is `session_id(entry index, secret)`.

Two kinds of checks live here:
- `validate_*` with configurable limits (value size, op count, total size): the client service runs
  them BEFORE proposing, so a bad request is refused with a message and never reaches the log.
- `decode_command` runs on committed entries on every replica. It only enforces rules that do not
  depend on configuration (well-formed protobuf, at least one op, each op set, keys the store takes),
  because replicas with different limits must still apply the same log to the same state.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from raftkv_proto import etcd_rpc_pb2, kv_pb2
from statemachine.errors import InvalidCommandError

# The longest key the store takes (statemachine/long_keys.py: keys over LMDB's 511 bytes are
# stored by a digest; docs/decisions/0072-long-keys.md for why this bound).
MAX_KEY_BYTES = 32 << 10
# A client id is "<registration index>.<secret in hex>"; far shorter than this.
MAX_CLIENT_ID_BYTES = 256
# The secret the leader chooses for each client session: 128 random bits.
SESSION_SECRET_BYTES = 16


@dataclass(frozen=True, slots=True)
class CommandLimits:
    """What the client service accepts in one write. The defaults keep a command well under gRPC's
    default 4 MiB message limit."""

    max_key_bytes: int = MAX_KEY_BYTES
    max_value_bytes: int = 1 << 20
    max_ops: int = 1000
    max_total_bytes: int = 3 << 20


def put_op(key: bytes, value: bytes) -> kv_pb2.Op:
    return kv_pb2.Op(put=kv_pb2.KeyValue(key=key, value=value))


def delete_op(key: bytes) -> kv_pb2.Op:
    return kv_pb2.Op(delete=key)


def encode_command(ops: Iterable[kv_pb2.Op], client_id: str = "", seq: int = 0, user: str | None = None) -> bytes:
    """The entry payload for `ops`. An empty client_id means "no exactly-once tracking"; `user`
    (auth on) is who makes the write, checked again at apply."""
    return _signed(kv_pb2.Command(ops=ops), client_id, seq, user)


def _signed(command: kv_pb2.Command, client_id: str, seq: int, user: str | None) -> bytes:
    if user:
        command.user = user
    if client_id:
        command.header.client_id = client_id
        command.header.seq = seq
    return command.SerializeToString()


def encode_etcd_txn(request: bytes, user: str | None = None, client_id: str = "", seq: int = 0) -> bytes:
    """The entry payload of an etcd write: `request` a serialized etcdserverpb.TxnRequest."""
    return _signed(kv_pb2.Command(etcd_txn=kv_pb2.EtcdTxn(request=request)), client_id, seq, user)


def encode_compaction(revision: int, user: str | None = None) -> bytes:
    """The entry payload of etcd's Compact at `revision`."""
    return kv_pb2.Command(compact=revision, user=user or "").SerializeToString()


def encode_lease_grant(lease: int, ttl: int) -> bytes:
    return kv_pb2.Command(lease=kv_pb2.LeaseCommand(grant_id=lease, ttl=ttl)).SerializeToString()


def encode_lease_checkpoints(remaining: dict[int, int]) -> bytes:
    """The entry payload of the leader's checkpoint of leases' remaining TTLs (0 clears one)."""
    checkpoints = [kv_pb2.LeaseCheckpoint(id=lease, remaining_ttl=ttl) for lease, ttl in remaining.items()]
    return kv_pb2.Command(lease=kv_pb2.LeaseCommand(checkpoints=checkpoints)).SerializeToString()


def encode_lease_revoke(lease: int, user: str | None = None) -> bytes:
    return kv_pb2.Command(lease=kv_pb2.LeaseCommand(revoke_id=lease), user=user or "").SerializeToString()


def check_state_command() -> bytes:
    """The payload of a state check marker (kv/server/state_check.py)."""
    return kv_pb2.Command(check_state=True).SerializeToString()


def encode_registration(secret: bytes, user: str | None = None) -> bytes:
    """The entry payload that registers a client session with `secret`, for `user` (auth on)."""
    return kv_pb2.Command(registration=kv_pb2.Registration(secret=secret, user=user or "")).SerializeToString()


def encode_auth(change: kv_pb2.AuthCommand) -> bytes:
    """The entry payload of an auth change (statemachine/auth_state.py)."""
    return kv_pb2.Command(auth=change).SerializeToString()


def session_id(index: int, secret: bytes) -> str:
    """The client id a session registered at log `index` with `secret` is used by."""
    return f"{index}.{secret.hex()}"


def parse_session_id(client_id: str) -> tuple[int, bytes] | None:
    """(registration index, secret) of a client id `session_id` made; None for any other string."""
    index, dot, secret = client_id.partition(".")
    if not dot or not index.isdigit() or not index.isascii() or len(secret) != 2 * SESSION_SECRET_BYTES:
        return None
    try:
        number, raw = int(index), bytes.fromhex(secret)
    except ValueError:
        return None
    return (number, raw) if number < 1 << 64 else None


def decode_command(payload: bytes) -> kv_pb2.Command:
    """Parse a committed entry's payload. Raises InvalidCommandError for bytes that are not a
    Command or a Command no replica could apply (no ops, an empty op, a key over the store's limit)."""
    command = kv_pb2.Command()
    try:
        command.ParseFromString(payload)
    except DecodeError as exc:
        raise InvalidCommandError(f"payload of {len(payload)} bytes is not a kv Command: {exc}") from exc
    validate_header(command.header)
    if command.check_state:
        if command.ops or command.HasField("header") or command.HasField("registration") or command.HasField("auth") \
                or command.HasField("alarm") or command.HasField("etcd_txn") or command.compact:
            raise InvalidCommandError("a state check marker carries nothing else")
        return command
    if command.HasField("lease"):
        lease = command.lease
        kinds = (lease.grant_id != 0) + (lease.revoke_id != 0) + bool(lease.checkpoints)
        if command.ops or command.HasField("header") or command.HasField("etcd_txn") or command.compact \
                or kinds != 1 or (lease.grant_id and lease.ttl <= 0):
            raise InvalidCommandError("a lease command grants one lease with a TTL, revokes one, or checkpoints "
                                      "remaining TTLs, and carries nothing else")
        return command
    if command.HasField("etcd_txn") or command.compact:
        if command.ops or command.HasField("registration") or command.HasField("auth") or command.HasField("alarm") \
                or (command.HasField("etcd_txn") and command.compact):
            raise InvalidCommandError("an etcd request carries nothing else")
        if command.compact and command.HasField("header"):
            raise InvalidCommandError("a compaction carries no write header")
        return command
    if command.HasField("alarm"):
        if command.ops or command.HasField("header") or command.HasField("registration") or command.user \
                or command.HasField("auth"):
            raise InvalidCommandError("an alarm change carries nothing else")
        return command
    if command.HasField("auth"):
        if command.ops or command.HasField("header") or command.HasField("registration") or command.user:
            raise InvalidCommandError("an auth change carries nothing else")
        return command
    if command.HasField("registration"):
        if command.ops or command.HasField("header") or command.user:
            raise InvalidCommandError("a client registration carries no ops and no write header")
        if len(command.registration.secret) != SESSION_SECRET_BYTES:
            raise InvalidCommandError(
                f"a client registration's secret is {len(command.registration.secret)} bytes, not {SESSION_SECRET_BYTES}")
        return command
    if not command.ops:
        raise InvalidCommandError("command has no ops")
    for position, op in enumerate(command.ops):
        kind = op.WhichOneof("op")
        if kind is None:
            raise InvalidCommandError(f"op {position} is neither a put nor a delete")
        if kind in _PREFIX_OPS:
            validate_prefix_op(op)
        else:
            validate_key(op.put.key if kind == "put" else op.delete)
    return command


# Ops that act on every key under a prefix (atomic publish of staged rows, see kv/spark).
_PREFIX_OPS = ("delete_prefix", "move_prefix")


def applies_in_its_size(payload: bytes) -> bool:
    """Whether applying this committed command costs in proportion to its own size. Not one that
    acts on whatever a range holds: a prefix op, an etcd transaction with a ranged Range or
    DeleteRange, a compaction, a lease's revocation (its keys go with it). The driver applies a few
    small entries on its event loop (raft/node/ready_handler.py), where one range deletion of
    100,000 keys held the loop, heartbeats included, for 1.8 s. Bytes that do not parse are
    applied as a refusal, which is cheap."""
    command = kv_pb2.Command()
    try:
        command.ParseFromString(payload)
        if command.compact or command.lease.revoke_id:
            return False
        if command.HasField("etcd_txn"):
            return not _ranged(etcd_rpc_pb2.TxnRequest.FromString(command.etcd_txn.request))
    except DecodeError:
        return True
    return not any(op.WhichOneof("op") in _PREFIX_OPS for op in command.ops)


def _ranged(txn: etcd_rpc_pb2.TxnRequest) -> bool:
    for op in (*txn.success, *txn.failure):
        kind = op.WhichOneof("request")
        if kind == "request_txn":
            if _ranged(op.request_txn):
                return True
        elif kind in ("request_range", "request_delete_range") and getattr(op, kind).range_end:
            return True
    return False


def validate_prefix_op(op: kv_pb2.Op) -> None:
    """Rules for delete_prefix / move_prefix that make their apply deterministic and total: a
    non-empty source (an empty one would mean "every key"), prefixes within the key limit, and a target
    no longer than the source, so every renamed key still fits the key limit."""
    if op.WhichOneof("op") == "delete_prefix":
        _validate_prefix(op.delete_prefix, "delete_prefix")
        return
    source, target = op.move_prefix.source, op.move_prefix.target
    _validate_prefix(source, "move_prefix source")
    if len(target) > len(source):
        raise InvalidCommandError(
            f"move_prefix target ({len(target)} bytes) is longer than its source ({len(source)} bytes); "
            "renamed keys could exceed the key limit")


def _validate_prefix(prefix: bytes, what: str) -> None:
    if not prefix:
        raise InvalidCommandError(f"{what} is empty: it would match every key")
    if len(prefix) > MAX_KEY_BYTES:
        raise InvalidCommandError(f"{what} is {len(prefix)} bytes; keys are at most {MAX_KEY_BYTES} bytes")


def validate_key(key: bytes, max_key_bytes: int = MAX_KEY_BYTES) -> None:
    # A configured limit above the store's cannot be honoured: the apply refuses such keys.
    max_key_bytes = min(max_key_bytes, MAX_KEY_BYTES)
    if not key:
        raise InvalidCommandError("key is empty: every key needs at least one byte")
    if len(key) > max_key_bytes:
        raise InvalidCommandError(
            f"key is {len(key)} bytes, over the {max_key_bytes}-byte key limit (key starts {key[:32]!r}); "
            "use a shorter key, e.g. hash the long part")


def validate_header(header: kv_pb2.WriteHeader) -> None:
    size = len(header.client_id.encode())
    if size > MAX_CLIENT_ID_BYTES:
        raise InvalidCommandError(
            f"client id is {size} bytes, over the {MAX_CLIENT_ID_BYTES}-byte maximum; use a shorter id (a UUID is 36)")


def validate_value(value: bytes, max_value_bytes: int) -> None:
    if len(value) > max_value_bytes:
        raise InvalidCommandError(
            f"value is {len(value)} bytes, over the {max_value_bytes}-byte maximum value size; "
            "split it over several keys or raise the server's max value size")


def validate_ops(ops: Sequence[kv_pb2.Op], limits: CommandLimits = CommandLimits()) -> None:
    """Everything the client service checks before proposing a write of `ops`."""
    if not ops:
        raise InvalidCommandError("the batch has no ops: add at least one put or delete")
    if len(ops) > limits.max_ops:
        raise InvalidCommandError(
            f"the batch has {len(ops)} ops, over the maximum of {limits.max_ops}; split it into smaller batches")
    total = 0
    for position, op in enumerate(ops):
        total += _validate_op(position, op, limits)
    if total > limits.max_total_bytes:
        raise InvalidCommandError(
            f"the batch's keys and values total {total} bytes, over the maximum of "
            f"{limits.max_total_bytes} bytes per write; split it into smaller batches")


def _validate_op(position: int, op: kv_pb2.Op, limits: CommandLimits) -> int:
    """Check one op; return the bytes of key and value it carries."""
    kind = op.WhichOneof("op")
    try:
        if kind == "put":
            validate_key(op.put.key, limits.max_key_bytes)
            validate_value(op.put.value, limits.max_value_bytes)
            return len(op.put.key) + len(op.put.value)
        if kind == "delete":
            validate_key(op.delete, limits.max_key_bytes)
            return len(op.delete)
        if kind in _PREFIX_OPS:
            validate_prefix_op(op)
            return op.ByteSize()
    except InvalidCommandError as exc:
        raise InvalidCommandError(f"op {position}: {exc}") from None
    raise InvalidCommandError(f"op {position} is neither a put nor a delete")
