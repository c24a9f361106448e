"""Entries no face would propose, written straight into the log of three real members (embedded
nodes in this process, each with its own ports, log and LMDB state): each is answered with an
error, every member applies it alike and keeps serving, and their state hashes agree. A face
refuses such requests before they are proposed (test_shared_checks.py); this is what stands behind
that check when a request gets past it (a member of an older version, a bug in a face)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import kv.embedded
from kv import Client
from raftkv_proto import etcd_rpc_pb2 as pb
from statemachine.apply_batch import ApplyOutcome
from statemachine.commands import encode_command, encode_etcd_txn, put_op
from tests.integration.cluster import free_ports, hashes_agree, wait_until

pytestmark = pytest.mark.integration


def etcd_put(key: bytes, value: bytes = b"v") -> bytes:
    return encode_etcd_txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))])
                           .SerializeToString())


POISON = {
    "a 40000-byte key (over the 32 KiB key limit)": etcd_put(b"k" * 40000),
    "an empty key": etcd_put(b""),
    "a truncated protobuf": encode_command([put_op(b"key", b"value" * 20)])[:-7],
    "an unknown command type": b"\xa2\x06\x03abc",
    "a truncated etcd transaction": encode_etcd_txn(b"\x0a\x05ab"),
}


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[kv.embedded.EmbeddedNode]]:
    ports = free_ports(6)
    peers = {f"n{i}": f"127.0.0.1:{ports[3 + i]}" for i in range(3)}
    opened: list[kv.embedded.EmbeddedNode] = []
    try:
        for i in range(3):
            opened.append(kv.embedded.open(tmp_path / f"n{i}", node_id=f"n{i}", listen=f"127.0.0.1:{ports[i]}",
                                           peers=peers))
        yield opened
    finally:
        for member in opened:
            member.close()


def leader_of(members: list[kv.embedded.EmbeddedNode]) -> tuple[kv.embedded.EmbeddedNode, int]:
    """The member that leads, once all agree on one, and its term."""
    def agreed() -> tuple[kv.embedded.EmbeddedNode, int] | None:
        statuses = [member.status()[0] for member in members]
        leaders = {status["leader"] for status in statuses}
        if len(leaders) != 1 or not statuses[0]["leader"]:
            return None
        leader = next(m for m, s in zip(members, statuses) if s["id"] == s["leader"])
        return leader, statuses[0]["term"]
    return wait_until("one leader", agreed)


def propose(member: kv.embedded.EmbeddedNode, payload: bytes) -> ApplyOutcome:
    """`payload` proposed on the member's node as it stands, past every face."""
    node = member._running.node

    async def proposed() -> ApplyOutcome:
        return await node.propose(payload)
    return member._submit(proposed()).result(10)


def test_poison_entries_are_refused_alike_and_every_member_goes_on(members: list[kv.embedded.EmbeddedNode]) -> None:
    leader, term = leader_of(members)
    with Client([m.address for m in members], timeout=10) as client:
        client.put("before", "1")
        for name, payload in POISON.items():
            outcome = propose(leader, payload)
            assert outcome.error or outcome.result.refusal_kind, (name, outcome)
            assert not outcome.result.etcd_txn_response and not outcome.result.existed, name
            client.put("between", name)
    assert leader_of(members) == (leader, term)
    for member in members:  # each member still serves a write through itself and its own read
        key = f"alive/{member.config.node_id}"
        with Client([member.address], timeout=10) as own:
            own.put(key, "yes")
            wait_until(f"{key} read from the member itself", lambda own=own, key=key: own.get(key, consistency="stale"))
    hashes_agree([member.address for member in members])
