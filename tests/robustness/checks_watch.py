"""What each watch received, over all its streams, against the agreed history:

- its events are exactly the history's events in its range from its start revision through its
  last event, in order: none twice, none missing (across resumptions on other members), each as
  the history has it, with prev_kv exactly when asked for (the previous version, as the history
  holds it; none for a creation);
- all of one revision's events come in one response (no watch here asks for fragments);
- a progress notification (or a from-now watch's "created") at revision R is never followed on
  its stream by an event at or below R, and no response's header is below its own events;
- no watch is cancelled (nothing is compacted during a run), and every watch saw the run's final
  write (a put on every watched prefix at revision `until`)."""
from __future__ import annotations

from collections import defaultdict

from tests.robustness.agreed_history import Findings, History
from tests.robustness.records import EventRecord, WatchLog

EVENTS = "every watch gets the history's events in its range, from its start, once, in order, with prev_kv right"
ATOMIC = "a revision's events come in one watch response"
PROGRESS = "progress notifications are never ahead of events"
ENDED = "every watch runs to the final revision, never cancelled"
WATCH_CHECKS = (EVENTS, ATOMIC, PROGRESS, ENDED)


def check_watches(logs: list[WatchLog], history: History, until: int, findings: Findings) -> None:
    for name in WATCH_CHECKS:
        findings.ran(name)
    for log in logs:
        _events_match(log, history, findings)
        _revisions_whole(log, findings)
        _progress_behind_events(log, findings)
        _ended(log, until, findings)


def start_revision(log: WatchLog) -> int | None:
    """The first revision the watch covers: the one it asked for, or for a watch from "now" the
    revision after its first "created" header (None: never created)."""
    if log.spec.start_revision:
        return log.spec.start_revision
    for response in log.responses:
        if response.created and log.starts[response.stream] == 0:
            return response.revision + 1
    return None


def received_events(log: WatchLog) -> list[EventRecord]:
    return [event for response in log.responses for event in response.events]


def _events_match(log: WatchLog, history: History, findings: Findings) -> None:
    got = received_events(log)
    start = start_revision(log)
    if not got or start is None:
        return
    spec = log.spec
    expected = [e if spec.prev_kv else e.without_prev()
                for e in history.events_between(start, got[-1].revision) if spec.covers(e.kv.key)]
    if got == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    def show(events: list[EventRecord]) -> str:
        return "; ".join(_describe(e) for e in events[max(0, at - 1):at + 2]) or "nothing"
    findings.add(EVENTS, f"{spec.name} (from {start}, prev_kv={spec.prev_kv}, streams on {log.members}, "
                         f"from {log.starts}): event {at} of {len(got)} received: {show(got)}; "
                         f"the history: {show(expected)}")


def _describe(event: EventRecord) -> str:
    what = "delete" if event.deleted else f"put {event.kv.value!r} v{event.kv.version}"
    prev = "" if event.prev is None else f" prev {event.prev.value!r}@{event.prev.mod_revision}"
    return f"r{event.revision} {event.kv.key!r} {what}{prev}"


def _revisions_whole(log: WatchLog, findings: Findings) -> None:
    responses_of: dict[int, set[int]] = defaultdict(set)
    for i, response in enumerate(log.responses):
        if response.fragment:
            findings.add(ATOMIC, f"{log.spec.name}: a fragment, which no watch asked for, at revision {response.revision}")
        for event in response.events:
            responses_of[event.revision].add(i)
    for revision, responses in sorted(responses_of.items()):
        if len(responses) > 1:
            findings.add(ATOMIC, f"{log.spec.name}: revision {revision}'s events came in {len(responses)} responses")


def _progress_behind_events(log: WatchLog, findings: Findings) -> None:
    synced: dict[int, tuple[int, str]] = {}  # by stream: the highest revision declared delivered, and how
    for response in log.responses:
        stream = response.stream
        for event in response.events:
            declared = synced.get(stream)
            if declared is not None and event.revision <= declared[0]:
                findings.add(PROGRESS, f"{log.spec.name} on {response.member}: event at revision {event.revision} "
                                       f"after {declared[1]} at revision {declared[0]}")
                synced.pop(stream)  # one report per notification
            if event.revision > response.revision:
                findings.add(PROGRESS, f"{log.spec.name} on {response.member}: an event at revision {event.revision} "
                                       f"in a response whose header says {response.revision}")
        if response.is_progress:
            synced[stream] = max(synced.get(stream, (0, "")), (response.revision, "a progress notification"))
        elif response.created and log.starts[stream] == 0:
            synced[stream] = (response.revision, "\"created\" of a watch from the next revision")


def _ended(log: WatchLog, until: int, findings: Findings) -> None:
    for response in log.responses:
        if response.canceled:
            findings.add(ENDED, f"{log.spec.name} cancelled on {response.member} "
                                f"(compact_revision {response.compact_revision})")
    events = received_events(log)
    if not log.finished or not events or events[-1].revision < until:
        last = events[-1].revision if events else None
        findings.add(ENDED, f"{log.spec.name} never saw the final write at revision {until} (last event: {last}; "
                            f"streams on {log.members}, ended: {log.breaks})")
