"""etcdctl 3.4 (ETCDCTL_API=3), the real binary, against a three-member raftkv cluster on its client
ports (`--listen`): etcd's KV, Maintenance and Cluster services beside the native API.

Writes go to ONE endpoint, deliberately a follower: a follower sends writes and linearizable reads
on to the leader (kv/server/etcd_face.py), so etcdctl, which holds the one endpoint it is given,
never sees "not leader". Each test checks that the member it wrote through was a follower before
and after, in the same term, so the write did travel. Some commands go to the leader, and the
Maintenance ones (endpoint status, health, hashkv) to every member.

Outputs are asserted as etcdctl prints them, parsed from `-w json` where it has it (keys and values
in base64, revisions in the header). etcdctl 3.4 has no --count-only (etcdctl 3.5 added it): a
range's count is checked under --limit instead. `watch` and `lease keep-alive`, which run until
stopped, are read line by line with a deadline. The cluster is shared by the module's tests, each
under a prefix of its own; the compaction test comes last, as a compaction refuses every later
read below it."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import STEADY_TIMING, Cluster, wait_until
from tests.integration.test_cli_watch_lease import Stream, wait_for_watch

ETCDCTL = shutil.which("etcdctl")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ETCDCTL is None, reason="needs etcdctl 3.4 on PATH (Debian: apt-get install etcd-client)"),
]

CALL_TIMEOUT_S = 30
COMPACTED = "etcdserver: mvcc: required revision has been compacted"

def etcdctl(endpoints: str | list[str], *args: str, stdin: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert ETCDCTL is not None
    if not isinstance(endpoints, str):
        endpoints = ",".join(endpoints)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return subprocess.run([ETCDCTL, f"--endpoints={endpoints}", "--dial-timeout=5s", "--command-timeout=15s", *args],
                          input=stdin if stdin is not None else "", capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=CALL_TIMEOUT_S)


def ok(endpoints: str | list[str], *args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    """etcdctl's stdout, after asserting it succeeded."""
    done = etcdctl(endpoints, *args, stdin=stdin, cwd=cwd)
    assert done.returncode == 0, f"etcdctl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def js(endpoints: str | list[str], *args: str, stdin: str | None = None) -> Any:
    return json.loads(ok(endpoints, *args, "-w", "json", stdin=stdin))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def pairs(response: dict[str, Any]) -> list[tuple[str, str | None]]:
    """A range response's (key, value) pairs, decoded; value None when the response has none."""
    return [(unb64(kv["key"]), unb64(kv["value"]) if "value" in kv else None) for kv in response.get("kvs", [])]


def txn_input(compares: list[str], success: list[str], failure: list[str]) -> str:
    """etcdctl's txn input: compares, a blank line, success ops, a blank line, failure ops."""
    return "\n".join([*compares, "", *success, "", *failure, ""]) + "\n"


# ---- the cluster -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three members, shared by the module's tests; killed at the end."""
    cluster = Cluster(tmp_path_factory.mktemp("etcdctl"), 3, STEADY_TIMING)
    try:
        cluster.start()
        cluster.wait_for_leader()
        yield cluster
    finally:
        cluster.close()


@dataclass(frozen=True)
class Roles:
    cluster: Cluster
    leader_id: str
    follower_id: str
    term: int

    @property
    def leader(self) -> str:
        return self.cluster.nodes[self.leader_id].address

    @property
    def follower(self) -> str:
        return self.cluster.nodes[self.follower_id].address

    @property
    def all(self) -> list[str]:
        return self.cluster.endpoints


@pytest.fixture
def roles(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Roles]:
    """The leader and a follower as the test starts. After it: the follower must still be one, in
    the same term (else what went through it may not have been forwarded); the members' log tails
    are printed when the test failed."""
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    yield Roles(cluster, leader, follower, term)
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        print(cluster.log_tails())
        return
    status = cluster.status(follower)
    assert (status["role"], status["term"], status["leader"]) == ("follower", term, leader), \
        f"{follower} did not stay a follower of {leader} in term {term} through the test: {status}"


def member_ids(roles: Roles) -> dict[str, int]:
    """etcd's uint64 id of each member, by name, from `member list`."""
    return {member["name"]: member["ID"] for member in js(roles.leader, "member", "list")["members"]}


# ---- the tests -------------------------------------------------------------------------------------

