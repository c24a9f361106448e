"""The KV state machine on a real LMDB environment in a temporary directory."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from raftkv_proto import etcd_rpc_pb2, kv_pb2
from raft.core import Entry, EntryType
from statemachine import (
    ApplyOrderError, ApplyOutcome, KVStateMachine, SessionStats, StateFullError, delete_op, encode_command, put_op,
)
from statemachine.commands import check_state_command, encode_registration, session_id
from statemachine.errors import CorruptStateError
from statemachine.kv_state import FORMAT_VERSION


@pytest.fixture
def sm(tmp_path: Path) -> Iterator[KVStateMachine]:
    machine = KVStateMachine(tmp_path / "state", map_size=64 << 20)
    yield machine
    machine.close()


class Log:
    """Builds consecutive entries the way a leader's log would hold them."""

    def __init__(self, term: int = 1) -> None:
        self.next_index = 1
        self.term = term
        self.ids: dict[str, str] = {}  # a test's name for a client -> the id its registration issued

    def register(self, name: str, secret: bytes | None = None) -> Entry:
        """The registration entry of a client session; later entries for `name` use its id."""
        secret = secret if secret is not None else name.encode().ljust(16, b"-")[:16]
        self.ids[name] = session_id(self.next_index, secret)
        return self.entry(payload=encode_registration(secret))

    def entry(self, ops: Sequence[kv_pb2.Op] = (), client_id: str = "", seq: int = 0,
              payload: bytes | None = None, noop: bool = False) -> Entry:
        if noop:
            made = Entry(self.next_index, self.term, EntryType.NOOP)
        else:
            client_id = self.ids.get(client_id, client_id)
            made = Entry(self.next_index, self.term, EntryType.NORMAL,
                         encode_command(ops, client_id, seq) if payload is None else payload)
        self.next_index += 1
        return made

    def put(self, key: bytes, value: bytes, client_id: str = "", seq: int = 0) -> Entry:
        return self.entry([put_op(key, value)], client_id, seq)


def outcome(result: ApplyOutcome | None) -> ApplyOutcome:
    assert result is not None
    return result


# ---- plain application ---------------------------------------------------------------------

def test_put_delete_report_whether_key_existed(sm: KVStateMachine) -> None:
    log = Log()
    results = sm.apply([
        log.put(b"a", b"1"),
        log.put(b"a", b"2"),
        log.entry([delete_op(b"a"), delete_op(b"a"), put_op(b"b", b"3")]),
    ])
    assert [list(outcome(r).result.existed) for r in results] == [[False], [True], [True, False, False]]
    assert [outcome(r).index for r in results] == [1, 2, 3]
    assert all(outcome(r).ok for r in results)
    assert sm.get(b"a") is None and sm.get(b"b") == b"3"
    assert sm.applied_index == 3 and sm.applied_term == 1 and sm.count() == 1


def test_noop_only_advances_applied_index(sm: KVStateMachine) -> None:
    log = Log(term=4)
    assert sm.apply([log.entry(noop=True)]) == [None]
    assert (sm.applied_index, sm.applied_term, sm.count()) == (1, 4, 0)


def test_empty_batch_changes_nothing(sm: KVStateMachine) -> None:
    assert sm.apply([]) == []
    assert sm.applied_index == 0


def test_non_consecutive_batch_is_refused_and_not_applied(sm: KVStateMachine) -> None:
    log = Log()
    sm.apply([log.put(b"a", b"1")])
    gap = [Entry(2, 1, payload=encode_command([put_op(b"b", b"1")])),
           Entry(4, 1, payload=encode_command([put_op(b"c", b"1")]))]
    with pytest.raises(ApplyOrderError, match="expected index 3, got 4"):
        sm.apply(gap)
    with pytest.raises(ApplyOrderError, match="expected index 2, got 1"):
        sm.apply([Entry(1, 1, payload=encode_command([put_op(b"b", b"1")]))])
    assert sm.applied_index == 1 and sm.get(b"b") is None


