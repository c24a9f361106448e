"""What KV clients saw, against the agreed history:

- every acknowledged write is the whole of the revision its answer's header named (a Txn's
  writes all in that one revision, nothing else in it);
- every event in the history was written by some client (acknowledged or not) or, for a key on a
  lease, by a revocation: nothing appears that nobody wrote;
- every acknowledged read returned the key as the history has it at the header's revision;
- revisions respect real time: a call that began after another returned was answered at a
  revision at least as high (higher, for a write);
- the plain keys' history is linearizable (tests/faults/linearizability.py, per key; a Txn's ops
  count as ops of their keys with the Txn's call and return)."""
from __future__ import annotations

import heapq
from collections.abc import Iterable

from tests.faults import history as faults_history
from tests.faults.linearizability import check as check_linearizable
from tests.robustness.agreed_history import Findings, History
from tests.robustness.records import KeyOp, KvCall, Outcome
from tests.robustness.traffic import LEASE_PREFIX, PLAIN_PREFIX

LINEARIZABILITY_BUDGET_S = 60.0


def check_kv(calls: list[KvCall], history: History, findings: Findings) -> None:
    ok = [c for c in calls if c.outcome is Outcome.OK]
    _writes_at_their_revision(ok, history, findings)
    _nothing_unwritten(calls, history, findings)
    _reads_at_their_revision(ok, history, findings)
    _revisions_in_real_time(ok, findings)
    _linearizable(calls, findings)


def _effects(call: KvCall) -> set[tuple[bytes, bool, bytes | None, int]]:
    """The events a call's writes make: (key, deleted, value, lease); a delete of nothing makes none."""
    effects = set()
    for op in call.ops:
        if op.kind == "put":
            effects.add((op.key, False, op.value, op.lease))
        elif op.kind == "delete" and op.existed:
            effects.add((op.key, True, None, 0))
    return effects


def _writes_at_their_revision(ok: list[KvCall], history: History, findings: Findings) -> None:
    check = "every acknowledged write is at the revision its header named"
    findings.ran(check)
    for call in ok:
        effects = _effects(call)
        if not effects:
            continue
        events = history.by_revision.get(call.revision, [])
        found = {(e.kv.key, e.deleted, None if e.deleted else e.kv.value, 0 if e.deleted else e.kv.lease) for e in events}
        if found != effects or len(events) != len(effects):
            findings.add(check, f"{call.client} on {call.member} at revision {call.revision}: wrote {sorted(effects)}, "
                                f"the history has {sorted(found)}")


def _nothing_unwritten(calls: list[KvCall], history: History, findings: Findings) -> None:
    check = "every event was written by a client or a lease's revocation"
    findings.ran(check)
    written = {(op.key, op.value) for c in calls if c.outcome is not Outcome.FAIL for op in c.ops if op.kind == "put"}
    deletable = {op.key for c in calls if c.outcome is not Outcome.FAIL for op in c.ops if op.kind == "delete"}
    for event in history.events:
        key = event.kv.key
        if event.deleted:
            if key not in deletable and not key.startswith(LEASE_PREFIX):
                findings.add(check, f"revision {event.revision}: {key!r} deleted, and no client deleted it")
        elif (key, event.kv.value) not in written and key not in FINAL_KEYS:
            findings.add(check, f"revision {event.revision}: {key!r} = {event.kv.value!r}, which no client wrote")


# The run's last write (scenario.py), in no client's records.
FINAL_KEYS = frozenset({PLAIN_PREFIX + b"~end", LEASE_PREFIX + b"~end"})


def _reads_at_their_revision(ok: list[KvCall], history: History, findings: Findings) -> None:
    check = "every read returned the history's value at its header revision"
    findings.ran(check)
    for call in ok:
        for op in call.ops:
            if op.kind != "get":
                continue
            version = history.value_at(op.key, call.revision)
            expected = None if version is None else version.value
            if op.value != expected:
                findings.add(check, f"{call.client} on {call.member} read {op.key!r} = {op.value!r} at revision "
                                    f"{call.revision}; the history has {expected!r}")


def _revisions_in_real_time(ok: list[KvCall], findings: Findings) -> None:
    check = "revisions respect real time"
    findings.ran(check)
    returned: list[tuple[int, int, KvCall]] = []  # (return time, revision, call), a heap
    for call in sorted(ok, key=lambda c: c.return_ns or 0):
        assert call.return_ns is not None
        heapq.heappush(returned, (call.return_ns, call.revision, call))
    highest: KvCall | None = None
    for call in sorted(ok, key=lambda c: c.call_ns):
        while returned and returned[0][0] < call.call_ns:
            _, revision, before = heapq.heappop(returned)
            if highest is None or revision > highest.revision:
                highest = before
        if highest is None:
            continue
        too_low = call.revision < highest.revision or (bool(_effects(call)) and call.revision == highest.revision)
        if too_low:
            findings.add(check, f"{call.client} on {call.member} (a {'write' if _effects(call) else 'read'}) answered at "
                                f"revision {call.revision}, after {highest.client} on {highest.member} returned at "
                                f"revision {highest.revision}")


def _linearizable(calls: list[KvCall], findings: Findings) -> None:
    check = "the plain keys' history is linearizable"
    findings.ran(check)
    result = check_linearizable(_as_fault_ops(calls), LINEARIZABILITY_BUDGET_S)
    if not result.ok:
        findings.add(check, result.report())


def _as_fault_ops(calls: Iterable[KvCall]) -> list[faults_history.Op]:
    outcomes = {Outcome.OK: faults_history.Outcome.OK, Outcome.FAIL: faults_history.Outcome.FAIL,
                Outcome.UNKNOWN: faults_history.Outcome.UNKNOWN}
    kinds = {"put": faults_history.Kind.PUT, "get": faults_history.Kind.GET, "delete": faults_history.Kind.DELETE}
    ops = []
    for call in calls:
        for op in call.ops:
            if not op.key.startswith(PLAIN_PREFIX) or op.key in FINAL_KEYS:
                continue
            ops.append(_fault_op(call, op, kinds[op.kind], outcomes[call.outcome]))
    return ops


def _fault_op(call: KvCall, op: KeyOp, kind: faults_history.Kind, outcome: faults_history.Outcome) -> faults_history.Op:
    return faults_history.Op(f"{call.client}", kind, op.key, call.call_ns, call.return_ns, outcome,
                             value=op.value, existed=op.existed, error=call.error or None)
