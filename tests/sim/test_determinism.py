"""The same seed gives the same run: the full delivered-message trace hashes the same, in this
process and in another one with a different PYTHONHASHSEED (so no set or dict-of-str order leaks
into the schedule)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.sim.schedules import run_schedule

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (2, 1)  # one 3-node and one 5-node schedule, both with busy traces


def test_same_seed_same_trace() -> None:
    for seed in SEEDS:
        a, b = run_schedule(seed), run_schedule(seed)
        assert a.delivered > 100 and a.faults > 0
        assert a.trace_hash == b.trace_hash
        assert a == b


def test_different_seeds_different_traces() -> None:
    assert run_schedule(SEEDS[0]).trace_hash != run_schedule(SEEDS[0] + 2).trace_hash


def test_same_trace_across_processes_and_hash_seeds() -> None:
    code = f"from tests.sim.schedules import run_schedule; print(run_schedule({SEEDS[1]}).trace_hash)"
    hashes = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True)
        hashes.add(out.stdout.strip())
    assert hashes == {run_schedule(SEEDS[1]).trace_hash}
