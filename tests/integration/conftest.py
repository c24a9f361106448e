"""Fixtures that start real node processes."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import Cluster


@pytest.fixture
def make_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """make_cluster(size=3, extra_args=...) -> a started Cluster; everything is killed at teardown,
    and the nodes' log tails are printed when the test failed."""
    clusters: list[Cluster] = []

    def make(size: int = 3, extra_args: tuple[str, ...] | None = None, start: bool = True) -> Cluster:
        base = tmp_path / f"cluster{len(clusters)}"
        cluster = Cluster(base, size) if extra_args is None else Cluster(base, size, tuple(extra_args))
        clusters.append(cluster)
        return cluster.start() if start else cluster

    yield make
    report = getattr(request.node, "report_call", None)
    for cluster in clusters:
        if report is not None and report.failed:
            print(cluster.log_tails())
        cluster.close()


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    """Three members with a leader elected."""
    cluster = make_cluster(3)
    cluster.wait_for_leader()
    return cluster
