"""Committed entries that cannot be applied (statemachine/apply_batch.py): each becomes the same
refusal on every replica, nothing of it is written, and the entries around it apply as usual. Only
the storage itself may stop an apply."""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from raft.core import Entry, EntryType
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import kv_pb2
from statemachine import KVStateMachine
from statemachine.apply_batch import ApplyOutcome
from statemachine.commands import encode_command, encode_etcd_txn, put_op
from statemachine.mvcc import RevisionWriter


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[tuple[KVStateMachine, KVStateMachine]]:
    """Two replicas of one state."""
    pair = (KVStateMachine(tmp_path / "a", map_size=64 << 20), KVStateMachine(tmp_path / "b", map_size=64 << 20))
    yield pair
    for machine in pair:
        machine.close()


def entries(*payloads: bytes) -> list[Entry]:
    return [Entry(index, 1, EntryType.NORMAL, payload) for index, payload in enumerate(payloads, start=1)]


def apply_all(machine: KVStateMachine, log: Sequence[Entry], slice_size: int | None = None) -> list[ApplyOutcome]:
    """Apply `log` as a driver does: a batch (of `slice_size`, default all), handing out again
    what an apply call did not take."""
    outcomes: list[ApplyOutcome] = []
    while len(outcomes) < len(log):
        start = len(outcomes)
        batch = log[start:start + slice_size] if slice_size else log[start:]
        applied = machine.apply(batch)
        assert applied, "an apply call must take at least one entry"
        outcomes.extend(o for o in applied if o is not None)
    return outcomes


def etcd_put(key: bytes, value: bytes = b"v") -> bytes:
    return encode_etcd_txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))])
                           .SerializeToString())


def refused(outcome: ApplyOutcome) -> str:
    """The message of a refused outcome (a refusal at apply, or an entry applied as one)."""
    assert not outcome.ok or outcome.result.refusal_kind, outcome
    return outcome.result.refusal or outcome.error or ""


POISON = {
    "an etcd put of a 40000-byte key": etcd_put(b"k" * 40000),
    "an etcd put of an empty key": etcd_put(b""),
    "an etcd txn whose nested txn puts a 40000-byte key after a good put": encode_etcd_txn(pb.TxnRequest(success=[
        pb.RequestOp(request_put=pb.PutRequest(key=b"fine", value=b"v")),
        pb.RequestOp(request_txn=pb.TxnRequest(success=[
            pb.RequestOp(request_put=pb.PutRequest(key=b"x" * 40000, value=b"v"))]))]).SerializeToString()),
    "a truncated protobuf": encode_command([put_op(b"key", b"value" * 20)])[:-7],
    "an unknown command type": b"\xa2\x06\x03abc",  # field 100, length-delimited: no kind raftkv knows
    "a truncated etcd transaction": encode_etcd_txn(b"\x0a\x05ab"),
}


@pytest.mark.parametrize("name", list(POISON))
def test_a_poison_entry_is_refused_alike_on_every_replica_and_the_others_apply(
        name: str, machines: tuple[KVStateMachine, KVStateMachine]) -> None:
    log = entries(encode_command([put_op(b"before", b"1")]), POISON[name], etcd_put(b"after", b"2"))
    results = [apply_all(machine, log, slice_size) for machine, slice_size in zip(machines, (None, 1))]
    first, second = machines
    for outcomes in results:
        before, poison, after = outcomes
        assert before.ok and after.ok and not after.result.refusal_kind
        assert refused(poison)
    assert [o.result for o in results[0]] == [o.result for o in results[1]]
    assert [o.error for o in results[0]] == [o.error for o in results[1]]
    assert first.get(b"fine") is None and first.get(b"before") == b"1" and first.get(b"after") == b"2"
    assert first.revision == 3  # the poison entry took no revision
    assert first.applied_index == second.applied_index == 3
    assert first.state_hash() == second.state_hash()


def test_a_key_over_the_stores_limit_is_refused_naming_the_limit(machines: tuple[KVStateMachine, KVStateMachine]) -> None:
    outcome, = apply_all(machines[0], entries(etcd_put(b"k" * 40000)))
    assert outcome.result.refusal_kind == "INVALID_ARGUMENT"
    assert "40000 bytes" in outcome.result.refusal and "32768-byte key limit" in outcome.result.refusal


def test_an_entry_that_raises_half_applied_is_rolled_back_and_refused(
        machines: tuple[KVStateMachine, KVStateMachine], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Defence in depth: whatever a command raises while it is applied (here a fault injected
    after its first put was written), the entry is refused as a whole and the member goes on."""
    real_put = RevisionWriter.put

    def put_then_fail(self: RevisionWriter, key: bytes, value: bytes, lease: int = 0) -> bool:
        existed = real_put(self, key, value, lease)
        if key == b"boom":
            raise ValueError("a bug in an apply path")
        return existed
    monkeypatch.setattr(RevisionWriter, "put", put_then_fail)
    log = entries(encode_command([put_op(b"a", b"1")]),
                  encode_command([put_op(b"b", b"2"), put_op(b"boom", b"3")]),
                  encode_command([put_op(b"c", b"4")]))
    with caplog.at_level(logging.ERROR, logger="statemachine"):
        first_call = machines[0].apply(log)
    assert len(first_call) == 2  # ends after the refused entry: the driver hands out the rest again
    assert first_call[1] is not None and "ValueError: a bug in an apply path" in (first_call[1].error or "")
    assert "entry 2 (term 1) could not be applied" in caplog.text
    assert machines[0].apply(log[2:])[0].ok
    apply_all(machines[1], log, slice_size=1)
    for machine in machines:
        assert (machine.get(b"a"), machine.get(b"b"), machine.get(b"boom"), machine.get(b"c")) == (b"1", None, None, b"4")
        assert machine.revision == 3 and machine.applied_index == 3
    assert machines[0].state_hash() == machines[1].state_hash()


def test_a_full_map_still_stops_the_apply(tmp_path: Path) -> None:
    """The storage's own failure is not an entry's: the batch is refused whole (StateFullError)."""
    from statemachine.errors import StateFullError
    with KVStateMachine(tmp_path / "s", map_size=1 << 20) as machine:
        with pytest.raises(StateFullError):
            machine.apply(entries(*(encode_command([put_op(b"k%d" % i, b"x" * 4000)]) for i in range(400))))
        assert machine.applied_index == 0


def test_a_refused_write_keeps_its_session_usable(machines: tuple[KVStateMachine, KVStateMachine]) -> None:
    """A tracked write refused at apply leaves the session as it was: the next seq applies."""
    from statemachine.commands import encode_registration, session_id
    machine = machines[0]
    client = session_id(1, b"s" * 16)
    log = [Entry(1, 1, EntryType.NORMAL, encode_registration(b"s" * 16)),
           Entry(2, 1, EntryType.NORMAL, encode_etcd_txn(
               pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b"k" * 40000))]).SerializeToString(),
               client_id=client, seq=1)),
           Entry(3, 1, EntryType.NORMAL, encode_command([put_op(b"k", b"v")], client, 2))]
    outcomes = apply_all(machine, log)
    assert outcomes[1].result.refusal_kind == "INVALID_ARGUMENT" and outcomes[2].ok
    assert machine.get(b"k") == b"v"
    assert kv_pb2.CommandResult() == outcomes[0].result
