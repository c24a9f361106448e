"""Membership changes and leadership transfer on real `raftkv serve` processes on 127.0.0.1: the
`raftkv member` and `raftkv leader transfer` commands (the real console script), kv.Client's
member calls, and etcdctl 3.4's `member` and `move-leader` against raftkv's etcd Cluster service
(kv/server/etcd_cluster.py) and MoveLeader (kv/server/etcd_services.py).

A member is added as a learner, started empty with `serve --join`, catches up and is promoted;
another is removed. etcd's refusals come with etcd's messages: a learner far behind the leader is
not promoted, and a change that would leave the voters without a reachable majority is refused
(etcd's strict reconfiguration check). Every wait is on a condition, with a deadline."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from kv import Client
from kv.client.members import MEMBER_NAME_KEY
from raftkv_proto.member_ids import member_number
from kv.errors import FailedPreconditionError, NotFoundError
from kv.tools.cluster_up import NodeSpec, free_ports
from kv.tools.serve_command import EXIT_REMOVED
from raftkv_proto import etcd_rpc_pb2 as etcd_pb
from raftkv_proto import etcd_rpc_pb2_grpc as etcd_grpc
from tests.integration.cluster import STEADY_TIMING, Cluster, NodeProcess, wait_until
from tests.integration.test_cli_revisions import console_script, environment

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ETCDCTL = shutil.which("etcdctl")
NOT_IN_SYNC = "etcdserver: can only promote a learner member which is in sync with leader"
NOT_ENOUGH_STARTED = "etcdserver: re-configuration failed due to not enough started members"
MEMBER_NOT_FOUND = "etcdserver: member not found"
PEER_URL_EXISTS = "etcdserver: Peer URLs already exists"
BAD_TRANSFEREE = "etcdserver: bad leader transferee"

def raftkv(cluster: Cluster, *argv: str, endpoints: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*console_script(), *argv, "--endpoints", ",".join(endpoints or cluster.endpoints), "--timeout", "10"]
    return subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=60)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{' '.join(done.args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def etcdctl(endpoints: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    assert ETCDCTL is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return subprocess.run([ETCDCTL, f"--endpoints={','.join(endpoints)}", "--dial-timeout=5s",
                           "--command-timeout=15s", *args], capture_output=True, text=True, env=env, timeout=60)


def roles(members: list[dict[str, Any]]) -> dict[str, str]:
    return {m["id"]: "learner" if m["learner"] else "voter" for m in members}


def new_member(cluster: Cluster, name: str) -> NodeProcess:
    """A member process not yet started: client and peer ports of its own, an empty data directory,
    and --join naming the cluster's members (it learns the rest from them)."""
    client_port, peer_port = free_ports(2)
    peer = f"127.0.0.1:{peer_port}"
    spec = NodeSpec(name, f"127.0.0.1:{client_port}", cluster.base_dir / name, {name: peer},
                    (*cluster.extra_args, "--join", ",".join(cluster.endpoints)))
    node = NodeProcess(spec, cluster.base_dir / f"{name}.log")
    cluster.nodes[name] = node  # killed at teardown with the others, its log printed on failure
    return node


def wait_everywhere(cluster: Cluster, expected: dict[str, str], among: list[str] | None = None) -> None:
    """Wait until every member in `among` (default: all running) has the configuration `expected`
    (id -> voter or learner) in its log: a member lists the members as its own log has them (as an
    etcd 3.4 member does), and a change answered by the leader reaches a follower a moment later."""
    voters = sorted(m for m, r in expected.items() if r == "voter")
    learners = sorted(m for m, r in expected.items() if r == "learner")

    def agreed() -> bool:
        statuses = cluster.statuses(among)
        return bool(statuses) and all(sorted(s.get("voters", ())) == voters and sorted(s.get("learners", ())) == learners
                                      for s in statuses.values())
    wait_until(f"every member to have voters {voters} and learners {learners}", agreed)


