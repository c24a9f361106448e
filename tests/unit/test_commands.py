"""Encoding, decoding and pre-proposal validation of the replicated write command."""
from __future__ import annotations

import pytest

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import kv_pb2
from statemachine.commands import (
    MAX_KEY_BYTES,
    CommandLimits,
    applies_in_its_size,
    decode_command,
    delete_op,
    encode_auth,
    encode_command,
    encode_compaction,
    encode_etcd_txn,
    encode_lease_grant,
    encode_lease_revoke,
    encode_registration,
    put_op,
    validate_header,
    validate_key,
    validate_ops,
    validate_value,
)
from statemachine.errors import InvalidCommandError


def test_round_trip_keeps_header_and_ops() -> None:
    payload = encode_command([put_op(b"k", b"v"), delete_op(b"gone")], client_id="c-1", seq=42)
    command = decode_command(payload)
    assert (command.header.client_id, command.header.seq) == ("c-1", 42)
    assert command.ops[0].put.key == b"k" and command.ops[0].put.value == b"v"
    assert command.ops[1].delete == b"gone"


def test_no_client_id_means_no_header() -> None:
    command = decode_command(encode_command([put_op(b"k", b"")]))
    assert not command.HasField("header")


def test_garbage_bytes_are_refused() -> None:
    with pytest.raises(InvalidCommandError, match="not a kv Command"):
        decode_command(b"\xff\xff\xff\xff")


def test_decoded_command_without_ops_is_refused() -> None:
    with pytest.raises(InvalidCommandError, match="no ops"):
        decode_command(b"")


def test_decoded_empty_op_is_refused() -> None:
    payload = kv_pb2.Command(ops=[kv_pb2.Op()]).SerializeToString()
    with pytest.raises(InvalidCommandError, match="op 0 is neither"):
        decode_command(payload)


def test_decoded_key_over_the_store_limit_is_refused() -> None:
    decode_command(encode_command([put_op(b"x" * MAX_KEY_BYTES, b"v")]))  # over LMDB's 511: taken
    with pytest.raises(InvalidCommandError, match=f"{MAX_KEY_BYTES + 1} bytes"):
        decode_command(encode_command([put_op(b"x" * (MAX_KEY_BYTES + 1), b"v")]))


def test_empty_key_message() -> None:
    with pytest.raises(InvalidCommandError, match="key is empty"):
        validate_key(b"")


def test_long_key_message_names_the_limit_and_length() -> None:
    assert MAX_KEY_BYTES == 32768
    validate_key(b"k" * MAX_KEY_BYTES)
    with pytest.raises(InvalidCommandError) as info:
        validate_key(b"k" * 40000)
    assert "40000 bytes" in str(info.value) and "the 32768-byte key limit" in str(info.value)


def test_configured_key_limit_cannot_exceed_the_stores() -> None:
    with pytest.raises(InvalidCommandError, match="the 32768-byte key limit"):
        validate_key(b"k" * 40000, max_key_bytes=50000)
    with pytest.raises(InvalidCommandError, match="the 10-byte key limit"):
        validate_key(b"k" * 11, max_key_bytes=10)


def test_value_message_names_both_sizes() -> None:
    validate_value(b"v" * 100, max_value_bytes=100)
    with pytest.raises(InvalidCommandError) as info:
        validate_value(b"v" * 101, max_value_bytes=100)
    assert "101 bytes" in str(info.value) and "100-byte maximum" in str(info.value)


def test_validate_ops_empty_batch() -> None:
    with pytest.raises(InvalidCommandError, match="no ops"):
        validate_ops([])


def test_validate_ops_too_many() -> None:
    ops = [delete_op(b"k%d" % i) for i in range(4)]
    validate_ops(ops[:3], CommandLimits(max_ops=3))
    with pytest.raises(InvalidCommandError, match="4 ops, over the maximum of 3"):
        validate_ops(ops, CommandLimits(max_ops=3))


def test_validate_ops_total_size() -> None:
    ops = [put_op(b"a", b"x" * 50), put_op(b"b", b"x" * 50)]
    validate_ops(ops, CommandLimits(max_total_bytes=102))
    with pytest.raises(InvalidCommandError, match="total 102 bytes, over the maximum of 101"):
        validate_ops(ops, CommandLimits(max_total_bytes=101))


def test_validate_ops_names_the_bad_op() -> None:
    with pytest.raises(InvalidCommandError, match="op 1: value is 11 bytes"):
        validate_ops([put_op(b"a", b""), put_op(b"b", b"x" * 11)], CommandLimits(max_value_bytes=10))
    with pytest.raises(InvalidCommandError, match="op 0: key is empty"):
        validate_ops([delete_op(b"")])


def test_client_id_size_is_limited() -> None:
    validate_header(kv_pb2.WriteHeader(client_id="c" * 256, seq=1))
    with pytest.raises(InvalidCommandError, match="client id is 257 bytes"):
        validate_header(kv_pb2.WriteHeader(client_id="c" * 257, seq=1))


def test_an_auth_change_or_a_registration_carries_nothing_else() -> None:
    change = kv_pb2.AuthCommand(action=kv_pb2.ROLE_ADD, role="r")
    assert decode_command(encode_auth(change)).auth == change
    assert decode_command(encode_command([put_op(b"k", b"v")], user="alice")).user == "alice"
    assert decode_command(encode_registration(b"s" * 16, "alice")).registration.user == "alice"
    for mixed in (kv_pb2.Command(auth=change, ops=[put_op(b"k", b"v")]),
                  kv_pb2.Command(auth=change, check_state=True),
                  kv_pb2.Command(registration=kv_pb2.Registration(secret=b"s" * 16), user="alice")):
        with pytest.raises(InvalidCommandError):
            decode_command(mixed.SerializeToString())


def _txn(*ops: pb.RequestOp, nested: bool = False) -> bytes:
    txn = pb.TxnRequest(success=ops)
    if nested:
        txn = pb.TxnRequest(failure=[pb.RequestOp(request_txn=txn)])
    return encode_etcd_txn(txn.SerializeToString())


ONE_PUT = pb.RequestOp(request_put=pb.PutRequest(key=b"k", value=b"v"))
ONE_KEY_DELETE = pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"k"))
RANGE_DELETE = pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"a", range_end=b"b"))
RANGE_READ = pb.RequestOp(request_range=pb.RangeRequest(key=b"a", range_end=b"\0"))


@pytest.mark.parametrize(("payload", "bounded"), [
    (encode_command([put_op(b"k", b"v"), delete_op(b"gone")]), True),
    (encode_command([kv_pb2.Op(delete_prefix=b"staged/")]), False),
    (encode_command([kv_pb2.Op(move_prefix=kv_pb2.MovePrefix(source=b"s/", target=b"t/"))]), False),
    (_txn(ONE_PUT, ONE_KEY_DELETE), True),
    (_txn(ONE_PUT, RANGE_DELETE), False),
    (_txn(RANGE_READ), False),
    (_txn(RANGE_DELETE, nested=True), False),
    (encode_compaction(7), False),
    (encode_lease_revoke(9), False),
    (encode_lease_grant(9, 60), True),
    (b"\xff not a command", True),
], ids=["put-delete", "delete-prefix", "move-prefix", "etcd-put", "etcd-delete-range", "etcd-range-read",
        "nested-txn", "compaction", "lease-revoke", "lease-grant", "garbage"])
def test_only_commands_bounded_by_their_size_apply_in_proportion(payload: bytes, bounded: bool) -> None:
    """What the driver may apply on its loop: never a command that acts on whatever a range holds."""
    assert applies_in_its_size(payload) is bounded