def test_reopen_resumes_at_applied_index_with_data(tmp_path: Path) -> None:
    log = Log(term=3)
    with KVStateMachine(tmp_path / "s", map_size=16 << 20) as first:
        first.apply([log.register("c")] + [log.put(b"k%d" % i, b"v%d" % i, "c", i + 1) for i in range(49)])
        before = first.state_hash()
    with KVStateMachine(tmp_path / "s", map_size=16 << 20) as again:
        assert (again.applied_index, again.applied_term) == (50, 3)
        assert again.state_hash() == before and again.get(b"k7") == b"v7"
        # The session survived too: a retry after the restart is still recognised.
        retry = Entry(51, 3, payload=encode_command([put_op(b"k0", b"other")], log.ids["c"], 1))
        assert outcome(again.apply([retry])[0]).duplicate
        assert again.get(b"k0") == b"v0"
    again.close()  # a second close is harmless


def test_sync_mode_works_the_same(tmp_path: Path) -> None:
    log = Log()
    with KVStateMachine(tmp_path / "s", map_size=16 << 20, sync=True) as machine:
        machine.apply([log.put(b"a", b"1")])
        machine.sync()
    with KVStateMachine(tmp_path / "s", map_size=16 << 20) as machine:
        assert machine.get(b"a") == b"1" and machine.applied_index == 1


# ---- exactly-once --------------------------------------------------------------------------

def test_same_header_twice_has_one_effect_and_same_result(sm: KVStateMachine) -> None:
    log = Log()
    first, other, retry = sm.apply([log.register("c1"), log.register("c2")] + [
        log.entry([put_op(b"k", b"v1"), delete_op(b"x")], "c1", 1),
        log.put(b"k", b"v2", "c2", 1),  # another client overwrites in between
        log.entry([put_op(b"k", b"v1"), delete_op(b"x")], "c1", 1),
    ])[2:]
    assert not outcome(first).duplicate and outcome(retry).duplicate and outcome(retry).ok
    assert outcome(retry).result == outcome(first).result
    assert list(outcome(other).result.existed) == [True]
    assert sm.get(b"k") == b"v2"  # the retry did not put v1 again


def test_duplicate_across_batches(sm: KVStateMachine) -> None:
    log = Log()
    sm.apply([log.register("c"), log.entry([delete_op(b"k")], "c", 7)])
    sm.apply([log.put(b"k", b"v")])
    again = outcome(sm.apply([log.entry([delete_op(b"k")], "c", 7)])[0])
    assert again.duplicate and list(again.result.existed) == [False]
    assert sm.get(b"k") == b"v"


def test_concurrent_seqs_commit_in_any_order(sm: KVStateMachine) -> None:
    log = Log()
    order = [5, 3, 4, 1, 2]
    sm.apply([log.register("c")])
    results = sm.apply([log.put(b"k%d" % s, b"v", "c", s) for s in order])
    assert not any(outcome(r).duplicate or outcome(r).expired for r in results)
    assert sm.count() == 5
    retries = sm.apply([log.put(b"k%d" % s, b"changed", "c", s) for s in order])
    assert all(outcome(r).duplicate for r in retries)
    assert sm.scan_prefix(b"k")[0] == [(b"k%d" % s, b"v") for s in range(1, 6)]


