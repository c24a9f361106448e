"""Members by name, MemberUpdate and a lone member's peer URL, on real `raftkv serve` processes on
127.0.0.1 with etcdctl 3.4 as the judge, and side by side with a real etcd 3.4 where raftkv follows
it (decision 0068, docs/etcd-compatibility.md):

- `etcdctl member add n4 --peer-urls=...` adds a nameless member, listed as etcd lists an unstarted
  one (no name, no client URLs); `raftkv serve --id n4 --listen-peer ... --join ...` then starts
  it as n4, a learner or a voter as it was added;
- `etcdctl member update ID --peer-urls=...` moves a member through the log: the others dial the
  new address, and the member restarted there catches up; etcd's refusals, compared with etcd's;
- a member started alone (no --peers) lists the peer URL it takes peers on once it grows (its
  client port + 100), and does take them there when a member is added."""
from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kv.tools.cluster_up import NodeSpec, free_port_block, free_ports, port_block, release_ports
from raftkv_proto.member_ids import member_number
from tests.integration.cluster import STEADY_TIMING, Cluster, NodeProcess, wait_until
from tests.integration.test_etcd_differential import Etcd, etcd_and_raftkv, start_etcd
from tests.integration.test_members import (MEMBER_NOT_FOUND, PEER_URL_EXISTS, etcdctl, match_index, ok,
                                            raftkv, wait_everywhere)
from tests.integration.real_etcd import needs_etcd

pytestmark = [
    pytest.mark.integration, pytest.mark.slow,
    needs_etcd,
]


def members(endpoint: str) -> list[dict[str, Any]]:
    """`etcdctl member list -w json`'s members, as the member at `endpoint` lists them."""
    done = etcdctl([endpoint], "member", "list", "-w", "json")
    assert done.returncode == 0, done
    return json.loads(done.stdout)["members"]


def at(endpoint: str, peer_url: str) -> dict[str, Any] | None:
    return next((m for m in members(endpoint) if m["peerURLs"] == [peer_url]), None)


def joiner(cluster: Cluster, name: str, peer: str, join: list[str]) -> NodeProcess:
    """The README's command for a member added before: --listen-peer, --join, no --peers."""
    (client_port,) = free_ports(1)
    cluster.ports.append(client_port)
    spec = NodeSpec(name, f"127.0.0.1:{client_port}", cluster.base_dir / name, {},
                    (*cluster.extra_args, "--join", ",".join(join)), listen_peer=peer)
    node = cluster.nodes[name] = NodeProcess(spec, cluster.base_dir / f"{name}.log")
    return node


def shape(member: dict[str, Any]) -> dict[str, Any]:
    """What of a listed member both stores must agree on: its fields, and whether it is a learner."""
    return {"fields": sorted(member), "learner": member.get("isLearner", False)}


# ---- etcdctl member add, then serve --id NAME --join ---------------------------------------------

