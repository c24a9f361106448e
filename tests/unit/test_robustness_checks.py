"""The robustness suite's checks (tests/robustness/checks_*.py, agreed_history.py) on hand-made
records: a correct run passes every check, and each kind of wrong answer fails the check meant
to catch it. Without these, a check that can never fail would pass the suite for ever."""
from __future__ import annotations

from dataclasses import replace

from tests.robustness.agreed_history import Findings, History, check_agreement, check_consistency
from tests.robustness.checks_kv import check_kv
from tests.robustness.checks_lease import NOT_EARLY, NOT_GONE_EARLY, REVOKED_WHOLE, check_leases
from tests.robustness.checks_watch import ATOMIC, EVENTS, PROGRESS, check_watches
from tests.robustness.records import (EventRecord, KeyOp, KvCall, KvRecord, LeaseCall, Outcome, WatchLog,
                                      WatchResponseRecord, WatchSpec)

S = 1_000_000_000  # ns
LEASE = 0x42
# Revision 2: put k/a=1; 3: put k/a=2 and l/x on the lease (a txn); 4: delete k/a; 5: the lease's revocation.
KA1 = KvRecord(b"k/a", b"1", 2, 2, 1, 0)
KA2 = KvRecord(b"k/a", b"2", 2, 3, 2, 0)
LX = KvRecord(b"l/x", b"v", 3, 3, 1, LEASE)
EVENTS_OF_RUN = [EventRecord(False, KA1, None), EventRecord(False, KA2, KA1), EventRecord(False, LX, None),
                 EventRecord(True, KvRecord(b"k/a", b"", 0, 4, 0, 0), KA2),
                 EventRecord(True, KvRecord(b"l/x", b"", 0, 5, 0, 0), LX)]
UNTIL = 5


def kv_calls() -> list[KvCall]:
    return [KvCall("c", "n1", (KeyOp("put", b"k/a", b"1"),), 0, 1 * S, Outcome.OK, 2),
            KvCall("c", "n1", (KeyOp("put", b"k/a", b"2"), KeyOp("put", b"l/x", b"v", lease=LEASE)), 2 * S, 3 * S,
                   Outcome.OK, 3),
            KvCall("c", "n2", (KeyOp("get", b"k/a", b"2"),), 4 * S, 5 * S, Outcome.OK, 3),
            KvCall("c", "n1", (KeyOp("delete", b"k/a", existed=True),), 6 * S, 7 * S, Outcome.OK, 4),
            KvCall("c", "n1", (KeyOp("get", b"k/a", None),), 30 * S, 31 * S, Outcome.OK, 5)]