def test_seq_older_than_window_is_expired_and_not_applied(tmp_path: Path) -> None:
    with KVStateMachine(tmp_path / "s", map_size=16 << 20, session_window=4) as machine:
        log = Log()
        machine.apply([log.register("c")] + [log.put(b"k%d" % s, b"v", "c", s) for s in (1, 2, 8, 10)])
        # Highest seq is 10 and the window 4: 7..10 are still known, 6 and below are not.
        late, known, old = machine.apply([
            log.put(b"new7", b"v", "c", 7),   # inside the window, never applied: applied now
            log.put(b"k8", b"again", "c", 8),  # inside the window, applied: duplicate
            log.put(b"k2", b"again", "c", 2),  # below the window: expired
        ])
        assert outcome(late).ok and not outcome(late).duplicate and machine.get(b"new7") == b"v"
        assert outcome(known).duplicate and machine.get(b"k8") == b"v"
        assert outcome(old).expired and not outcome(old).ok and machine.get(b"k2") == b"v"
        expired_new = outcome(machine.apply([log.put(b"never", b"v", "c", 6)])[0])
        assert expired_new.expired and machine.get(b"never") is None
        # Only the window's results are stored: 7, 8 and 10 (9 was never applied).
        assert machine.session_stats() == SessionStats(clients=1, results=3)


def test_empty_client_id_means_no_dedup(sm: KVStateMachine) -> None:
    log = Log()
    first, second = sm.apply([log.put(b"k", b"v"), log.put(b"k", b"v")])
    assert not outcome(second).duplicate and list(outcome(second).result.existed) == [True]
    assert sm.session_stats() == SessionStats(clients=0, results=0)


def test_sessions_expire_by_log_index_identically_for_any_batching(tmp_path: Path) -> None:
    log = Log()
    entries = [log.register("c")]                               # index 1
    entries += [log.put(b"k", b"first", "c", 1)]                # 2
    entries += [log.entry(noop=True) for _ in range(4)]         # 3..6
    entries += [log.put(b"k", b"retry-seen", "c", 1)]           # 7: 7-2 = 5 = ttl, still known
    entries += [log.entry(noop=True) for _ in range(5)]         # 8..12
    entries += [log.put(b"k", b"after-ttl", "c", 2)]            # 13: unused for 6 > 5, forgotten
    entries += [log.register("d"), log.put(b"z", b"other", "d", 1)]  # 14, 15
    entries += [log.entry(noop=True) for _ in range(6)]         # 16..21: the session is stale
    with KVStateMachine(tmp_path / "one", map_size=16 << 20, session_ttl_entries=5) as one, \
            KVStateMachine(tmp_path / "all", map_size=16 << 20, session_ttl_entries=5) as whole:
        singly = [r for e in entries for r in one.apply([e])]
        at_once = whole.apply(entries)
        assert singly == at_once
        assert outcome(at_once[6]).duplicate
        assert outcome(at_once[12]).unknown_session and not outcome(at_once[12]).ok
        assert outcome(at_once[14]).ok
        assert one.state_hash() == whole.state_hash() and one.get(b"k") == b"first" and one.get(b"z") == b"other"
        # Stale sessions are physically dropped, not just ignored.
        assert one.session_stats() == whole.session_stats() == SessionStats(clients=0, results=0)


# ---- client sessions -------------------------------------------------------------------------

def test_a_write_needs_a_registered_session(sm: KVStateMachine) -> None:
    """A client id the cluster did not issue is refused, whatever it looks like."""
    log = Log()
    registered, made_up, unissued, wrong_secret = sm.apply([
        log.register("c", secret=b"s" * 16),
        log.put(b"a", b"1", "my-own-name", 1),
        log.put(b"b", b"1", session_id(7, b"s" * 16), 1),  # no registration at index 7
        log.put(b"c", b"1", session_id(1, b"t" * 16), 1),  # index 1's session, another secret
    ])
    assert registered is not None and outcome(registered).ok
    for refused in (made_up, unissued, wrong_secret):
        assert outcome(refused).unknown_session and not outcome(refused).ok
    assert sm.get(b"a") is None and sm.get(b"b") is None and sm.get(b"c") is None
    assert sm.session_stats() == SessionStats(clients=1, results=0)