def test_etcdctl_member_add_then_serve_under_the_name(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, STEADY_TIMING)
    cluster.wait_for_leader()
    founders = ["n1", "n2", "n3"]
    cluster.client(founders).put("before/join", "x")
    endpoint = cluster.nodes["n2"].address
    learner_peer, voter_peer = (f"127.0.0.1:{port}" for port in free_ports(2))
    cluster.ports.extend(int(p.rsplit(":", 1)[1]) for p in (learner_peer, voter_peer))

    for name, peer, flags in (("n4", learner_peer, ("--learner",)), ("n5", voter_peer, ())):
        added = etcdctl(cluster.endpoints, "member", "add", name, f"--peer-urls=http://{peer}", *flags)
        assert added.returncode == 0 and "added to cluster" in added.stdout, added
        nameless = wait_until(f"{endpoint} to list the member at {peer}", lambda: at(endpoint, f"http://{peer}"))
        assert shape(nameless) == {"fields": ["ID", "isLearner", "peerURLs"] if flags else ["ID", "peerURLs"],
                                   "learner": bool(flags)}
        simple = ok(etcdctl([endpoint], "member", "list"))
        assert f"{nameless['ID']:x}, unstarted, , http://{peer}, , {'true' if flags else 'false'}" in simple

        node = joiner(cluster, name, peer, cluster.endpoints[:2])
        node.start()
        started = wait_until(f"{name} to be listed with its name and client URL",
                             lambda: node.check_alive() or next((m for m in members(endpoint) if m.get("name") == name
                                                                 and m.get("clientURLs")), None), timeout=30)
        assert started["peerURLs"] == [f"http://{peer}"] and started["clientURLs"] == [f"http://{node.address}"]
        assert started.get("isLearner", False) == bool(flags) and started["ID"] == member_number(name)
        assert not any(m["peerURLs"] == [f"http://{peer}"] and not m.get("name") for m in members(endpoint))
        wait_until(f"{name} to catch up", lambda: node.check_alive() or match_index(
            cluster, cluster.wait_for_leader(founders), name), timeout=60)
        assert cluster.client([name]).get("before/join", consistency="stale") == b"x"

    ok(etcdctl(cluster.endpoints, "member", "promote", f"{member_number('n4'):x}"))
    wait_everywhere(cluster, {m: "voter" for m in ("n1", "n2", "n3", "n4", "n5")})
    # Started again with the same command, n4 asks nothing and serves as n4.
    assert cluster.nodes["n4"].terminate() == 0
    cluster.nodes["n4"].start()
    index = cluster.client(founders).put("after/restart", "y")
    cluster.wait_applied("n4", index)


def test_a_member_started_under_another_address_or_a_removed_name_is_refused(
        make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, STEADY_TIMING)
    cluster.wait_for_leader()
    peer, elsewhere = (f"127.0.0.1:{port}" for port in free_ports(2))
    ok(etcdctl(cluster.endpoints, "member", "add", "n4", f"--peer-urls=http://{peer}", "--learner"))
    wait_until("every member to list the nameless learner",
               lambda: all(at(cluster.nodes[m].address, f"http://{peer}") for m in ("n1", "n2", "n3")))
    wrong = joiner(cluster, "n4", elsewhere, cluster.endpoints)
    wrong.start()
    assert wrong.wait_exit() == 1
    assert "n4 is not a member" in wrong.log_tail() and f"nameless at {peer}" in wrong.log_tail()
    assert at(cluster.nodes["n1"].address, f"http://{peer}").get("name") is None  # nothing changed

    ok(raftkv(cluster, "member", "remove", "n3", endpoints=cluster.endpoints[:2]))
    taken = joiner(cluster, "n3", peer, cluster.endpoints[:2])
    taken.spec = replace(taken.spec, data_dir=cluster.base_dir / "n3-again")
    taken.start()
    assert taken.wait_exit() == 1
    assert "n3 was removed from this cluster" in taken.log_tail()


# ---- differential: the member list before and after a start, and MemberUpdate's refusals ---------

@pytest.fixture
def etcd_pair(tmp_path: Path) -> Iterator[tuple[Etcd, NodeProcess]]:
    with etcd_and_raftkv(tmp_path) as pair:
        yield pair


def start_second_etcd(base: Path, first: Etcd, name: str, peer: str) -> Etcd:
    """An etcd member started as `name` at `peer`, joining `first`'s cluster (as etcdctl member add
    said to start it). (A learner answers no health check: the caller waits for it to be listed.)"""
    first_peer = next(m["peerURLs"][0] for m in members(first.endpoint) if m.get("name"))
    return start_etcd(base, name=name, peer_url=f"http://{peer}",
                      initial_cluster=f"default={first_peer},{name}=http://{peer}", existing=True)