def match_index(cluster: Cluster, leader: str, member: str) -> bool:
    status = cluster.status(leader)
    return status.get("peers", {}).get(member, 0) >= status["last_index"]


# ---- the members, kv.Client and the CLI ---------------------------------------------------------

def test_member_list_add_learner_refusals_and_remove(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, STEADY_TIMING)
    cluster.wait_for_leader()
    client = cluster.client()
    listed = json.loads(ok(raftkv(cluster, "member", "list", "-w", "json")))
    assert roles(listed) == {"n1": "voter", "n2": "voter", "n3": "voter"}
    for member in listed:
        assert member["peer_address"] == cluster.nodes[member["id"]].peer_address
        assert member["member_id"] == member_number(member["id"])
    wait_until("every member's client address in the list",
               lambda: all(m["client_address"] == cluster.nodes[m["id"]].address for m in client.member_list()))

    # n4 added as a learner, never started: it is listed, and far behind the leader.
    (peer_port,) = free_ports(1)
    added = ok(raftkv(cluster, "member", "add", "n4", "--peer-address", f"127.0.0.1:{peer_port}", "--learner"))
    assert "Member n4 added to the cluster as a learner" in added
    assert "raftkv serve --id n4" in added and "--join" in added
    wait_everywhere(cluster, {"n1": "voter", "n2": "voter", "n3": "voter", "n4": "learner"})
    table = ok(raftkv(cluster, "member", "list", "-w", "table"))
    assert any(line.split()[:3] == ["n4", "learner", f"127.0.0.1:{peer_port}"] for line in table.splitlines())
    simple = ok(raftkv(cluster, "member", "list")).splitlines()
    assert f"n4, learner, 127.0.0.1:{peer_port}, " in simple
    assert roles(client.member_list()) == {"n1": "voter", "n2": "voter", "n3": "voter", "n4": "learner"}
    assert client.status()[0]["learners"] == ["n4"]

    promote = raftkv(cluster, "member", "promote", "n4")
    assert promote.returncode == 1 and NOT_IN_SYNC in promote.stderr, promote
    with pytest.raises(FailedPreconditionError, match=NOT_IN_SYNC):
        client.member_promote("n4")
    with pytest.raises(FailedPreconditionError, match=PEER_URL_EXISTS):
        client.member_add("n5", f"127.0.0.1:{peer_port}", learner=True)
    with pytest.raises(FailedPreconditionError, match="n4"):
        client.member_add("n4", "127.0.0.1:1", learner=True)
    with pytest.raises(NotFoundError, match=MEMBER_NOT_FOUND):
        client.member_remove("n9")
    with pytest.raises(FailedPreconditionError, match="can only promote a learner member$"):
        client.member_promote("n1")

    removed = json.loads(ok(raftkv(cluster, "member", "remove", "n4", "-w", "json")))
    assert removed["removed"] == "n4" and roles(removed["members"]) == {"n1": "voter", "n2": "voter", "n3": "voter"}

    # An etcd client's MemberAdd through a follower, naming the member as raftkv's client does:
    # the follower forwards the call with the name.
    follower = next(m for m in cluster.nodes if m != cluster.wait_for_leader())
    stub = etcd_grpc.ClusterStub(cluster._channel(follower))
    answer = stub.MemberAdd(etcd_pb.MemberAddRequest(peerURLs=[f"http://127.0.0.1:{peer_port}"], isLearner=True),
                            metadata=[(MEMBER_NAME_KEY, "n5")], timeout=10)
    assert (answer.member.name, answer.member.isLearner, answer.member.ID) == ("n5", True, member_number("n5"))
    assert sorted(m.name for m in answer.members) == ["n1", "n2", "n3", "n5"]
    client.member_remove("n5")
    # The cluster still writes with the same three voters.
    assert client.put("after/remove", "x") > 0