def test_a_forged_id_cannot_take_or_spoil_another_clients_session(sm: KVStateMachine) -> None:
    """Another client that knows the registration index (but not the secret) can neither have
    its write answered with the owner's result, nor push the owner's sequence out of reach."""
    log = Log()
    sm.apply([log.register("owner", secret=b"o" * 16)])
    owner = log.ids["owner"]
    index = int(owner.split(".")[0])
    forged = session_id(index, b"f" * 16)
    first, same_seq, far_ahead, owner_next, owner_retry = sm.apply([
        log.put(b"owner", b"1", owner, 1),
        log.put(b"forger", b"2", forged, 2),
        log.put(b"forger", b"far", forged, 10 ** 9),
        log.put(b"owner", b"2", owner, 2),
        log.put(b"owner", b"1-again", owner, 1),
    ])
    assert outcome(same_seq).unknown_session and outcome(far_ahead).unknown_session
    assert sm.get(b"forger") is None
    assert outcome(owner_next).ok and not outcome(owner_next).duplicate and sm.get(b"owner") == b"2"
    assert outcome(owner_retry).duplicate and outcome(owner_retry).result == outcome(first).result


def test_ids_name_their_registration_entry_and_secret(sm: KVStateMachine) -> None:
    log = Log()
    a, b = log.register("a", secret=b"a" * 16), log.register("b", secret=b"b" * 16)
    sm.apply([a, b])
    assert log.ids["a"] == f"1.{(b'a' * 16).hex()}" and log.ids["b"] == f"2.{(b'b' * 16).hex()}"
    # Two sessions with the same seq do not meet.
    x, y = sm.apply([log.put(b"k", b"from-a", "a", 1), log.put(b"k", b"from-b", "b", 1)])
    assert not outcome(x).duplicate and not outcome(y).duplicate and sm.get(b"k") == b"from-b"


def test_registrations_past_the_bound_expire_the_least_recently_used(tmp_path: Path) -> None:
    log = Log()
    entries = [log.register(name) for name in ("a", "b", "c")]   # 1..3
    entries += [log.put(b"k", b"a1", "a", 1)]                     # 4: a is used, b now the oldest
    entries += [log.register("d")]                                # 5: four sessions, b expires
    entries += [log.put(b"k", b"b1", "b", 1), log.put(b"k", b"c1", "c", 1),
                log.put(b"k", b"a2", "a", 2), log.put(b"k", b"d1", "d", 1)]
    with KVStateMachine(tmp_path / "one", map_size=16 << 20, max_sessions=3) as one, \
            KVStateMachine(tmp_path / "all", map_size=16 << 20, max_sessions=3) as whole:
        singly = [r for e in entries for r in one.apply([e])]
        at_once = whole.apply(entries)
        assert singly == at_once
        b1, c1, a2, d1 = at_once[5:]
        assert outcome(b1).unknown_session
        assert outcome(c1).ok and outcome(a2).ok and outcome(d1).ok
        assert one.get(b"k") == whole.get(b"k") == b"d1"
        assert one.session_stats() == whole.session_stats() == SessionStats(clients=3, results=4)


def test_registration_entries_must_be_well_formed(sm: KVStateMachine) -> None:
    log = Log()
    short = log.entry(payload=kv_pb2.Command(registration=kv_pb2.Registration(secret=b"x")).SerializeToString())
    with_ops = log.entry(payload=kv_pb2.Command(registration=kv_pb2.Registration(secret=b"x" * 16),
                                                ops=[put_op(b"k", b"v")]).SerializeToString())
    results = sm.apply([short, with_ops])
    assert all(outcome(r).error for r in results)
    assert sm.get(b"k") is None and sm.session_stats() == SessionStats(clients=0, results=0)


def test_a_state_of_another_format_is_refused_naming_both(tmp_path: Path) -> None:
    import lmdb
    with KVStateMachine(tmp_path / "s", map_size=16 << 20) as machine:
        machine.apply([Log().put(b"k", b"v")])
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"format", (1).to_bytes(8, "big"), db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(RuntimeError, match=f"state format 1, expected {FORMAT_VERSION}"):
        KVStateMachine(tmp_path / "s", map_size=16 << 20)