def test_put_and_get_through_a_follower(roles: Roles):
    f = roles.follower
    first = js(f, "put", "pg/a", "alpha")["header"]["revision"]
    assert ok(f, "put", "pg/b", "bravo") == "OK\n"
    assert js(f, "put", "pg/c", "charlie")["header"]["revision"] == first + 2
    overwrite = js(f, "put", "pg/a", "ALPHA", "--prev-kv")
    assert overwrite["header"]["revision"] == first + 3
    assert overwrite["prev_kv"] == {"key": b64("pg/a"), "value": b64("alpha"), "create_revision": first,
                                    "mod_revision": first, "version": 1}
    assert ok(f, "put", "pg/b", "BRAVO", "--prev-kv") == "OK\npg/b\nbravo\n"
    assert js(f, "put", "pg/z", "zulu")["header"]["revision"] == first + 5
    now = first + 5

    got = js(f, "get", "pg/a")
    assert got["header"]["revision"] == now
    assert got["count"] == 1
    assert got["kvs"] == [{"key": b64("pg/a"), "value": b64("ALPHA"), "create_revision": first,
                           "mod_revision": first + 3, "version": 2}]
    assert ok(f, "get", "pg/a") == "pg/a\nALPHA\n"
    assert ok(f, "get", "pg/a", "--print-value-only") == "ALPHA\n"
    assert js(f, "get", "pg/none") == {"header": {**got["header"], "revision": now}}  # no kvs, count 0

    prefix = js(f, "get", "--prefix", "pg/")
    assert pairs(prefix) == [("pg/a", "ALPHA"), ("pg/b", "BRAVO"), ("pg/c", "charlie"), ("pg/z", "zulu")]
    assert prefix["count"] == 4 and "more" not in prefix
    assert pairs(js(f, "get", "--from-key", "pg/c"))[:2] == [("pg/c", "charlie"), ("pg/z", "zulu")]
    assert pairs(js(f, "get", "pg/a", "pg/c")) == [("pg/a", "ALPHA"), ("pg/b", "BRAVO")]  # [pg/a, pg/c)

    # --rev: the store as it was, under today's header revision.
    past = js(f, "get", "--prefix", "pg/", f"--rev={first + 1}")
    assert pairs(past) == [("pg/a", "alpha"), ("pg/b", "bravo")] and past["header"]["revision"] == now
    assert js(f, "get", "pg/a", f"--rev={first}")["kvs"][0]["version"] == 1
    assert "kvs" not in js(f, "get", "pg/z", f"--rev={first + 4}")

    # --limit: the first keys, count of them all, and more.
    limited = js(f, "get", "--prefix", "pg/", "--limit=2")
    assert (pairs(limited), limited["count"], limited.get("more")) == ([("pg/a", "ALPHA"), ("pg/b", "BRAVO")], 4, True)
    exact = js(f, "get", "--prefix", "pg/", "--limit=4")
    assert (len(exact["kvs"]), exact["count"], exact.get("more")) == (4, 4, None)

    # --sort-by / --order.
    def keys(*flags: str) -> list[str]:
        return [key for key, _ in pairs(js(f, "get", "--prefix", "pg/", *flags))]
    assert keys("--sort-by=KEY", "--order=DESCEND") == ["pg/z", "pg/c", "pg/b", "pg/a"]
    assert keys("--sort-by=MODIFY", "--order=DESCEND") == ["pg/z", "pg/b", "pg/a", "pg/c"]
    assert keys("--sort-by=CREATE", "--order=ASCEND") == ["pg/a", "pg/b", "pg/c", "pg/z"]
    assert keys("--sort-by=VALUE", "--order=ASCEND") == ["pg/a", "pg/b", "pg/c", "pg/z"]  # ALPHA < BRAVO < c < z
    assert keys("--sort-by=VERSION", "--order=DESCEND") == ["pg/a", "pg/b", "pg/c", "pg/z"]  # ties in key order
    assert keys("--sort-by=MODIFY", "--order=ASCEND", "--limit=1") == ["pg/c"]

    # --keys-only: keys and revisions, no values.
    only_keys = js(f, "get", "--prefix", "pg/", "--keys-only")
    assert pairs(only_keys) == [("pg/a", None), ("pg/b", None), ("pg/c", None), ("pg/z", None)]
    assert only_keys["kvs"][0]["mod_revision"] == first + 3
    assert ok(f, "get", "--prefix", "pg/", "--keys-only", "--limit=1") == "pg/a\n\n"


