"""The checkers bite: a driver that breaks the durability rules, or hand-made histories that break
Raft's properties, must be caught. (Without this, a green simulator could be checking nothing.)"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from raft.core import Entry, MemoryLogStore
from tests.sim.checkers import SafetyChecker, SimViolation
from tests.sim.disk import apply_command, empty_state
from tests.sim.node import SimNode
from tests.sim.schedules import ScheduleFailure, run_schedule


_honest_crash = SimNode.crash_now


def _lossy_crash(self: SimNode, power_loss: bool = False) -> None:
    """A disk that lies about fsync: a crash also loses the last entries the node acknowledged."""
    _honest_crash(self, power_loss)
    begin, last = self.log.before_begin()[0], self.log.last_index()
    cut = max(begin + 1, last - 2)
    if cut <= last:
        super(type(self.log), self.log).save(None, cut, [])


def test_lossy_disk_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SimNode, "crash_now", _lossy_crash)
    safety = ("[durability]", "[state machine safety]", "[leader completeness]", "[log matching]")
    caught: list[str] = []
    for seed in range(60):
        try:
            run_schedule(seed)
        except ScheduleFailure as e:
            caught.append(str(e))
            if any(k in str(e) for k in safety):
                return
    pytest.fail(f"a disk that loses acknowledged entries went unnoticed; failures seen: {caught[:3]}")


class _FakeNode:
    def __init__(self, nid: str, entries: list[Entry]) -> None:
        self.id, self.incarnation, self.applied, self.snapshot, self.core = nid, 1, 0, None, None
        self.disk = SimpleNamespace(replaced=False, fsm=SimpleNamespace(durable=({}, 0, 0)))
        self.log = MemoryLogStore()
        self.log.save(None, None, entries)


def test_conflicting_applies_are_caught() -> None:
    ch = SafetyChecker()
    a, b = _FakeNode("a", []), _FakeNode("b", [])
    sa, sb = empty_state(), empty_state()
    apply_command(sa, b"x")
    ch.on_apply(a, Entry(1, 1, payload=b"x"), sa)  # type: ignore[arg-type]
    apply_command(sb, b"y")
    with pytest.raises(SimViolation, match="state machine safety"):
        ch.on_apply(b, Entry(1, 1, payload=b"y"), sb)  # type: ignore[arg-type]


def test_log_matching_and_durability_are_caught() -> None:
    ch = SafetyChecker()
    ch.register_log("a", _FakeNode("a", [Entry(1, 1, payload=b"p"), Entry(2, 1, payload=b"q")]).log)
    with pytest.raises(SimViolation, match="log matching"):
        ch.register_log("b", _FakeNode("b", [Entry(1, 1, payload=b"p"), Entry(2, 1, payload=b"other")]).log)
    ch2 = SafetyChecker()
    nodes = [_FakeNode(n, [Entry(1, 1, payload=b"p")]) for n in "abc"]
    ch2.on_apply(nodes[0], Entry(1, 1, payload=b"p"), empty_state())  # type: ignore[arg-type]
    for n in nodes[:2]:
        n.log.save(None, 1, [])
    with pytest.raises(SimViolation, match="durability"):
        ch2.check_durability(nodes)  # type: ignore[arg-type]