# ---- malformed entries ---------------------------------------------------------------------

def test_malformed_payload_is_a_logged_noop(sm: KVStateMachine, caplog: pytest.LogCaptureFixture) -> None:
    log = Log()
    with caplog.at_level(logging.ERROR, logger="statemachine"):
        bad, empty, good = sm.apply([
            log.entry(payload=b"\xff\xfe garbage"),
            log.entry(payload=b""),
            log.put(b"k", b"v"),
        ])
    assert outcome(bad).error and "not a kv Command" in str(outcome(bad).error) and not outcome(bad).ok
    assert outcome(empty).error and "no ops" in str(outcome(empty).error)
    assert outcome(good).ok and sm.get(b"k") == b"v" and sm.applied_index == 3 and sm.count() == 1
    assert "entry 1" in caplog.text


def test_bad_key_inside_command_applies_none_of_its_ops(sm: KVStateMachine) -> None:
    log = Log()
    result = outcome(sm.apply([log.entry([put_op(b"ok", b"v"), put_op(b"x" * 40000, b"v")], "c", 1)])[0])
    assert result.error and "40000 bytes" in result.error
    assert sm.get(b"ok") is None and sm.applied_index == 1


# ---- reads ---------------------------------------------------------------------------------

@pytest.fixture
def filled(sm: KVStateMachine) -> KVStateMachine:
    log = Log()
    keys = [b"a", b"user/1", b"user/2", b"user/3", b"user0", b"v\xff", b"v\xff\xff", b"w"]
    sm.apply([log.put(k, b"val-" + k) for k in keys])
    return sm


def test_scan_prefix(filled: KVStateMachine) -> None:
    items, more = filled.scan_prefix(b"user/", limit=10)
    assert [k for k, _ in items] == [b"user/1", b"user/2", b"user/3"] and not more
    assert items[0] == (b"user/1", b"val-user/1")
    assert [k for k, _ in filled.scan_prefix(b"v\xff", 10)[0]] == [b"v\xff", b"v\xff\xff"]
    assert filled.scan_prefix(b"nothing", 10) == ([], False)
    assert len(filled.scan_prefix(b"", 100)[0]) == 8


def test_scan_half_open_range(filled: KVStateMachine) -> None:
    items, more = filled.scan(b"user/2", b"user0", limit=10)
    assert [k for k, _ in items] == [b"user/2", b"user/3"] and not more
    assert [k for k, _ in filled.scan(b"v", b"", limit=10)[0]] == [b"v\xff", b"v\xff\xff", b"w"]
    assert [k for k, _ in filled.scan(b"", None, limit=2)[0]] == [b"a", b"user/1"]


def test_scan_limit_and_more(filled: KVStateMachine) -> None:
    items, more = filled.scan_prefix(b"user/", limit=2)
    assert [k for k, _ in items] == [b"user/1", b"user/2"] and more
    items, more = filled.scan(items[-1][0] + b"\x00", _end(b"user/"), limit=2)
    assert [k for k, _ in items] == [b"user/3"] and not more
    # Exactly `limit` keys left: no more.
    assert filled.scan_prefix(b"user/", limit=3)[1] is False
    with pytest.raises(ValueError):
        filled.scan(b"", None, limit=0)


def test_scan_stops_at_its_byte_budget_with_at_least_one_pair(filled: KVStateMachine) -> None:
    # user/1..3 each carry 6 + 10 bytes of key and value.
    items, more = filled.scan_prefix(b"user/", limit=10, max_bytes=32)
    assert [k for k, _ in items] == [b"user/1", b"user/2"] and more
    items, more = filled.scan(b"user/", _end(b"user/"), limit=10, max_bytes=48)
    assert len(items) == 3 and not more  # the budget exactly spent: nothing was cut
    items, more = filled.scan_prefix(b"user/", limit=10, max_bytes=1)
    assert [k for k, _ in items] == [b"user/1"] and more  # a pair over the budget still comes alone


