"""The request checks every face shares (kv/server/request_checks.py), on their own: what the
integration table (tests/integration/test_shared_checks.py) cannot reach under the default request
size, and the walk over every op of a transaction."""
from __future__ import annotations

import pytest

from kv import errors
from kv.server.request_checks import RequestChecks
from raft.node.config import Limits
from raftkv_proto import etcd_rpc_pb2 as pb

CHECKS = RequestChecks(Limits(max_value_bytes=1 << 20, max_request_bytes=8 << 20))


def put(key: bytes, value: bytes = b"v") -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))


def test_a_transactions_puts_in_all_are_held_to_a_writes_total() -> None:
    value = b"x" * (700 << 10)
    at_total = pb.TxnRequest(success=[put(b"a", value)] * 2, failure=[put(b"b", value)] * 2)
    CHECKS.etcd_txn(at_total)  # 2.8 MiB: within the 3 MiB of a write
    over = pb.TxnRequest(success=[put(b"a", value)] * 2, failure=[
        pb.RequestOp(request_txn=pb.TxnRequest(success=[put(b"b", value)] * 3))])
    with pytest.raises(errors.InvalidArgumentError, match="3145728 bytes per write"):
        CHECKS.etcd_txn(over)


@pytest.mark.parametrize("op", [
    put(b"k" * 40000),
    pb.RequestOp(request_range=pb.RangeRequest(key=b"k" * 40000)),
    pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"k" * 40000)),
    pb.RequestOp(request_txn=pb.TxnRequest(failure=[put(b"k" * 40000)])),
], ids=["put", "range", "delete", "nested put"])
def test_every_op_of_either_branch_is_checked(op: pb.RequestOp) -> None:
    for request in (pb.TxnRequest(success=[op]), pb.TxnRequest(failure=[put(b"fine"), op])):
        with pytest.raises(errors.InvalidArgumentError, match="32768-byte key limit"):
            CHECKS.etcd_txn(request)


def test_a_configured_key_limit_below_the_stores_is_named() -> None:
    checks = RequestChecks(Limits(max_key_bytes=100))
    checks.put(b"k" * 100, b"v")
    with pytest.raises(errors.InvalidArgumentError, match="100-byte key limit"):
        checks.put(b"k" * 101, b"v")