def test_reads_through_a_follower_see_the_leaders_latest_write(roles: Roles):
    """A linearizable get through the follower is sent to the leader: it sees a write made through
    the leader the moment before, every time. A serializable one is the follower's own state."""
    for i in range(5):
        written = js(roles.leader, "put", "lin/key", f"v{i}")["header"]["revision"]
        seen = js(roles.follower, "get", "lin/key")
        assert (pairs(seen), seen["header"]["revision"]) == ([("lin/key", f"v{i}")], written)

    def applied_locally() -> dict[str, Any] | None:
        local = js(roles.follower, "get", "lin/key", "--consistency=s")
        return local if pairs(local) == [("lin/key", "v4")] else None
    local = wait_until("the follower to apply the last write", applied_locally, timeout=15)
    assert local["kvs"][0]["version"] == 5


def test_delete_through_a_follower(roles: Roles):
    f = roles.follower
    for key in ("dl/a", "dl/b", "dl/c", "dl/d", "dlx"):
        ok(f, "put", key, key.upper())
    before = js(f, "get", "dl/a")["kvs"][0]
    one = js(f, "del", "dl/a", "--prev-kv")
    assert one["deleted"] == 1
    assert one["prev_kvs"] == [before]
    assert ok(f, "del", "dl/b", "--prev-kv") == "1\ndl/b\nDL/B\n"
    assert ok(f, "del", "dl/none") == "0\n"
    unchanged = js(f, "del", "dl/none")
    assert "deleted" not in unchanged and unchanged["header"]["revision"] == one["header"]["revision"] + 1

    prefix = js(f, "del", "--prefix", "dl/", "--prev-kv")
    assert prefix["deleted"] == 2
    assert [unb64(kv["key"]) for kv in prefix["prev_kvs"]] == ["dl/c", "dl/d"]
    assert prefix["header"]["revision"] == one["header"]["revision"] + 2  # one revision for the range
    assert "kvs" not in js(roles.leader, "get", "--prefix", "dl/")
    assert pairs(js(roles.leader, "get", "dlx")) == [("dlx", "DLX")]  # outside the prefix
    # The deleted keys are still there at a past revision.
    assert pairs(js(f, "get", "--prefix", "dl/", f"--rev={one['header']['revision'] - 1}")) == [
        ("dl/a", "DL/A"), ("dl/b", "DL/B"), ("dl/c", "DL/C"), ("dl/d", "DL/D")]


def test_txn_takes_each_branch_through_a_follower(roles: Roles):
    f = roles.follower
    ok(f, "put", "tx/lock", "free")
    ok(f, "put", "tx/count", "1")
    mod = js(f, "get", "tx/lock")["kvs"][0]["mod_revision"]

    # Interactive (-i): etcdctl prompts for each part on stdout, then prints the result.
    interactive = ok(f, "txn", "-i", stdin=txn_input(['value("tx/lock") = "free"', f'mod("tx/lock") = "{mod}"'],
                                                   ["put tx/lock taken", "get tx/count"], ["get tx/lock"]))
    assert interactive == ("compares:\nsuccess requests (get, put, del):\nfailure requests (get, put, del):\n"
                           "SUCCESS\n\nOK\n\ntx/count\n1\n")
    assert pairs(js(roles.leader, "get", "tx/lock")) == [("tx/lock", "taken")]

    # The same transaction again: its compares fail now, and the failure branch runs.
    failed = ok(f, "txn", "-i", stdin=txn_input(['value("tx/lock") = "free"'], ["put tx/lock taken"],
                                                ["get tx/lock", "put tx/count 2"]))
    assert failed.endswith("FAILURE\n\ntx/lock\ntaken\n\nOK\n")
    assert pairs(js(roles.leader, "get", "tx/count")) == [("tx/count", "2")]

    # -w json, the non-interactive form: both branches, with the responses of each op.
    success = js(f, "txn", stdin=txn_input(['version("tx/count") = "2"', 'create("tx/none") = "0"'],
                                           ["put tx/count 3 --prev-kv", "del tx/lock", "get tx/count"], []))
    revision = success["header"]["revision"]
    assert success["succeeded"] is True
    put, delete, get = (response["Response"] for response in success["responses"])
    assert unb64(put["ResponsePut"]["prev_kv"]["value"]) == "2"
    assert delete["ResponseDeleteRange"]["deleted"] == 1
    assert get["ResponseRange"]["kvs"][0] == {"key": b64("tx/count"), "value": b64("3"), "version": 3,
                                              "create_revision": get["ResponseRange"]["kvs"][0]["create_revision"],
                                              "mod_revision": revision}
    failure = js(f, "txn", stdin=txn_input(['mod("tx/count") < "2"'], ["put tx/count never"], ["get tx/count"]))
    assert "succeeded" not in failure  # false: left out of etcdctl's JSON
    assert failure["header"]["revision"] == revision  # a read-only branch writes nothing
    assert pairs(failure["responses"][0]["Response"]["ResponseRange"]) == [("tx/count", "3")]

    refused = etcdctl(f, "txn", stdin=txn_input([], ["put tx/x 1", "put tx/x 2"], []))
    assert refused.returncode != 0
    assert "Error: etcdserver: duplicate key given in txn request" in refused.stderr