def _end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def test_get_of_impossible_keys_is_none(filled: KVStateMachine) -> None:
    assert filled.get(b"") is None and filled.get(b"x" * 40000) is None and filled.get(b"x" * 600) is None


def test_state_hash_compares_contents_and_history(tmp_path: Path) -> None:
    with KVStateMachine(tmp_path / "a", map_size=16 << 20) as a, \
            KVStateMachine(tmp_path / "b", map_size=16 << 20) as b, \
            KVStateMachine(tmp_path / "c", map_size=16 << 20) as c:
        log_a, log_b, log_c = Log(), Log(term=2), Log()
        a.apply([log_a.put(b"x", b"1"), log_a.put(b"y", b"2")])
        c.apply([log_c.put(b"x", b"1"), log_c.put(b"y", b"2")])
        assert a.state_hash() == c.state_hash()  # the same commands: the same state
        # The same keys and values by another history: reads at past revisions differ, so the
        # states do too.
        b.apply([log_b.put(b"y", b"0"), log_b.put(b"z", b"9"), log_b.put(b"x", b"1"),
                 log_b.entry([delete_op(b"z"), put_op(b"y", b"2")])])
        assert a.scan() == b.scan()
        assert a.state_hash() != b.state_hash()
        # Moving a byte from key to value must change the hash.
        a.apply([log_a.entry([delete_op(b"y"), put_op(b"y2", b"")])])
        c.apply([log_c.entry([delete_op(b"y"), put_op(b"y", b"2")])])
        assert a.state_hash() != c.state_hash()


# ---- damage on the disk, and state checks ---------------------------------------------------

def _rot_value(path: Path, value: bytes) -> None:
    """Flip one byte of `value` where the state file holds it, as a bad sector would."""
    data_file = path / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    at = raw.find(value)
    assert at >= 0 and raw.find(value, at + 1) < 0, "the value must be in the file exactly once"
    raw[at + 3] ^= 0x01
    data_file.write_bytes(bytes(raw))


def test_a_value_damaged_on_disk_is_refused_on_every_read_not_served(tmp_path: Path) -> None:
    precious = b"precious-value-" * 8
    with KVStateMachine(tmp_path / "s", map_size=16 << 20) as sm:
        log = Log()
        sm.apply([log.put(b"a", b"fine"), log.put(b"k", precious), log.put(b"z", b"fine")])
    _rot_value(tmp_path / "s", precious)
    with KVStateMachine(tmp_path / "s", map_size=16 << 20) as sm:
        assert sm.get(b"a") == b"fine"
        every_key = {"key": b"\x00", "range_end": b"\x00"}
        etcd_lists = [etcd_rpc_pb2.RangeRequest(**every_key), etcd_rpc_pb2.RangeRequest(**every_key, keys_only=True),
                      etcd_rpc_pb2.RangeRequest(**every_key, limit=2),
                      etcd_rpc_pb2.RangeRequest(**every_key, sort_order=etcd_rpc_pb2.RangeRequest.DESCEND)]
        for read in (lambda: sm.get(b"k"), lambda: sm.scan(b"", None, 10), lambda: sm.scan_prefix(b"k", 10),
                     lambda: sm.scan(b"", None, 10, keys_only=True),
                     sm.state_hash, lambda: sm.read_view().scan(b"", None, 10),
                     *(lambda request=request: sm.etcd_range(request) for request in etcd_lists)):
            with pytest.raises(CorruptStateError, match="b'k' fails its checksum"):
                read()


