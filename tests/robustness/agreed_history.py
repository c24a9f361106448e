"""The history of the store: every event from revision 1, as a watch from revision 1 on each member
delivered it. The members must agree on it event for event; the history must also be consistent
in itself (revisions without gaps, versions and create revisions that follow from the previous
version, prev_kv that is the previous version). The checks judge what the clients saw against it."""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from tests.robustness.records import EventRecord, KvRecord, WatchLog

# Violations shown per check; the count says how many there were.
SHOWN = 8


@dataclass
class Findings:
    """Violations by check name."""

    by_check: dict[str, list[str]] = field(default_factory=dict)

    def add(self, check: str, violation: str) -> None:
        self.by_check.setdefault(check, []).append(violation)

    def ran(self, check: str) -> None:
        self.by_check.setdefault(check, [])

    def failed(self) -> list[str]:
        return [name for name, found in self.by_check.items() if found]

    def report(self, only: list[str] | None = None) -> str:
        lines = []
        for name, found in self.by_check.items():
            if only is not None and name not in only:
                continue
            lines.append(f"{name}: {'ok' if not found else f'{len(found)} violation(s)'}")
            lines += [f"    {v}" for v in found[:SHOWN]]
        return "\n".join(lines)


@dataclass
class History:
    events: list[EventRecord]
    by_revision: dict[int, list[EventRecord]] = field(default_factory=dict)
    _versions: dict[bytes, list[EventRecord]] = field(default_factory=dict)  # per key, in revision order
    _revisions: dict[bytes, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by_revision: dict[int, list[EventRecord]] = defaultdict(list)
        versions: dict[bytes, list[EventRecord]] = defaultdict(list)
        for event in self.events:
            by_revision[event.revision].append(event)
            versions[event.kv.key].append(event)
        self.by_revision = dict(by_revision)
        self._versions = dict(versions)
        self._revisions = {key: [e.revision for e in events] for key, events in versions.items()}

    @property
    def last_revision(self) -> int:
        return self.events[-1].revision if self.events else 0

    def keys(self) -> list[bytes]:
        return sorted(self._versions)

    def event_at(self, key: bytes, revision: int) -> EventRecord | None:
        """The key's last event at or before `revision`."""
        revisions = self._revisions.get(key, [])
        at = bisect.bisect_right(revisions, revision)
        return self._versions[key][at - 1] if at else None

    def value_at(self, key: bytes, revision: int) -> KvRecord | None:
        """The key's version at `revision` (None: absent)."""
        event = self.event_at(key, revision)
        return None if event is None or event.deleted else event.kv

    def events_between(self, first: int, last: int) -> list[EventRecord]:
        """Every event of revisions first..last, in order."""
        return [e for r in range(first, last + 1) for e in self.by_revision.get(r, [])]


def history_of(log: WatchLog) -> History:
    return History([event for response in log.responses for event in response.events])


def check_agreement(histories: dict[str, History], until: int, findings: Findings) -> None:
    """Every member delivered the same events, with the same previous versions, through `until`."""
    check = "members agree on the history"
    findings.ran(check)
    (first_member, reference), *others = histories.items()
    for member, history in others:
        mine, theirs = reference.events_between(1, until), history.events_between(1, until)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                findings.add(check, f"event {i}: {first_member} has {a}, {member} has {b}")
                break
        else:
            if len(mine) != len(theirs):
                findings.add(check, f"{first_member} has {len(mine)} events through revision {until}, "
                                    f"{member} {len(theirs)}")


def check_consistency(history: History, until: int, findings: Findings) -> None:
    """The history follows from itself: revisions increase one by one with no revision empty, in
    each revision a key changes once, a put's version and create revision follow from the key's
    previous version, a deletion deletes a key that exists, and prev_kv is the previous version."""
    check = "the history is consistent in itself"
    findings.ran(check)
    revisions = sorted(history.by_revision)
    if revisions and revisions != list(range(revisions[0], until + 1)):
        missing = sorted(set(range(revisions[0], until + 1)) - set(revisions))
        findings.add(check, f"revisions without events: {missing[:10]}")
    state: dict[bytes, KvRecord] = {}
    for revision in revisions:
        events = history.by_revision[revision]
        keys = [e.kv.key for e in events]
        if len(set(keys)) != len(keys):
            findings.add(check, f"revision {revision} changes a key twice: {keys}")
        for event in events:
            before = state.get(event.kv.key)
            problem = _event_problem(event, before)
            if problem:
                findings.add(check, f"revision {revision} {event.kv.key!r}: {problem}")
            if event.deleted:
                state.pop(event.kv.key, None)
            else:
                state[event.kv.key] = event.kv


def _event_problem(event: EventRecord, before: KvRecord | None) -> str:
    kv = event.kv
    if event.deleted:
        if before is None:
            return "a deletion of a key that does not exist"
        return "" if event.prev == before else f"prev_kv {event.prev} is not the previous version {before}"
    if before is None:
        if (kv.create_revision, kv.version) != (kv.mod_revision, 1):
            return f"a creation with create_revision {kv.create_revision}, version {kv.version}"
        return "" if event.prev is None else f"a creation with prev_kv {event.prev}"
    if (kv.create_revision, kv.version) != (before.create_revision, before.version + 1):
        return f"version {kv.version} / create_revision {kv.create_revision} after {before}"
    return "" if event.prev == before else f"prev_kv {event.prev} is not the previous version {before}"