def test_member_list_names_the_three_members(roles: Roles):
    for endpoint in (roles.follower, roles.leader):
        listed = js(endpoint, "member", "list")
        members = sorted(listed["members"], key=lambda member: member["name"])
        assert [member["name"] for member in members] == ["n1", "n2", "n3"]
        assert [member["clientURLs"] for member in members] == [
            [f"http://{roles.cluster.nodes[name].address}"] for name in ("n1", "n2", "n3")]
        assert [member["peerURLs"] for member in members] == [
            [f"http://{roles.cluster.nodes[name].peer_address}"] for name in ("n1", "n2", "n3")]
        assert len({member["ID"] for member in members}) == 3
    table = ok(roles.follower, "member", "list")  # the simple form: id, status, name, peer and client URLs
    assert sorted(line.split(", ")[2] for line in table.splitlines()) == ["n1", "n2", "n3"]


def test_endpoint_status_and_health_of_every_member(roles: Roles):
    ids = member_ids(roles)
    by_address = {roles.cluster.nodes[name].address: ids[name] for name in ids}
    statuses = js(roles.all, "endpoint", "status")
    assert sorted(entry["Endpoint"] for entry in statuses) == sorted(roles.all)
    for entry in statuses:
        status = entry["Status"]
        assert status["header"]["member_id"] == by_address[entry["Endpoint"]]
        assert status["leader"] == ids[roles.leader_id]
        assert status["raftTerm"] == roles.term
        assert status["version"] and status["dbSize"] > 0
        assert status["raftIndex"] >= status["raftAppliedIndex"] > 0
    assert len({entry["Status"]["header"]["cluster_id"] for entry in statuses}) == 1

    health = js(roles.all, "endpoint", "health")
    assert sorted(entry["endpoint"] for entry in health) == sorted(roles.all)
    assert all(entry["health"] is True and "error" not in entry for entry in health), health
    plain = etcdctl(roles.all, "endpoint", "health")  # the simple form goes to stderr
    assert plain.returncode == 0 and plain.stderr.count("is healthy: successfully committed proposal") == 3, plain


def test_a_forwarded_answer_names_the_member_that_sent_it(roles: Roles):
    ids = member_ids(roles)
    assert js(roles.follower, "get", "fw/key", "--consistency=s")["header"]["member_id"] == ids[roles.follower_id]
    put = js(roles.follower, "put", "fw/key", "v")  # forwarded to the leader
    got = js(roles.follower, "get", "fw/key")  # linearizable: forwarded too
    names = {number: name for name, number in ids.items()}
    assert (names[put["header"]["member_id"]], names[got["header"]["member_id"]]) == (roles.follower_id,) * 2, \
        f"a put and a get sent to {roles.follower_id} answer with these members' ids in their headers"


def etcdctl_stream(endpoint: str, *args: str) -> Stream:
    """etcdctl running until stopped (watch, lease keep-alive), its stdout lines read with a deadline."""
    assert ETCDCTL is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return Stream([ETCDCTL, f"--endpoints={endpoint}", "--dial-timeout=5s", *args], env)