def test_the_member_list_before_and_after_a_start_as_etcd_lists_it(etcd_pair: tuple[Etcd, NodeProcess],
                                                                   tmp_path: Path) -> None:
    etcd, node = etcd_pair
    raftkv_cluster = Cluster(tmp_path / "raftkv-joiner", 0)
    etcd_peer, raftkv_peer = (f"127.0.0.1:{port}" for port in free_ports(2))
    outcomes = {}
    for side, endpoint, peer in (("etcd", etcd.endpoint, etcd_peer), ("raftkv", node.address, raftkv_peer)):
        ok(etcdctl([endpoint], "member", "add", "x1", f"--peer-urls=http://{peer}", "--learner"))
        before = at(endpoint, f"http://{peer}")
        assert before is not None
        simple = ok(etcdctl([endpoint], "member", "list"))
        outcomes[side] = {"before": shape(before),
                          "simple": next(line.replace(peer, "PEER").split(", ")[1:] for line in simple.splitlines()
                                         if peer in line)}
    assert outcomes["raftkv"] == outcomes["etcd"]

    second = start_second_etcd(tmp_path / "etcd-x1", etcd, "x1", etcd_peer)
    try:
        raftkv_cluster.base_dir.mkdir(parents=True, exist_ok=True)
        joined = joiner(raftkv_cluster, "x1", raftkv_peer, [node.address])
        joined.start()
        for side, endpoint, peer, check in (("etcd", etcd.endpoint, etcd_peer, second.check_alive),
                                            ("raftkv", node.address, raftkv_peer, joined.check_alive)):
            after = wait_until(f"{side} to list x1 started", lambda: check() or next(
                (m for m in members(endpoint) if m.get("name") == "x1" and m.get("clientURLs")), None), timeout=30)
            outcomes[side]["after"] = shape(after)
            outcomes[side]["client"] = after["clientURLs"] == [f"http://{joined.address if side == 'raftkv' else second.endpoint}"]
        assert outcomes["raftkv"] == outcomes["etcd"]
    finally:
        second.kill()
        raftkv_cluster.close()


def test_member_update_refusals_and_answers_as_etcds(etcd_pair: tuple[Etcd, NodeProcess]) -> None:
    etcd, node = etcd_pair
    outcomes: dict[str, list[Any]] = {}
    for side, endpoint in (("etcd", etcd.endpoint), ("raftkv", node.address)):
        new_peer, moved_peer = (f"http://127.0.0.1:{port}" for port in free_ports(2))
        ok(etcdctl([endpoint], "member", "add", "x2", f"--peer-urls={new_peer}", "--learner"))  # (a voter: no quorum)
        own = next(m for m in members(endpoint) if m.get("name"))
        other = next(m for m in members(endpoint) if not m.get("name"))
        results = []
        for args in (("member", "update", "1234abcd", f"--peer-urls={moved_peer}"),   # not a member
                     ("member", "update", f"{other['ID']:x}", f"--peer-urls={own['peerURLs'][0]}"),  # taken
                     ("member", "update", f"{other['ID']:x}", "--peer-urls=foo"),  # (etcdctl's own check)
                     ("member", "update", f"{other['ID']:x}", "--peer-urls=http://127.0.0.1"),
                     ("member", "update", f"{own['ID']:x}", f"--peer-urls={own['peerURLs'][0]}"),  # the same URL
                     ("member", "update", f"{other['ID']:x}", f"--peer-urls={moved_peer}")):
            done = etcdctl([endpoint], *args)
            errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
            results.append((done.returncode, errors, "updated in cluster" in done.stdout))
        moved = at(endpoint, moved_peer)
        results.append(moved is not None and moved["ID"] == other["ID"])
        outcomes[side] = results
    assert outcomes["raftkv"] == outcomes["etcd"]
    assert outcomes["etcd"][0][1] == [f"Error: {MEMBER_NOT_FOUND}"] and outcomes["etcd"][1][1] == [f"Error: {PEER_URL_EXISTS}"]