def test_a_state_check_marker_ends_the_batch_and_pins_the_state_as_of_it(sm: KVStateMachine) -> None:
    log = Log()
    before = [log.put(b"a", b"1"), log.put(b"b", b"2")]
    marker = Entry(log.next_index, log.term, EntryType.NORMAL, check_state_command())
    log.next_index += 1
    after = [log.put(b"a", b"changed"), log.put(b"c", b"3")]
    results = sm.apply([*before, marker, *after])
    assert len(results) == 3 and outcome(results[-1]).state_check  # the batch ended at the marker
    assert sm.applied_index == marker.index
    sm.apply(after)  # the driver hands in the rest
    [view] = sm.take_state_checks()
    assert sm.take_state_checks() == []
    try:
        assert view.index == marker.index
        assert view.scan(b"", None, 10) == ([(b"a", b"1"), (b"b", b"2")], False)
        expected = KVStateMachine(sm.path.parent / "expected", map_size=16 << 20)
        with expected:
            expected.apply([*before])
            assert view.state_hash() == expected.state_hash() != sm.state_hash()
    finally:
        view.close()


def test_copy_to_is_a_consistent_openable_state(filled: KVStateMachine, tmp_path: Path) -> None:
    index, term, _ = filled.copy_to(tmp_path / "copy")
    assert (index, term) == (filled.applied_index, filled.applied_term)
    with KVStateMachine(tmp_path / "copy", map_size=16 << 20) as copy:
        assert copy.state_hash() == filled.state_hash() and copy.applied_index == index