def test_watch_through_a_follower(roles: Roles):
    """etcdctl watch against raftkv: a follower serves it from its applied state, each change once,
    in revision order, printed as etcdctl prints etcd's; from now and from a past revision."""
    f = roles.follower
    with etcdctl_stream(f, "watch", "--prefix", "wt/", "--prev-kv") as watch:
        wait_for_watch(watch, lambda value: ok(roles.leader, "put", "wt/ready", value), b"wt/ready")
        first = js(f, "put", "wt/a", "1")["header"]["revision"]
        ok(f, "put", "wt/a", "two words")
        ok(f, "put", "wtx", "outside the prefix")
        assert ok(f, "del", "wt/a") == "1\n"
        ok(f, "txn", stdin=txn_input([], ["put wt/b bee", "put wt/c sea"], []))  # two events, one revision
        assert watch.lines(19) == [b"PUT", b"wt/a", b"1",
                                   b"PUT", b"wt/a", b"1", b"wt/a", b"two words",
                                   b"DELETE", b"wt/a", b"two words", b"wt/a", b"",
                                   b"PUT", b"wt/b", b"bee", b"PUT", b"wt/c", b"sea"]

    # From the history, -w json: etcd's events, the header of each response from the member serving it.
    member_id = member_ids(roles)[roles.follower_id]
    with etcdctl_stream(f, "watch", "--prefix", "wt/", f"--rev={first}", "-w", "json") as watch:
        responses: list[dict[str, Any]] = []
        while sum(len(response["Events"]) for response in responses) < 5:
            responses += [json.loads(line) for line in watch.lines(1)]
    events = [event for response in responses for event in response["Events"]]
    assert [(event.get("type", 0), unb64(event["kv"]["key"]), unb64(event["kv"].get("value", "")),
             event["kv"]["mod_revision"]) for event in events] == [
        (0, "wt/a", "1", first), (0, "wt/a", "two words", first + 1), (1, "wt/a", "", first + 3),
        (0, "wt/b", "bee", first + 4), (0, "wt/c", "sea", first + 4)]
    assert events[0]["kv"] == {"key": b64("wt/a"), "value": b64("1"), "create_revision": first,
                               "mod_revision": first, "version": 1}
    for response in responses:
        assert response["Header"]["member_id"] == member_id
        assert response["Header"]["revision"] >= response["Events"][-1]["kv"]["mod_revision"]


def test_lease_grant_keep_alive_timetolive_list_revoke_through_a_follower(roles: Roles):
    """etcdctl lease against raftkv, through a follower (which sends each call on to the leader):
    etcdctl's lines and JSON; a leased key goes with its lease, revoked or expired."""
    f = roles.follower
    granted = js(f, "lease", "grant", "60")
    lease_id, lease = granted["ID"], f"{granted['ID']:016x}"
    assert (granted["TTL"], granted["Error"]) == (60, "")
    ok(f, "put", "ls/a", "v", f"--lease={lease}")
    ok(f, "put", "ls/b", "w", f"--lease={lease}")
    assert js(roles.leader, "get", "ls/a")["kvs"][0]["lease"] == lease_id

    line = ok(f, "lease", "timetolive", lease, "--keys")
    pattern = rf"lease {lease} granted with TTL\(60s\), remaining\((\d+)s\), attached keys\(\[ls/a ls/b\]\)\n"
    assert re.fullmatch(pattern, line), line
    as_json = js(f, "lease", "timetolive", lease, "--keys")
    assert (as_json["id"], as_json["granted-ttl"], as_json["keys"]) == (lease_id, 60, [b64("ls/a"), b64("ls/b")])
    assert 0 < as_json["ttl"] <= 60
    assert ok(f, "lease", "keep-alive", "--once", lease) == f"lease {lease} keepalived with TTL(60)\n"
    assert js(f, "lease", "keep-alive", "--once", lease)["TTL"] == 60

    def listed() -> list[str] | None:  # a follower lists the leases it has applied, as etcd's
        ids = ok(f, "lease", "list").splitlines()
        return ids if lease in ids[1:] else None
    ids = wait_until("the follower to list the lease", listed, timeout=15)
    assert ids[0] == f"found {len(ids) - 1} leases"
    assert {"id": lease_id} in js(f, "lease", "list")["leases"]

    # keep-alive until the lease is gone: a renewal every third of its TTL, then etcdctl's last line.
    short = f"{js(f, 'lease', 'grant', '6')['ID']:016x}"
    with etcdctl_stream(f, "lease", "keep-alive", short) as keep_alive:
        assert keep_alive.lines(2) == [f"lease {short} keepalived with TTL(6)".encode()] * 2
        assert ok(f, "lease", "revoke", short) == f"lease {short} revoked\n"
        while (found := keep_alive.line()) == f"lease {short} keepalived with TTL(6)".encode():
            pass
        assert found == f"lease {short} expired or revoked.".encode()
        assert keep_alive.wait() == (0, b"")

    # revoke: the keys go, in one revision; the lease is gone for every command after.
    before = js(roles.leader, "get", "ls/a")["header"]["revision"]
    assert ok(f, "lease", "revoke", lease) == f"lease {lease} revoked\n"
    after = js(roles.leader, "get", "--prefix", "ls/")
    assert "kvs" not in after and after["header"]["revision"] == before + 1
    assert ok(f, "lease", "timetolive", lease) == f"lease {lease} already expired\n"
    again = etcdctl(f, "lease", "revoke", lease)
    assert again.returncode != 0 and "requested lease not found" in again.stderr
    once = etcdctl(f, "lease", "keep-alive", "--once", lease)
    assert once.returncode != 0 and "requested lease not found" in once.stderr

    # Expiry: no keep-alive for the TTL (the cluster's minimum here), and the key is deleted.
    expiring = js(f, "lease", "grant", "1")
    assert expiring["TTL"] >= 2  # raised to 1.5 election timeouts, in whole seconds
    ok(f, "put", "ls/short", "v", f"--lease={expiring['ID']:x}")
    wait_until("the key of the expired lease to go",
               lambda: "kvs" not in js(roles.leader, "get", "ls/short"), timeout=expiring["TTL"] + 15)
    assert ok(f, "lease", "timetolive", f"{expiring['ID']:x}") == f"lease {expiring['ID']:016x} already expired\n"


