"""The robustness suite's fixture: `robustness_run(scenario, seed)` starts three members behind the
fault proxies (tests/faults/cluster.py) and gives the Run; teardown kills everything and, when the
test failed, prints the seed, the members' log tails and where the full logs and records are."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.cluster import FaultCluster
from tests.integration.cluster import FAST_TIMING
from tests.robustness.scenario import RECORDS_FILE, Run

MEMBERS = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "robustness: watches and leases through etcd's API under process faults")



@pytest.fixture
def robustness_run(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[str, int], Run]]:
    made: list[Run] = []

    def make(scenario: str, seed: int) -> Run:
        cluster = FaultCluster(tmp_path / "cluster", MEMBERS, FAST_TIMING, seed=seed)
        run = Run(scenario, seed, cluster)
        made.append(run)
        print(f"{run.tag()} cluster in {cluster.base_dir}")
        cluster.start()
        return run

    yield make
    report = getattr(request.node, "report_call", None)
    for run in made:
        try:
            if report is not None and report.failed:
                print(f"{run.tag()} logs and {RECORDS_FILE} in {run.cluster.base_dir}\n{run.log_tails()}")
        finally:
            run.cluster.close()
