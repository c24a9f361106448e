"""Alarms in the state machine (statemachine/alarms.py): raised and cleared by log entries, the same
on every replica, kept across a reopen and in a copy (what a snapshot is); and the pieces around
them that need no process: the metrics URL flag, the JSON log lines."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kv.server.http_endpoints import parse_metrics_urls
from kv.server.log_format import JsonFormatter
from raft.core import Entry, EntryType
from raftkv_proto import kv_pb2
from statemachine.alarms import CORRUPT, CORRUPT_CLUSTER, NOSPACE, Alarm, encode_alarm
from statemachine.commands import (
    decode_command,
    encode_command,
    encode_compaction,
    encode_lease_checkpoints,
    encode_lease_grant,
    encode_lease_revoke,
    put_op,
)
from statemachine.errors import InvalidCommandError
from statemachine.kv_state import KVStateMachine


def entries(first: int, *payloads: bytes) -> list[Entry]:
    return [Entry(first + i, 1, EntryType.NORMAL, payload) for i, payload in enumerate(payloads)]


def test_alarms_are_raised_cleared_and_kept_across_a_reopen_and_a_copy(tmp_path: Path) -> None:
    sm = KVStateMachine(tmp_path / "state")
    sm.apply(entries(1, encode_alarm(True, "n2", NOSPACE), encode_alarm(True, "n3", CORRUPT),
                     encode_alarm(True, "n2", NOSPACE)))  # raising twice changes nothing
    assert sm.alarms.listed() == [Alarm("n2", NOSPACE), Alarm("n3", CORRUPT)] and sm.alarms.nospace
    sm.copy_to(tmp_path / "copy")
    sm.apply(entries(4, encode_alarm(False, "n2", NOSPACE)))
    assert sm.alarms.listed() == [Alarm("n3", CORRUPT)] and not sm.alarms.nospace
    sm.close()
    assert KVStateMachine(tmp_path / "state").alarms.listed() == [Alarm("n3", CORRUPT)]
    copy = KVStateMachine(tmp_path / "copy")
    assert copy.alarms.listed() == [Alarm("n2", NOSPACE), Alarm("n3", CORRUPT)]
    copy.apply(entries(4, encode_alarm(False, "", kv_pb2.NONE)))  # etcdctl's disarm: every alarm
    assert copy.alarms.listed() == [] and copy.count() == 0  # alarms are never among the user's keys
    copy.close()


def test_while_corrupt_is_raised_every_replica_refuses_writes_at_apply(tmp_path: Path) -> None:
    """etcd's corrupt mode, decided at apply from the replicated alarms (the same on every
    replica): key writes, compactions and lease grants are refused ("etcdserver: corrupt
    cluster"); a lease checkpoint and the alarm's own disarm go through."""
    with KVStateMachine(tmp_path / "state") as sm:
        sm.apply(entries(1, encode_command([put_op(b"k", b"1")]), encode_lease_grant(5, 60),
                         encode_alarm(True, "n3", CORRUPT)))
        revision = sm.revision
        refused = sm.apply(entries(4, encode_command([put_op(b"k", b"2")]), encode_compaction(2),
                                   encode_lease_grant(6, 60), encode_lease_revoke(5)))
        assert [(o.result.refusal_kind, o.result.refusal) for o in refused] == [("CORRUPT", CORRUPT_CLUSTER)] * 4
        assert sm.get(b"k") == b"1" and sm.revision == revision and sm.leases.ttls == {5: 60}
        sm.apply(entries(8, encode_lease_checkpoints({5: 30}), encode_alarm(False, "n3", CORRUPT),
                         encode_command([put_op(b"k", b"3")])))
        assert sm.leases.remaining == {5: 30} and sm.get(b"k") == b"3" and not sm.alarms.corrupt


def test_an_alarm_command_carries_nothing_else() -> None:
    command = kv_pb2.Command.FromString(encode_alarm(True, "n1", NOSPACE))
    command.ops.extend(kv_pb2.Command.FromString(encode_command([put_op(b"k", b"v")])).ops)
    with pytest.raises(InvalidCommandError, match="alarm"):
        decode_command(command.SerializeToString())


@pytest.mark.parametrize("urls, listeners", [("http://127.0.0.1:2381", [("127.0.0.1", 2381)]),
                                             ("http://a:1, http://b:2", [("a", 1), ("b", 2)]), ("", [])])
def test_metrics_urls_are_http_host_port_lists(urls: str, listeners: list[tuple[str, int]]) -> None:
    assert parse_metrics_urls(urls) == listeners


@pytest.mark.parametrize("bad", ["https://127.0.0.1:2381", "127.0.0.1:2381", "http://127.0.0.1", "http://h:1/metrics"])
def test_metrics_urls_other_than_http_host_port_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="listen_metrics_urls"):
        parse_metrics_urls(bad)


def test_a_json_log_line_is_one_object_with_member_logger_message_and_method() -> None:
    record = logging.LogRecord("kv.server.kv_service", logging.DEBUG, __file__, 1, "Put refused: %s", ("x",), None)
    record.grpc_method = "Put"
    line = json.loads(JsonFormatter("n2").format(record))
    assert line["member"] == "n2" and line["level"] == "debug" and line["message"] == "Put refused: x"
    assert line["logger"] == "kv.server.kv_service" and line["grpc_method"] == "Put" and line["time"].endswith("+00:00")