def lease_calls(keepalive_at: int = 10 * S) -> list[LeaseCall]:
    return [LeaseCall("l", "n1", "grant", LEASE, 1 * S, 2 * S, Outcome.OK, ttl=2, revision=2),
            LeaseCall("l", "n1", "keepalive", LEASE, keepalive_at, keepalive_at + S // 10, Outcome.OK, ttl=2, revision=4)]


def response(stream: int, at: int, revision: int, events: list[EventRecord], **flags: object) -> WatchResponseRecord:
    fields = {"created": False, "canceled": False, "compact_revision": 0, "fragment": False, **flags}
    return WatchResponseRecord(stream, "n1", at, revision, 0, events=tuple(events), **fields)  # type: ignore[arg-type]


def watch(events: list[list[EventRecord]], prev_kv: bool = True, progress_at: int | None = None) -> WatchLog:
    """A watch of every key from revision 1: a response per list of events (the last at UNTIL)."""
    log = WatchLog(WatchSpec("w", b"\0", b"\0", 1, prev_kv), starts=[1], members=["n1"], finished=True)
    log.responses.append(response(0, 0, 1, [], created=True))
    if progress_at is not None:
        log.responses.append(response(0, 1, progress_at, []))
    for i, batch in enumerate(events):
        log.responses.append(response(0, 20 * S + i, max(e.revision for e in batch), batch))
    return log


def by_revision(events: list[EventRecord]) -> list[list[EventRecord]]:
    revisions = sorted({e.revision for e in events})
    return [[e for e in events if e.revision == r] for r in revisions]


def run_checks(history_events: list[EventRecord] = EVENTS_OF_RUN, calls: list[KvCall] | None = None,
               leases: list[LeaseCall] | None = None, watches: list[WatchLog] | None = None) -> Findings:
    history = History(history_events)
    findings = Findings()
    check_consistency(history, UNTIL, findings)
    kv = kv_calls() if calls is None else calls
    logs = [watch(by_revision(EVENTS_OF_RUN))] if watches is None else watches
    check_kv(kv, history, findings)
    check_watches(logs, history, UNTIL, findings)
    check_leases(kv, lease_calls() if leases is None else leases, logs, history, UNTIL, findings)
    return findings


def test_a_correct_run_passes_every_check() -> None:
    findings = run_checks()
    assert findings.failed() == [], findings.report()
    assert len(findings.by_check) >= 12


def test_members_that_disagree_fail_the_agreement() -> None:
    findings = Findings()
    other = [*EVENTS_OF_RUN[:1], EventRecord(False, replace(KA2, value=b"3"), KA1), *EVENTS_OF_RUN[2:]]
    check_agreement({"n1": History(EVENTS_OF_RUN), "n2": History(other)}, UNTIL, findings)
    assert findings.failed() == ["members agree on the history"]


def test_a_history_with_a_wrong_version_or_prev_kv_fails_its_consistency() -> None:
    wrong_version = [EVENTS_OF_RUN[0], EventRecord(False, replace(KA2, version=5), KA1), *EVENTS_OF_RUN[2:]]
    assert run_checks(wrong_version).failed()[:1] == ["the history is consistent in itself"]
    wrong_prev = [EVENTS_OF_RUN[0], EventRecord(False, KA2, None), *EVENTS_OF_RUN[2:]]
    assert "the history is consistent in itself" in run_checks(wrong_prev).failed()


def test_a_write_at_another_revision_a_stale_read_and_a_phantom_fail() -> None:
    calls = kv_calls()
    calls[0] = replace(calls[0], revision=3)
    assert "every acknowledged write is at the revision its header named" in run_checks(calls=calls).failed()
    calls = kv_calls()
    calls[2] = replace(calls[2], ops=(KeyOp("get", b"k/a", b"1"),), revision=3)
    failed = run_checks(calls=calls).failed()
    assert "every read returned the history's value at its header revision" in failed
    assert "the plain keys' history is linearizable" in failed
    calls = kv_calls()
    calls[2] = replace(calls[2], revision=2)  # answered below a write that returned before it was called
    assert "revisions respect real time" in run_checks(calls=calls).failed()
    assert "every event was written by a client or a lease's revocation" in run_checks(calls=kv_calls()[2:]).failed()


def test_a_watch_that_misses_repeats_or_splits_an_event_or_gets_prev_kv_wrong_fails() -> None:
    batches = by_revision(EVENTS_OF_RUN)
    missing = watch(batches[:1] + batches[2:])
    repeated = watch(batches[:2] + batches[1:])
    no_prev = watch([[e.without_prev() for e in b] for b in batches])  # asked for prev_kv, got none
    for log in (missing, repeated, no_prev):
        assert EVENTS in run_checks(watches=[log]).failed()
    split = watch([batches[0], batches[1][:1], batches[1][1:], *batches[2:]])
    assert run_checks(watches=[split]).failed() == [ATOMIC]
    ahead = watch(batches, progress_at=3)  # "synced to 3" before the events of 2 and 3
    assert run_checks(watches=[ahead]).failed() == [PROGRESS]


def test_a_lease_that_goes_before_its_ttl_fails() -> None:
    # The revocation (revision 5) was first seen at 20 s, in a watch response: a keep-alive called at
    # 19 s with a TTL of 2 s forbids it before 21 s.
    assert run_checks(leases=lease_calls(keepalive_at=19 * S)).failed() == [NOT_EARLY]
    gone_early = lease_calls(keepalive_at=10 * S) + [
        LeaseCall("l", "n1", "keepalive", LEASE, 11 * S, 11 * S + 1, Outcome.OK, ttl=0)]
    assert run_checks(leases=gone_early).failed() == [NOT_GONE_EARLY]
    half_revoked = EVENTS_OF_RUN[:3] + [EventRecord(True, KvRecord(b"k/a", b"", 0, 4, 0, 0), KA2),
                                        EventRecord(True, KvRecord(b"l/x", b"", 0, 4, 0, 0), LX)]
    assert REVOKED_WHOLE in run_checks(half_revoked, watches=[watch(by_revision(half_revoked))]).failed()
