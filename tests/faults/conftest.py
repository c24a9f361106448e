"""Fixtures of the fault suite: `scenario(size=..., extra_args=..., client_proxies=..., down_close=..., tls=..., api=...)`
makes a proxied cluster (with `tls`, TLS on every link: the members speak mutual TLS to each other
through the proxies, and their clients present certificates; with `api="etcd"`, the load, probes and
final reads speak etcd's v3 API), starts it and waits for a leader; teardown kills everything, and when the test failed
prints the seed, the nodes' log tails and where the full logs are."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.cluster import FaultCluster
from tests.faults.proxy import DownClose
from tests.faults.scenario import NATIVE, Scenario, seeds
from tests.integration.cluster import FAST_TIMING
from tests.integration.peer_tls import use_tls


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: process-level fault scenarios with a linearizability check")



@pytest.fixture(params=seeds(), ids=lambda seed: f"seed={seed}")
def seed(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture
def scenario(tmp_path: Path, seed: int, request: pytest.FixtureRequest) -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(size: int = 5, extra_args: tuple[str, ...] = FAST_TIMING, wait_leader: bool = True,
             client_proxies: bool = False, down_close: DownClose = DownClose.RESET,
             tls: bool = False, api: str = NATIVE) -> Scenario:
        name = request.node.name
        print(f"{name}: seed {seed} (replay: RAFTKV_SEED={seed})")
        cluster = FaultCluster(tmp_path / f"cluster{len(made)}", size, tuple(extra_args), seed=seed,
                               client_proxies=client_proxies, down_close=down_close)
        if tls:
            use_tls(cluster, tmp_path / f"certs{len(made)}")
        run = Scenario(name, seed, cluster, random.Random(seed), api=api)
        made.append(run)
        cluster.start()
        if wait_leader:
            cluster.wait_for_leader()
        return run

    yield make
    report = getattr(request.node, "report_call", None)
    for run in made:
        try:
            for workload in run.workloads:
                workload.stop_event.set()
            if report is not None and report.failed:
                print(f"{run.tag()} logs in {run.cluster.base_dir}\n{run.cluster.log_tails()}")
        finally:
            run.cluster.close()
