"""The `slow` marker: what `python -m pytest -m "not slow"` leaves out for a quick edit-test loop
(under 2 minutes on 2 cores; the whole suite takes about 20). Plain `python -m pytest`, what CI
runs, still runs everything.

Slow: every test that starts node processes or a Spark session (tests/integration, tests/faults,
tests/robustness, tests/spark, the bench's smoke runs) and the thousands of random schedules of the simulation. The
unit tests and the simulation's named scenarios, checkers and pinned seeds stay in the quick tier."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
SLOW_DIRECTORIES = {"integration", "faults", "robustness", "spark"}
# Files outside those directories whose tests start node processes: the bench's smoke runs.
SLOW_FILES = {"unit/test_bench_smoke.py"}
# (file under tests/, test function) outside those directories.
SLOW_TESTS = {("sim/test_random_schedules.py", "test_random_schedules")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            where = item.path.relative_to(TESTS)
        except ValueError:  # not under tests/
            continue
        if where.parts[0] in SLOW_DIRECTORIES or where.as_posix() in SLOW_FILES \
                or (where.as_posix(), getattr(item, "originalname", None)) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    # Keep each phase's report on the item (item.report_call, ...): a fixture's teardown that prints
    # the members' logs does so only when the test failed.
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)
