"""Clients are told members' ADVERTISED client addresses (--advertise-client), never their peer
addresses: in not-leader hints and in status. Each member here listens on 127.0.0.1:PORT and
advertises localhost:PORT - another string for the same place, so a test can tell which one a
node handed out, and a client following the hint still gets there."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import grpc
import pytest

from kv import errors
from kv.tools.cluster_up import child_env
from raftkv_proto import kv_pb2
from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration


def advertised(cluster: Cluster, node_id: str) -> str:
    return "localhost:" + cluster.nodes[node_id].address.rpartition(":")[2]


@pytest.fixture
def advertising(make_cluster) -> Cluster:
    cluster = make_cluster(3, start=False)
    for node_id, node in cluster.nodes.items():
        node.spec = dataclasses.replace(node.spec, extra_args=(*node.spec.extra_args,
                                                                "--advertise-client", advertised(cluster, node_id)))
    cluster.start()
    cluster.wait_for_leader()
    return cluster


def test_not_leader_hints_and_status_carry_the_leaders_advertised_client_address(advertising: Cluster):
    cluster = advertising
    leader = cluster.wait_for_leader()
    expected = advertised(cluster, leader)
    assert expected != cluster.nodes[leader].address and expected != cluster.nodes[leader].peer_address
    for follower in (n for n in cluster.nodes if n != leader):
        with pytest.raises(grpc.RpcError) as refused:
            cluster.kv_stub(follower).Put(kv_pb2.PutRequest(key=b"k", value=b"v"), timeout=5)
        hint = errors.from_rpc_error(refused.value)
        assert isinstance(hint, errors.NotLeaderError)
        assert (hint.leader_id, hint.leader_address) == (leader, expected)

    result = subprocess.run([sys.executable, "-m", "kv", "status", "--json", "--endpoints", ",".join(cluster.endpoints)],
                            capture_output=True, text=True, env=child_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    statuses = json.loads(result.stdout)
    assert [s["leader_address"] for s in statuses] == [expected] * 3
    assert {s["id"]: s["address"] for s in statuses} == {n: node.address for n, node in cluster.nodes.items()}

    # A client that knows only a follower follows the hint to the leader's advertised address.
    follower = next(n for n in cluster.nodes if n != leader)
    client = cluster.client([follower])
    client.put("via-hint", "yes")
    assert client.get("via-hint") == b"yes"


def test_a_member_that_binds_every_interface_must_be_told_what_to_advertise(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kv", "serve", "--listen", "0.0.0.0:0", "--data-dir",
                             str(tmp_path / "d")], capture_output=True, text=True, env=child_env(), timeout=60)
    assert result.returncode == 2
    assert "give --advertise-client HOST:PORT" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created


def test_a_new_leaders_followers_learn_its_address(advertising: Cluster):
    """After a failover the hints name the new leader's advertised address, learnt when it first
    dialled each follower."""
    cluster = advertising
    old = cluster.wait_for_leader()
    term = cluster.status(old)["term"]
    cluster.kill(old)
    new = cluster.wait_for_leader(among=[n for n in cluster.nodes if n != old], not_in_term=term)
    follower = next(n for n in cluster.nodes if n not in (old, new))
    status = wait_until("the follower names the new leader",
                        lambda: (s := cluster.status(follower))["leader"] == new and s)
    assert status["leader_address"] == advertised(cluster, new)
