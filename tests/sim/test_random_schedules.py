"""Thousands of random fault schedules over 3 and 5 nodes, each checked for Raft's safety properties
after every step and for liveness once the faults stop.

Seeds: even seeds run 3 nodes, odd seeds 5, so a seed alone names a schedule.
  RAFTKV_SEED=S                 replay schedule S only
  RAFTKV_SIM_SCHEDULES=N        schedules per cluster size in CI (default 1000)
  RAFTKV_SOAK=1                 long soak (RAFTKV_SOAK_SCHEDULES, default 20000, from a random base seed)"""
from __future__ import annotations

import os
import random
import time

import pytest

from tests.sim.schedules import ScheduleFailure, run_schedule

CI_SCHEDULES = int(os.environ.get("RAFTKV_SIM_SCHEDULES", "1000"))


def _run(seeds: range | list[int], label: str) -> None:
    """Run every schedule (a failure does not hide the ones after it), report throughput, then fail
    listing each failing seed with the checker that fired."""
    start = time.perf_counter()
    virtual = committed = faults = reads = 0
    failures: list[str] = []
    for seed in seeds:
        try:
            res = run_schedule(seed)
        except ScheduleFailure as e:
            failures.append(str(e).splitlines()[0])
            continue
        virtual += res.virtual_ms
        committed += res.committed
        faults += res.faults
        reads += res.reads_served
    wall = time.perf_counter() - start
    count = len(seeds)
    print(f"\n{label}: {count} schedules in {wall:.1f}s = {count / wall:.1f} schedules/s; "
          f"{virtual / 1000:.0f} virtual s, {committed} entries committed, {faults} faults, {reads} reads served; "
          f"{len(failures)} failed")
    if failures:
        shown = "\n".join(failures[:25])
        pytest.fail(f"{len(failures)} of {count} schedules failed (replay one with RAFTKV_SEED=<seed>):\n{shown}",
                    pytrace=False)


@pytest.mark.parametrize("n", [3, 5])
def test_random_schedules(n: int) -> None:
    replay = os.environ.get("RAFTKV_SEED")
    if replay is not None:
        seed = int(replay)
        if (3 if seed % 2 == 0 else 5) != n:
            return  # the other size's test replays it
        print(f"\nreplaying seed {seed}")
        print(run_schedule(seed))
        return
    first = 0 if n == 3 else 1
    _run(range(first, first + 2 * CI_SCHEDULES, 2), f"{n} nodes")


# Seeds outside the CI range that once failed: kept as regressions. (Each names a schedule of the
# simulator as it was when the seed failed; the schedules they draw now differ, and are kept as
# more seeds.)
#   9008: a TRUNCATE for an index the leader had compacted (truncate_term=0) deleted committed entries
#         from a follower's disk [durability].
#   271:  a restarted follower never learns the commit index from an idle leader [catch-up].
#   1745811089300: 119 uncommitted entries to copy one a round trip (batches of 1, one in flight,
#         delays up to 40 ms) took longer than 20 election timeouts: the bound now adds the time the
#         configuration needs to ship the longest log [catch-up, a bound too tight, not a bug].
#   1166: two members lost their disks one after the other; the only log holding the newest
#         committed entries was on the first, still rejoining, which never stood: no leader again
#         [liveness]. (Inside the CI range too; pinned for the quick tier.)
PINNED_SEEDS = [9008, 271, 1745811089300, 1166]


def test_pinned_seeds() -> None:
    _run(PINNED_SEEDS, "pinned seeds")


@pytest.mark.soak
@pytest.mark.skipif(os.environ.get("RAFTKV_SOAK") != "1", reason="soak runs with RAFTKV_SOAK=1")
def test_soak() -> None:
    count = int(os.environ.get("RAFTKV_SOAK_SCHEDULES", "20000"))
    base = random.SystemRandom().randrange(1 << 40) * 2
    print(f"\nsoak from base seed {base}")
    _run(range(base, base + count), "soak")