# ---- MemberUpdate moves a member; it rejoins from the new port -----------------------------------

def test_a_member_moved_by_member_update_rejoins_from_its_new_port(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, STEADY_TIMING)
    leader = cluster.wait_for_leader()
    mover = next(m for m in cluster.nodes if m != leader)
    (new_port,) = free_ports(1)
    cluster.ports.append(new_port)
    new_peer = f"127.0.0.1:{new_port}"
    updated = etcdctl(cluster.endpoints, "member", "update", f"{member_number(mover):x}", f"--peer-urls=http://{new_peer}")
    assert updated.returncode == 0 and "updated in cluster" in updated.stdout, updated
    others = [m for m in cluster.nodes if m != mover]
    wait_until("the others to list the new peer URL", lambda: all(
        next(m for m in members(cluster.nodes[o].address) if m.get("name") == mover)["peerURLs"] == [f"http://{new_peer}"]
        for o in others))
    writer = cluster.client(others)
    index = writer.put("while/moving", "x")
    behind = cluster.status(mover)["applied_index"]
    assert behind < index  # nothing reaches it at its old port any more

    cluster.kill(mover)
    cluster.nodes[mover].spec = replace(cluster.nodes[mover].spec, listen_peer=new_peer)  # --peers: the old port
    cluster.start_node(mover)
    cluster.wait_applied(mover, index)
    # A peer restarted with its --peers naming the old port still reaches the mover at the new one.
    restarted = next(o for o in others if o != cluster.wait_for_leader())
    cluster.restart(restarted)
    cluster.wait_for_leader()
    index = writer.put("after/moving", "y")
    for member in cluster.nodes:
        cluster.wait_applied(member, index)


# ---- a member started alone lists, and takes peers on, its client port + 100 ---------------------

def test_a_member_started_alone_lists_its_peer_url_and_takes_peers_there_when_it_grows(tmp_path: Path) -> None:
    base = free_port_block(1, (0, 100))
    ports = port_block(base, 1, (0, 100))
    cluster = Cluster(tmp_path, 0, STEADY_TIMING)
    try:
        spec = NodeSpec("n1", f"127.0.0.1:{base}", tmp_path / "n1", {}, STEADY_TIMING)
        lone = cluster.nodes["n1"] = NodeProcess(spec, tmp_path / "n1.log")
        release_ports(ports)  # (bound by the member itself from here on)
        lone.start()
        cluster.wait_for_leader()
        (listed,) = wait_until("n1 to answer", lambda: members(lone.address))
        assert listed["peerURLs"] == [f"http://127.0.0.1:{base + 100}"]
        with pytest.raises(OSError):  # nothing takes peers there while it has none
            socket.create_connection(("127.0.0.1", base + 100), timeout=1).close()
        cluster.client(["n1"]).put("alone", "x")

        (peer_port,) = free_ports(1)
        cluster.ports.append(peer_port)
        ok(raftkv(cluster, "member", "add", "n2", "--peer-address", f"127.0.0.1:{peer_port}", "--learner"))
        socket.create_connection(("127.0.0.1", base + 100), timeout=1).close()  # it takes peers there now
        second = joiner(cluster, "n2", f"127.0.0.1:{peer_port}", [lone.address])
        second.start()
        wait_until("n2 to catch up", lambda: second.check_alive() or match_index(cluster, "n1", "n2"), timeout=60)
        assert cluster.client(["n2"]).get("alone", consistency="stale") == b"x"

        # Both started again as they were: n1 takes peers at the same address without being told.
        for member in ("n1", "n2"):
            cluster.nodes[member].terminate()
        for member in ("n1", "n2"):
            cluster.nodes[member].start()
        cluster.wait_for_leader(["n1"])
        index = cluster.client(["n1"]).put("grown", "y")
        cluster.wait_applied("n2", index)
    finally:
        cluster.close()
