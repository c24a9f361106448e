"""The data source against a cluster with TLS and --client-cert-auth: the options cacert, cert and
key reach every connection, the executors' included; without them the job fails with the TLS hint."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kv import TLS, Client
from kv.tools.certs import DEFAULT_HOSTS, ensure_ca, issue
from raft.node.config import Security, TLSFiles
from tests.spark.cluster import InProcessCluster

ROWS = 2_000


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    ensure_ca(directory)
    for member in ("n1", "n2", "n3"):
        issue(directory, member, DEFAULT_HOSTS, server=True)
    issue(directory, "spark", server=False)
    return directory


@pytest.fixture(scope="module")
def tls_cluster(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    logging.getLogger("raft").setLevel(logging.WARNING)

    def security(member: str) -> Security:
        return Security(client=TLSFiles(certs / f"{member}.pem", certs / f"{member}-key.pem", certs / "ca.pem",
                                        client_cert_auth=True))

    running = InProcessCluster(Path(tmp_path_factory.mktemp("cluster")), security=security)
    yield running
    running.close()


def test_write_and_read_with_the_tls_options(tls_cluster: InProcessCluster, certs: Path, spark: SparkSession) -> None:
    tls = {"cacert": str(certs / "ca.pem"), "cert": str(certs / "spark.pem"), "key": str(certs / "spark-key.pem")}
    rows = spark.range(0, ROWS, 1, 2).selectExpr("format_string('tls/%06d', id) AS key",
                                                 "cast(concat('v', id) AS binary) AS value")
    rows.write.format("raftkv").option("endpoints", tls_cluster.endpoints).options(**tls) \
        .option("atomic", "true").mode("append").save()

    df = (spark.read.format("raftkv").option("endpoints", tls_cluster.endpoints).options(**tls)
          .option("prefix", "tls/").option("partitions", 2).load())
    assert df.count() == ROWS
    with Client(tls_cluster.endpoints, tls=TLS(certs / "ca.pem", certs / "spark.pem", certs / "spark-key.pem")) as c:
        assert c.get("tls/000042") == b"v42"


def test_a_read_without_the_tls_options_fails_with_the_hint(tls_cluster: InProcessCluster,
                                                            spark: SparkSession) -> None:
    df = (spark.read.format("raftkv").option("endpoints", tls_cluster.endpoints).option("timeout", "3")
          .option("prefix", "tls/").load())
    with pytest.raises(Exception, match="TLS: "):
        df.count()