def test_copy_to_packs_pages_that_inserts_into_the_middle_left_half_full(tmp_path: Path) -> None:
    """Keys loaded into the middle of the tree (before a key already there) split every page in
    half; the copy re-packs them, with every key, session and the applied index intact."""
    with KVStateMachine(tmp_path / "s", map_size=256 << 20) as machine:
        log = Log()
        machine.apply([log.put(b"z-last", b"v"), log.register("loader")])
        for first in range(0, 40_000, 1000):
            tracked = log.put(b"k%08d" % first, b"v" * 16, "loader", first // 1000 + 1)
            machine.apply([tracked] + [log.put(b"k%08d" % i, b"v" * 16) for i in range(first + 1, first + 1000)])
        half_full = tmp_path / "compacting-copy"
        half_full.mkdir()
        machine._env.copy(str(half_full), compact=True)
        index, term, _ = machine.copy_to(tmp_path / "packed")
        packed_size = (tmp_path / "packed" / "data.mdb").stat().st_size
        assert packed_size < 0.7 * (half_full / "data.mdb").stat().st_size
        assert (index, term) == (machine.applied_index, machine.applied_term)
        with KVStateMachine(tmp_path / "packed", map_size=256 << 20) as copy:
            assert copy.state_hash() == machine.state_hash() and copy.count() == 40_001
            assert copy.applied_index == index and copy.session_stats() == machine.session_stats()


# ---- map full ------------------------------------------------------------------------------

def test_map_full_refuses_batch_and_reads_keep_working(tmp_path: Path) -> None:
    with KVStateMachine(tmp_path / "s", map_size=1 << 20) as machine:
        log = Log()
        machine.apply([log.put(b"keep", b"v")])
        big = [log.put(b"big%d" % i, b"x" * 4000) for i in range(400)]
        with pytest.raises(StateFullError, match="is full") as info:
            machine.apply(big)
        assert "entries 2..401 were not applied" in str(info.value)
        assert machine.applied_index == 1 and machine.get(b"keep") == b"v" and machine.count() == 1
        # The environment is still usable for a batch that fits.
        small = Entry(2, 1, payload=encode_command([put_op(b"small", b"v")]))
        assert outcome(machine.apply([small])[0]).ok and machine.applied_index == 2


# ---- throughput (printed, not asserted) ----------------------------------------------------

def test_apply_throughput_100k_puts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = Log()
    entries = [log.register(f"client-{c}") for c in range(8)]
    entries += [log.put(b"key/%08d" % i, b"v" * 100, "client-%d" % (i % 8), i // 8 + 1) for i in range(100_000)]
    with KVStateMachine(tmp_path / "s", map_size=1 << 30) as machine:
        started = time.perf_counter()
        for first in range(0, len(entries), 1000):
            machine.apply(entries[first:first + 1000])
        elapsed = time.perf_counter() - started
        assert machine.count() == 100_000
    with capsys.disabled():
        print(f"\napply: 100k tracked puts in batches of 1000: {elapsed:.2f}s, {100_000 / elapsed:,.0f} entries/s")


# ---- prefix ops (atomic publish of staged rows) ---------------------------------------------

def _move(source: bytes, target: bytes) -> kv_pb2.Op:
    return kv_pb2.Op(move_prefix=kv_pb2.MovePrefix(source=source, target=target))


def _delete_prefix(prefix: bytes) -> kv_pb2.Op:
    return kv_pb2.Op(delete_prefix=prefix)


def test_delete_prefix_removes_only_that_prefix(sm: KVStateMachine) -> None:
    log = Log()
    sm.apply([log.entry([put_op(k, b"v") for k in (b"s/1", b"s/2", b"s", b"t/1", b"r")])])
    results = sm.apply([log.entry([_delete_prefix(b"s/"), _delete_prefix(b"s/")])])
    assert list(outcome(results[0]).result.existed) == [True, False]
    assert [k for k, _ in sm.scan(limit=10)[0]] == [b"r", b"s", b"t/1"]


def test_move_prefix_renames_and_overwrites_in_one_entry(sm: KVStateMachine) -> None:
    log = Log()
    staged = [put_op(b"~stage/job1/k%05d" % i, b"new%d" % i) for i in range(3000)]  # many pages
    sm.apply([log.entry([put_op(b"k00001", b"old"), put_op(b"z", b"keep")]), log.entry(staged)])
    results = sm.apply([log.entry([_move(b"~stage/job1/", b"")])])
    assert list(outcome(results[0]).result.existed) == [True]
    assert sm.get(b"k00001") == b"new1"  # overwritten
    assert sm.get(b"k02999") == b"new2999" and sm.get(b"z") == b"keep"
    assert sm.scan_prefix(b"~stage/")[0] == []
    assert sm.count() == 3001


def test_move_prefix_whose_keys_land_under_the_source_again(sm: KVStateMachine) -> None:
    # target is a prefix of source: "a/b/b/x" -> "a/b/x", which is under the source; it must be
    # renamed once (as the state before the op says), not walked and renamed again.
    log = Log()
    sm.apply([log.entry([put_op(b"a/b/b/x", b"1"), put_op(b"a/b/y", b"2")])])
    sm.apply([log.entry([_move(b"a/b/", b"a/")])])
    assert sm.scan(limit=10)[0] == [(b"a/b/x", b"1"), (b"a/y", b"2")]


def test_prefix_ops_that_cannot_apply_deterministically_are_refused(sm: KVStateMachine) -> None:
    log = Log()
    sm.apply([log.put(b"k", b"v")])
    for bad, message in ((_delete_prefix(b""), "empty"), (_move(b"", b"x"), "empty"),
                         (_move(b"ab", b"abc"), "longer than its source")):
        result = outcome(sm.apply([log.entry([bad])])[0])
        assert result.error is not None and message in result.error
    assert sm.get(b"k") == b"v"


def test_read_view_stays_at_its_index_while_apply_moves_on(sm: KVStateMachine) -> None:
    log = Log(term=3)
    sm.apply([log.put(b"a", b"1"), log.put(b"b", b"1")])
    view = sm.read_view()
    try:
        sm.apply([log.put(b"a", b"2"), log.entry([delete_op(b"b")]), log.put(b"c", b"2")])
        assert (view.index, view.term) == (2, 3)
        assert view.scan(b"", None, 10) == ([(b"a", b"1"), (b"b", b"1")], False)
        assert list(view.keys(b"b", None)) == [b"b"] and view.count() == 2
        assert sm.scan(limit=10)[0] == [(b"a", b"2"), (b"c", b"2")]
    finally:
        view.close()
    assert view.closed