def test_learner_joins_catches_up_is_promoted_and_another_member_removed(
        make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    leader = cluster.wait_for_leader()
    client = cluster.client(["n1", "n2", "n3"])
    for i in range(50):
        client.put(f"before/{i:03}", f"v{i}")

    n4 = new_member(cluster, "n4")
    added = client.member_add("n4", n4.peer_address, learner=True)
    assert added == {**added, "id": "n4", "learner": True, "peer_address": n4.peer_address}
    # serve --join asks the first member that answers: it must already know of n4.
    wait_everywhere(cluster, {"n1": "voter", "n2": "voter", "n3": "voter", "n4": "learner"}, among=["n1", "n2", "n3"])
    n4.start()
    wait_until("n4 to catch up with the leader",
               lambda: match_index(cluster, cluster.wait_for_leader(["n1", "n2", "n3"]), "n4"), timeout=60)
    leader = cluster.wait_for_leader(["n1", "n2", "n3"])
    n4.check_alive()
    assert roles(json.loads(ok(raftkv(cluster, "member", "promote", "n4", "-w", "json")))["members"]) == {
        "n1": "voter", "n2": "voter", "n3": "voter", "n4": "voter"}
    wait_until("n4 to know itself a voter", lambda: "n4" in cluster.status("n4")["voters"])
    assert Client([n4.address], timeout=10).get("before/049", consistency="stale") == b"v49"

    # Remove a follower of the old three: four voters become three, n4 one of them.
    victim = next(m for m in ("n1", "n2", "n3") if m != leader)
    ok(raftkv(cluster, "member", "remove", victim, endpoints=[cluster.nodes[m].address for m in ("n1", "n2", "n3", "n4")
                                                               if m != victim]))
    survivors = [m for m in ("n1", "n2", "n3", "n4") if m != victim]
    wait_everywhere(cluster, {m: "voter" for m in survivors}, among=survivors)
    assert roles(cluster.client(survivors).member_list()) == {m: "voter" for m in survivors}
    writer = cluster.client(survivors)
    index = writer.put("after/remove", "y")
    for member in survivors:
        cluster.wait_applied(member, index)
    assert cluster.nodes[victim].wait_exit() == EXIT_REMOVED
    assert "stops serving: removed from the cluster" in cluster.nodes[victim].log_path.read_text(errors="replace")


def test_the_readme_recipe_a_member_added_then_started_with_listen_peer_and_join(
        make_cluster: Callable[..., Cluster]) -> None:
    """README, "Changing the members": `raftkv member add n4 --peer-address P --learner`, then
    `raftkv serve --id n4 --listen C --listen-peer P --data-dir D --join ENDPOINTS`, no --peers (the
    cluster names them): n4 joins, catches up and serves, is promoted, and started again with the
    same command (as a unit would) it serves again."""
    cluster = make_cluster(3, STEADY_TIMING)
    cluster.wait_for_leader()
    founders = ["n1", "n2", "n3"]
    cluster.client(founders).put("before/join", "x")
    client_port, peer_port = free_ports(2)
    peer = f"127.0.0.1:{peer_port}"
    ok(raftkv(cluster, "member", "add", "n4", "--peer-address", peer, "--learner"))
    wait_everywhere(cluster, {"n1": "voter", "n2": "voter", "n3": "voter", "n4": "learner"}, among=founders)
    spec = NodeSpec("n4", f"127.0.0.1:{client_port}", cluster.base_dir / "n4", {},
                    (*cluster.extra_args, "--join", ",".join(cluster.endpoints[:2])), listen_peer=peer)
    assert "--listen-peer" in spec.serve_args() and "--join" in spec.serve_args()
    n4 = cluster.nodes["n4"] = NodeProcess(spec, cluster.base_dir / "n4.log")
    n4.start()
    wait_until("n4 to catch up with the leader",
               lambda: n4.check_alive() or match_index(cluster, cluster.wait_for_leader(founders), "n4"), timeout=60)
    assert cluster.client(["n4"]).get("before/join", consistency="stale") == b"x"
    ok(raftkv(cluster, "member", "promote", "n4", endpoints=cluster.endpoints[:3]))
    wait_until("n4 to know itself a voter", lambda: n4.check_alive() or "n4" in cluster.status("n4")["voters"])

    assert n4.terminate() == 0
    n4.start()
    cluster.wait_for_leader()  # all four agree, n4 running again
    assert cluster.client(["n4"]).get("before/join") == b"x"


def test_a_removed_member_exits_with_its_own_code_and_leaves_its_data(make_cluster: Callable[..., Cluster]) -> None:
    """`raftkv member remove` of a running member: it stops serving, and its process ends with
    EXIT_REMOVED (a code a systemd unit lists in RestartPreventExitStatus=, raftkv exits with it for
    nothing else), its last log line saying why; its data directory stays as it was."""
    cluster = make_cluster(3, STEADY_TIMING)
    leader = cluster.wait_for_leader()
    victim = next(m for m in cluster.nodes if m != leader)
    survivors = [m for m in cluster.nodes if m != victim]
    client = cluster.client(survivors)
    index = client.put("before/remove", "x")
    cluster.wait_applied(victim, index)
    data_dir = cluster.nodes[victim].spec.data_dir
    held = sorted(p.name for p in data_dir.iterdir())
    state = sorted(p.name for p in (data_dir / "state").iterdir())

    ok(raftkv(cluster, "member", "remove", victim))
    assert cluster.nodes[victim].wait_exit() == EXIT_REMOVED
    last_line = cluster.nodes[victim].log_tail(1)
    assert f"node {victim} exits with code {EXIT_REMOVED}: it was removed from the cluster" in last_line, last_line
    assert f"RestartPreventExitStatus={EXIT_REMOVED}" in last_line, last_line
    assert sorted(p.name for p in data_dir.iterdir()) == held
    assert sorted(p.name for p in (data_dir / "state").iterdir()) == state and state
    assert client.put("after/remove", "y") > index  # the two others go on


def test_strict_reconfiguration_check_counts_only_reachable_voters(make_cluster: Callable[..., Cluster]) -> None:
    """n3 is a member the leader has not heard from in its term (the cluster was restarted without
    it): a change that leaves the voters with no majority of started ones is refused (etcd's
    message); removing n3 itself is accepted."""
    cluster = make_cluster(3, STEADY_TIMING)
    cluster.wait_for_leader()
    cluster.client().put("formed", "x")
    for node in cluster.nodes.values():
        node.kill()
    cluster.start_node("n1")
    cluster.start_node("n2")
    cluster.wait_for_leader(among=["n1", "n2"])
    client = cluster.client(["n1", "n2"])
    client.put("committed/in/term", "x")  # the leader has committed an entry of its term

    (peer_port,) = free_ports(1)
    with pytest.raises(FailedPreconditionError, match=NOT_ENOUGH_STARTED):
        client.member_add("n4", f"127.0.0.1:{peer_port}")  # 2 started of 4 voters
    removing = raftkv(cluster, "member", "remove", "n2", endpoints=cluster.endpoints[:2])
    assert removing.returncode == 1 and NOT_ENOUGH_STARTED in removing.stderr, removing  # 1 started of {n1, n3}
    assert client.member_add("n4", f"127.0.0.1:{peer_port}", learner=True)["learner"]  # a learner is not counted
    client.member_remove("n3")
    wait_everywhere(cluster, {"n1": "voter", "n2": "voter", "n4": "learner"}, among=["n1", "n2"])
    assert roles(client.member_list()) == {"n1": "voter", "n2": "voter", "n4": "learner"}


def test_leader_transfer(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, STEADY_TIMING)
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    target = next(m for m in cluster.nodes if m != leader)
    assert ok(raftkv(cluster, "leader", "transfer", "--to", target)).strip() == f"Leadership transferred to {target}"
    assert cluster.wait_for_leader(not_in_term=term) == target

    moved = json.loads(ok(raftkv(cluster, "leader", "transfer", "-w", "json")))
    assert moved["leader"] != target and moved["leader"] in cluster.nodes
    assert cluster.wait_for_leader() == moved["leader"]

    refused = raftkv(cluster, "leader", "transfer", "--to", "n9")
    assert refused.returncode == 1 and BAD_TRANSFEREE in refused.stderr, refused
    client = cluster.client()
    assert client.move_leader(target) == target  # through a client that may start at a follower


# ---- etcdctl 3.4 -------------------------------------------------------------------------------

@pytest.mark.skipif(ETCDCTL is None, reason="needs etcdctl 3.4 on PATH (Debian: apt-get install etcd-client)")
def test_etcdctl_member_commands_and_move_leader(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, STEADY_TIMING)
    leader = cluster.wait_for_leader()
    follower = next(m for m in cluster.nodes if m != leader)
    through = [cluster.nodes[follower].address]  # a follower: changes are forwarded to the leader

    def listing() -> list[dict[str, Any]]:
        done = etcdctl(through, "member", "list", "-w", "json")
        assert done.returncode == 0, done
        return json.loads(done.stdout)["members"]

    members = listing()
    assert sorted(m["name"] for m in members) == ["n1", "n2", "n3"]
    assert {m["ID"] for m in members} == {member_number(n) for n in ("n1", "n2", "n3")}
    assert not any(m.get("isLearner") for m in members)
    simple = etcdctl(through, "member", "list")
    assert simple.returncode == 0 and f"{member_number('n1'):x}, started, n1, http://" in simple.stdout, simple

    (peer_port,) = free_ports(1)
    added = etcdctl(through, "member", "add", "newbie", f"--peer-urls=http://127.0.0.1:{peer_port}", "--learner")
    assert added.returncode == 0 and "added to cluster" in added.stdout, added
    learner = wait_until("the follower to list the learner", lambda: next((m for m in listing() if m.get("isLearner")), None))
    assert learner["peerURLs"] == [f"http://127.0.0.1:{peer_port}"]
    assert "name" not in learner and "clientURLs" not in learner  # etcd sends no name: unstarted, as etcd lists it
    learner_hex = f"{learner['ID']:x}"

    promote = etcdctl(through, "member", "promote", learner_hex)
    assert promote.returncode != 0 and NOT_IN_SYNC in promote.stderr, promote
    duplicate = etcdctl(through, "member", "add", "again", f"--peer-urls=http://127.0.0.1:{peer_port}")
    assert duplicate.returncode != 0 and PEER_URL_EXISTS in duplicate.stderr, duplicate
    removed = etcdctl(through, "member", "remove", learner_hex)
    # etcdctl prints the id as Go's %16x: padded with spaces to 16 (an id below 2**60 has fewer digits).
    assert removed.returncode == 0 and f"Member {learner['ID']:16x} removed from cluster" in removed.stdout, removed
    missing = etcdctl(through, "member", "remove", learner_hex)
    assert missing.returncode != 0 and MEMBER_NOT_FOUND in missing.stderr, missing
    wait_until("the follower to list n1, n2, n3 alone", lambda: sorted(m["name"] for m in listing()) == ["n1", "n2", "n3"])

    term = cluster.status(leader)["term"]
    moved = etcdctl(cluster.endpoints, "move-leader", f"{member_number(follower):x}")
    assert moved.returncode == 0 and "Leadership transferred" in moved.stdout, moved
    assert cluster.wait_for_leader(not_in_term=term) == follower
    bad = etcdctl(cluster.endpoints, "move-leader", f"{member_number('n9'):x}")
    assert bad.returncode != 0 and BAD_TRANSFEREE in bad.stderr, bad
