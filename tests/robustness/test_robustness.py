"""Watches and leases through etcd's v3 API on three real members under SIGKILL, SIGSTOP, a
partition of the leader, a wiped member and membership changes (README.md). CI runs each scenario with one fixed seed;
RAFTKV_SEED=N replays seed N, RAFTKV_ROBUSTNESS_SEEDS=K runs K fresh seeds per scenario."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.robustness.injection import KILL, PARTITION, PAUSE, WIPE
from tests.robustness.scenario import MEMBERS, MIXED, Run, seeds

pytestmark = [pytest.mark.integration, pytest.mark.robustness]

# One seed per scenario in CI (drawn once at random, kept fixed).
CI_SEEDS = {KILL: 1017, PAUSE: 2029, PARTITION: 3041, WIPE: 4057, MIXED: 5077, MEMBERS: 6093}
RUNS = [(scenario, seed) for scenario, ci_seed in CI_SEEDS.items() for seed in seeds([ci_seed])]


@pytest.mark.parametrize(("scenario", "seed"), RUNS, ids=[f"{s}-seed={n}" for s, n in RUNS])
def test_watches_and_leases_under_faults(robustness_run: Callable[[str, int], Run], scenario: str, seed: int) -> None:
    run = robustness_run(scenario, seed)
    findings = run.execute()
    print(findings.report())
    failed = findings.failed()
    assert not failed, f"{run.tag()}\n{findings.report(only=failed)}"
