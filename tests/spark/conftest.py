"""One SparkSession for every Spark test (local[2,3]: two threads, and a failed task is retried up
to 3 times), and one in-process three-node cluster with the Export service per module."""
from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.cluster import InProcessCluster

import pyspark  # noqa: E402,F401 - CI installs it: the Spark tests must run, not skip
from pyspark.sql import SparkSession  # noqa: E402

import kv.tools.spark  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder.master("local[2,3]").appName("raftkv-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               # The workers run this interpreter (with this checkout's raftkv), not the python3 on PATH.
               .config("spark.pyspark.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    kv.tools.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    logging.getLogger("raft").setLevel(logging.WARNING)
    running = InProcessCluster(Path(tmp_path_factory.mktemp("cluster")))
    yield running
    running.close()
