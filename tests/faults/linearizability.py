"""A linearizability checker for the key-value model: Wing & Gong's search with Lowe's
just-in-time linearization and memoisation, per key, as Porcupine does.

Each key is an independent register (value or absent), so the history splits by key and each
part is searched alone: exponential in the concurrency of one key, not of the whole history.

The search walks a linked list of call and return events in time order. At a call it tries to
linearize that op now (the model accepts it, and the pair (set of linearized ops, state) was
not seen before); then it restarts from the head. At a return whose op is not linearized yet, the
choices made so far cannot work: it backtracks. The memo of (bitset, state) pairs is what keeps
this from being factorial: two search paths that linearized the same ops into the same state
have the same future.

Outcomes: failed ops and reads that did not complete are dropped (they had no effect). An
unknown write gets a return time of +infinity: it may be linearized anywhere after its call,
and "never" is the same as "after everything else" since nothing observes it then. Unknown
writes with the same effect are linearized in call order only (_symmetry_order).

A check that runs out of its time budget is a failure, never a pass.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from tests.faults.history import History, Kind, Op, Outcome

DEFAULT_BUDGET_S = 60.0
# How often (in search steps) the deadline is looked at: time.monotonic() is cheap but not free.
DEADLINE_CHECK_EVERY = 2048
# Ops shown around the point where a failed search got stuck.
REPORT_OPS = 12



class _Unseen:
    """The value of an unknown put that no read returned: present, but equal to nothing read.
    Such puts are told apart by nothing, so they share this one value (see _symmetry_order)."""

    def __repr__(self) -> str:
        return "<a value no read returned>"


UNSEEN = _Unseen()
State = bytes | None | _Unseen


class Verdict(str, Enum):
    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not linearizable"
    TIMEOUT = "timed out"


@dataclass(slots=True)
class KeyResult:
    key: bytes
    verdict: Verdict
    ops: int
    steps: int
    detail: str = ""


@dataclass(slots=True)
class CheckResult:
    verdict: Verdict
    keys: list[KeyResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.LINEARIZABLE

    @property
    def failures(self) -> list[KeyResult]:
        return [k for k in self.keys if k.verdict is not Verdict.LINEARIZABLE]

    def report(self) -> str:
        ops = sum(k.ops for k in self.keys)
        head = f"{self.verdict.value}: {ops} ops on {len(self.keys)} keys checked in {self.elapsed_s:.2f}s"
        return "\n".join([head, *(f"key {k.key!r}: {k.verdict.value} ({k.ops} ops)\n{k.detail}" for k in self.failures)])


def check(history: Iterable[Op], budget_s: float = DEFAULT_BUDGET_S) -> CheckResult:
    """Is the history linearizable? Keys are checked one after another within one time budget;
    the first failing key ends the check."""
    started = time.monotonic()
    deadline = started + budget_s
    result = CheckResult(Verdict.LINEARIZABLE)
    for key, ops in sorted(partition_by_key(prepare(history)).items()):
        key_result = check_key(key, ops, deadline)
        result.keys.append(key_result)
        if key_result.verdict is not Verdict.LINEARIZABLE:
            result.verdict = key_result.verdict
            break
    result.elapsed_s = time.monotonic() - started
    return result


def prepare(history: Iterable[Op]) -> list[Op]:
    """The ops that matter to the search. Dropped: failed ops, reads without an answer, and
    unknown puts of a value no read returned on a key no delete found present. Linearizing such a
    put "never" is then as good as anywhere else (no read or delete can tell it happened), so
    keeping it would only widen the search."""
    ops = [op for op in history if op.outcome is not Outcome.FAIL
           and not (op.kind is Kind.GET and op.outcome is not Outcome.OK)]
    seen = {(op.key, op.value) for op in ops if op.kind is Kind.GET and op.value is not None}
    # A delete that found the key observes that some put happened, whichever it was.
    found = {op.key for op in ops if op.kind is Kind.DELETE and op.outcome is Outcome.OK and op.existed}
    return [op for op in ops
            if not (op.kind is Kind.PUT and op.outcome is Outcome.UNKNOWN
                    and (op.key, op.value) not in seen and op.key not in found)]


def partition_by_key(ops: Iterable[Op]) -> dict[bytes, list[Op]]:
    parts: dict[bytes, list[Op]] = defaultdict(list)
    for op in ops:
        parts[op.key].append(op)
    return parts


def step(state: State, op: Op, written: State) -> tuple[bool, State]:
    """The register model: may `op` happen in `state`, and what state follows? `written` is
    what a put stores (its value, or UNSEEN)."""
    if op.kind is Kind.PUT:
        return True, written
    if op.kind is Kind.GET:
        return op.value == state, state
    return (op.outcome is not Outcome.OK or op.existed == (state is not None)), None


def _written(ops: list[Op]) -> list[State]:
    """What each put stores in the model (None for other ops)."""
    read = {op.value for op in ops if op.kind is Kind.GET and op.value is not None}
    return [(UNSEEN if op.outcome is Outcome.UNKNOWN and op.value not in read else op.value)
            if op.kind is Kind.PUT else None for op in ops]


@dataclass(slots=True)
class _Events:
    """The doubly linked list of call / return events. Node 0 is the head sentinel; node 2i+1 is
    op i's call, 2i+2 its return. -1 ends the list."""

    prev: list[int]
    next: list[int]

    @classmethod
    def build(cls, ops: list[Op]) -> _Events:
        never = float("inf")
        events = []
        for i, op in enumerate(ops):
            events.append((op.call_ns, 0, 2 * i + 1))
            # A return at the same instant as a call is not before it: calls sort first, so the
            # two ops count as concurrent (the weaker, never falsely failing, reading).
            events.append((op.return_ns if op.return_ns is not None else never, 1, 2 * i + 2))
        events.sort()
        order = [0] + [node for _, _, node in events]
        prev = [-1] * len(order)
        nxt = [-1] * len(order)
        for a, b in zip(order, order[1:]):
            nxt[a], prev[b] = b, a
        return cls(prev, nxt)

    def lift(self, call: int) -> None:
        """Take op's call and return out of the list (their own links stay, for unlift)."""
        for node in (call, call + 1):
            p, n = self.prev[node], self.next[node]
            self.next[p] = n
            if n != -1:
                self.prev[n] = p

    def unlift(self, call: int) -> None:
        for node in (call + 1, call):  # reverse order of lift
            p, n = self.prev[node], self.next[node]
            self.next[p] = node
            if n != -1:
                self.prev[n] = node


