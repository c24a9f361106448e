"""Leases, against the agreed history and the clients' clocks.

No client deletes a key on a lease (traffic.py), so each deletion of one is a revocation. Then:
- a revocation is a revision of its own that deletes every key of one lease and nothing else;
- a lease goes no earlier than its TTL after the later of its grant and its last acknowledged
  keep-alive: the first moment any client learnt of the revocation's revision (an answer or a
  watch response whose header reached it) comes at least TTL after the call of the last keep-alive
  answered with a TTL before that moment. A leader renews a lease between a keep-alive's call and
  its answer, and a new leader gives every lease its whole TTL again, so this bound holds however
  leadership moved; it covers kept-alive leases (their keys never vanish while kept alive) and
  abandoned ones alike. A keep-alive answered "no such lease" (TTL 0) is held to the same bound
  (a check of its own: a client told so gives its lease up, as etcd's clients do);
- every lease's keys are gone by the end of the run (the traffic abandons every lease it holds
  when it stops, and the run waits for them to expire).
Times are CLOCK_MONOTONIC, which the members' lease deadlines count on too."""
from __future__ import annotations

import bisect
from collections import defaultdict

from tests.robustness.agreed_history import Findings, History
from tests.robustness.records import KvCall, LeaseCall, Outcome, WatchLog
from tests.robustness.checks_kv import FINAL_KEYS
from tests.robustness.traffic import LEASE_PREFIX

REVOKED_WHOLE = "a lease's revocation deletes all its keys in one revision of their own"
NOT_EARLY = "no lease goes before its TTL after its last acknowledged keep-alive"
NOT_GONE_EARLY = "no keep-alive answers TTL 0 (no such lease) before the lease's TTL has run"
GONE = "every lease's keys are gone once it has expired"
LEASE_CHECKS = (REVOKED_WHOLE, NOT_EARLY, NOT_GONE_EARLY, GONE)


class FirstSeen:
    """When a revision first became known to any client: the earliest answer or watch response
    whose header revision was at least it."""

    def __init__(self, kv: list[KvCall], leases: list[LeaseCall], watches: list[WatchLog]) -> None:
        seen: list[tuple[int, int]] = [(c.revision, c.return_ns) for c in kv
                                       if c.outcome is Outcome.OK and c.return_ns is not None]
        seen += [(c.revision, c.return_ns) for c in leases if c.outcome is Outcome.OK and c.return_ns is not None]
        seen += [(r.revision, r.received_ns) for w in watches for r in w.responses]
        seen.sort()
        self._revisions = [revision for revision, _ in seen]
        # earliest[i]: the earliest time of seen[i:], revisions at least seen[i]'s
        self._earliest = [0] * len(seen)
        low = None
        for i in range(len(seen) - 1, -1, -1):
            low = seen[i][1] if low is None else min(low, seen[i][1])
            self._earliest[i] = low

    def at(self, revision: int) -> int | None:
        i = bisect.bisect_left(self._revisions, revision)
        return self._earliest[i] if i < len(self._earliest) else None


def check_leases(kv: list[KvCall], leases: list[LeaseCall], watches: list[WatchLog], history: History,
                 until: int, findings: Findings) -> None:
    for name in LEASE_CHECKS:
        findings.ran(name)
    revocations = _revocations(history, until, findings)
    first_seen = FirstSeen(kv, leases, watches)
    calls = defaultdict(list)
    for call in leases:
        calls[call.lease].append(call)
    for lease, revision in revocations.items():
        seen = first_seen.at(revision)
        if seen is None:
            continue
        _not_early(lease, calls[lease], seen, f"its keys deleted at revision {revision}", NOT_EARLY, findings)
    for lease, lease_calls in calls.items():
        for call in lease_calls:
            if call.kind == "keepalive" and call.outcome is Outcome.OK and call.ttl == 0 and call.return_ns:
                _not_early(lease, lease_calls, call.return_ns,
                           f"a keep-alive by {call.client} via {call.member} answered TTL 0", NOT_GONE_EARLY, findings)


def _not_early(lease: int, calls: list[LeaseCall], gone_ns: int, how: str, check: str, findings: Findings) -> None:
    """The lease was gone by `gone_ns`: not earlier than its TTL after its grant or last renewal."""
    grants = [c for c in calls if c.kind == "grant" and c.outcome is Outcome.OK]
    if not grants:
        return  # granted with an unknown outcome: no TTL known (no client puts keys on such a lease)
    renewals = [c for c in calls if c.outcome is Outcome.OK and c.ttl > 0 and c.call_ns < gone_ns]
    last = max(renewals, key=lambda c: c.call_ns, default=grants[0])
    ttl_ns = int(last.ttl * 1e9)
    if gone_ns < last.call_ns + ttl_ns:
        early_ms = (last.call_ns + ttl_ns - gone_ns) / 1e6
        findings.add(check, f"lease {lease:x} (TTL {last.ttl} s): {how}, known {early_ms:.0f} ms before its TTL "
                                f"had run from the {last.kind} called by {last.client} via {last.member} "
                                f"({(gone_ns - last.call_ns) / 1e6:.0f} ms after that call)")


def _revocations(history: History, until: int, findings: Findings) -> dict[int, int]:
    """The revision at which each lease's keys were deleted, checked whole; by lease."""
    alive: dict[int, set[bytes]] = defaultdict(set)  # lease -> its keys alive
    lease_of: dict[bytes, int] = {}
    revoked: dict[int, int] = {}
    for revision in sorted(history.by_revision):
        if revision > until:
            break
        events = history.by_revision[revision]
        deleted = [e.kv.key for e in events if e.deleted and e.kv.key.startswith(LEASE_PREFIX)]
        if deleted:
            leases = {lease_of.get(key, 0) for key in deleted}
            lease = min(leases)
            if len(leases) != 1 or len(events) != len(deleted) or set(deleted) != alive[lease]:
                findings.add(REVOKED_WHOLE, f"revision {revision} deletes {sorted(deleted)} of leases "
                                            f"{sorted(f'{x:x}' for x in leases)}; alive on them: "
                                            f"{sorted(k for x in leases for k in alive[x])}; "
                                            f"{len(events) - len(deleted)} other events")
            revoked.setdefault(lease, revision)
            for key in deleted:
                alive[lease_of.pop(key, 0)].discard(key)
        for event in events:
            if not event.deleted and event.kv.lease:
                previous = lease_of.get(event.kv.key)
                if previous is not None:
                    alive[previous].discard(event.kv.key)
                lease_of[event.kv.key] = event.kv.lease
                alive[event.kv.lease].add(event.kv.key)
    left = sorted(key for keys in alive.values() for key in keys if key not in FINAL_KEYS)
    if left:
        findings.add(GONE, f"keys on leases still there at revision {until}: {left[:10]}")
    return revoked