def test_compaction_hashkv_and_snapshot(roles: Roles, tmp_path: Path):
    """Last in the module: the compaction refuses every later read below its revision."""
    f = roles.follower
    first = js(f, "put", "cp/key", "v1")["header"]["revision"]
    js(f, "put", "cp/key", "v2")
    top = js(f, "put", "cp/other", "x")["header"]["revision"]
    assert ok(f, "compact", str(top - 1)) == f"compacted revision {top - 1}\n"

    below = etcdctl(f, "get", "cp/key", f"--rev={first}")
    assert below.returncode != 0 and below.stdout == ""
    assert f"Error: {COMPACTED}" in below.stderr
    assert pairs(js(f, "get", "cp/key", f"--rev={top - 1}")) == [("cp/key", "v2")]  # the compacted revision itself

    # Every member compacted: a serializable read below the revision is refused on each.
    def refused_everywhere() -> bool:
        return all(COMPACTED in etcdctl(endpoint, "get", "cp/key", f"--rev={first}", "--consistency=s").stderr
                   for endpoint in roles.all)
    wait_until("every member to refuse a read below the compaction", refused_everywhere, timeout=15)
    again = etcdctl(roles.leader, "compact", str(first))
    assert again.returncode != 0 and f"Error: {COMPACTED}" in again.stderr
    future = etcdctl(roles.leader, "get", "cp/key", f"--rev={top + 1000}")
    assert future.returncode != 0 and "required revision is a future revision" in future.stderr

    # endpoint hashkv: the same hash on the three members, at a given revision and at their newest.
    at_top = js(roles.all, "endpoint", "hashkv", f"--rev={top}")
    assert sorted(entry["Endpoint"] for entry in at_top) == sorted(roles.all)
    assert len({entry["HashKV"]["hash"] for entry in at_top}) == 1, at_top
    assert {entry["HashKV"]["compact_revision"] for entry in at_top} == {top - 1}

    def newest_hashes() -> list[dict[str, Any]] | None:
        entries = js(roles.all, "endpoint", "hashkv")
        same = len({(e["HashKV"]["hash"], e["HashKV"]["header"]["revision"]) for e in entries}) == 1
        return entries if same and len(entries) == 3 else None
    newest = wait_until("equal hashes on the three members", newest_hashes, timeout=15)
    assert newest[0]["HashKV"]["header"]["revision"] >= top

    # snapshot save through the follower: a file, and etcdctl's word for it.
    saved = etcdctl(f, "snapshot", "save", "backup.db", cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr
    assert "Snapshot saved at backup.db" in saved.stdout
    assert (tmp_path / "backup.db").stat().st_size > 0
    assert not (tmp_path / "backup.db.part").exists()