def check_key(key: bytes, ops: list[Op], deadline: float) -> KeyResult:
    events = _Events.build(ops)
    written = _written(ops)
    after = _symmetry_order(ops, written)
    # The search is done when every op with a known outcome is linearized: unknown ones left
    # over are linearized "never" (equivalently, at the end).
    known_left = sum(1 for op in ops if op.outcome is Outcome.OK)
    state: State = None
    linearized = 0
    stack: list[tuple[int, State]] = []
    seen: set[tuple[int, State]] = set()
    best = (0, 0, state)  # (depth, bitset, state) of the deepest point reached, for the report
    steps = 0
    node = events.next[0]
    while known_left > 0:
        steps += 1
        if steps % DEADLINE_CHECK_EVERY == 0 and time.monotonic() > deadline:
            return KeyResult(key, Verdict.TIMEOUT, len(ops), steps,
                             f"the time budget ran out after {steps} search steps; "
                             f"deepest point:\n{_stuck_report(ops, best)}")
        if node % 2 == 1:  # a call: try to linearize its op here
            i = node // 2
            first = after[i]
            if first != -1 and not linearized >> first & 1:
                accepted, new_state = False, state
            else:
                accepted, new_state = step(state, ops[i], written[i])
            if accepted:
                new_linearized = linearized | (1 << i)
                memo = (new_linearized, new_state)
                if memo not in seen:
                    seen.add(memo)
                    stack.append((node, state))
                    state, linearized = new_state, new_linearized
                    known_left -= ops[i].outcome is Outcome.OK
                    if len(stack) > best[0]:
                        best = (len(stack), linearized, state)
                    events.lift(node)
                    node = events.next[0]
                    continue
            node = events.next[node]
        else:  # the return of an op not linearized yet: undo the last choice
            if not stack:
                return KeyResult(key, Verdict.NOT_LINEARIZABLE, len(ops), steps, _stuck_report(ops, best))
            node, state = stack.pop()
            i = node // 2
            linearized &= ~(1 << i)
            known_left += ops[i].outcome is Outcome.OK
            events.unlift(node)
            node = events.next[node]
    return KeyResult(key, Verdict.LINEARIZABLE, len(ops), steps)


def _symmetry_order(ops: list[Op], written: list[State]) -> list[int]:
    """For each op, the op that must be linearized before it (-1: none).

    Unknown deletes of one key are interchangeable: same effect, no output, no deadline; so are
    unknown puts that store the same value (UNSEEN, or one value: the attempts of an etcd write
    retried on another member all carry its value). If a linearization uses a later-called op of
    such a class at some point, the earliest-called unused one can take its place (its call came
    even sooner), so it suffices to linearize each class in call order. Without this the search
    tells apart every subset of them - exponential in their number: a node answering "not leader"
    to a pinned client produces hundreds, and an etcd write retried through an election dozens."""
    after = [-1] * len(ops)
    previous: dict[tuple[Kind, State], int] = {}
    for i in sorted(range(len(ops)), key=lambda i: ops[i].call_ns):
        op = ops[i]
        if op.outcome is Outcome.UNKNOWN and op.kind is not Kind.GET:
            cls = (op.kind, written[i] if op.kind is Kind.PUT else None)
            after[i], previous[cls] = previous.get(cls, -1), i
    return after


def _stuck_report(ops: list[Op], best: tuple[int, int, State]) -> str:
    """Where the deepest search path got stuck: its state, the last ops it linearized, and the
    ops it could not place next (those whose call came before the first pending return)."""
    depth, bitset, state = best
    done = sorted((op for i, op in enumerate(ops) if bitset >> i & 1), key=lambda op: op.call_ns)
    pending = sorted((op for i, op in enumerate(ops) if not bitset >> i & 1), key=lambda op: op.call_ns)
    first_return = min((op.return_ns for op in pending if op.return_ns is not None), default=None)
    candidates = [op for op in pending if first_return is None or op.call_ns <= first_return]
    lines = [f"  linearized {depth} of {len(ops)} ops; the value then: {state!r}", "  last linearized (by call time):"]
    lines += [f"    {op.describe()}" for op in done[-REPORT_OPS:]]
    lines.append("  none of these fits next:")
    lines += [f"    {op.describe()}" for op in candidates[:REPORT_OPS]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """python -m tests.faults.linearizability HISTORY.jsonl [BUDGET_S]: check a saved history."""
    result = check(History.load(argv[0]).ops(), float(argv[1]) if len(argv) > 1 else DEFAULT_BUDGET_S)
    print(result.report())
    return 0 if result.ok else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
