"""etcd's Auth service on raftkv (kv/server/etcd_auth.py) and the auth checks of every etcd call,
judged against a real etcd 3.4.23 (one member) beside a three-member raftkv, each test on fresh
stores:

- etcdctl's whole auth flow (users, roles, a prefix permission, auth enable, logins, refusals,
  password change, revokes, deletes, auth disable), each command run against etcd and against a
  raftkv member (a follower for most, the leader for some): exit status, output (`-w json` where
  etcdctl has it, with the member fields of headers left out) and etcdctl's "Error:" lines must
  be equal;
- the refusals etcd's API gives, each sent as a raw gRPC call to both (through a raftkv follower)
  and compared by code and message, with the deliberate differences written out
  (docs/etcd-compatibility.md);
- watches and leases: a watch of a range the user may not read is cancelled at its creation;
  revoking a lease, or attaching a key to it, needs write permission on every key it holds."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftkv_proto import etcd_auth_pb2 as authpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.test_etcd_api_details import Answer, answer
from tests.integration.test_etcd_differential import (
    ETCD,
    ETCDCTL,
    Etcd,
    Outcome,
    etcdctl,
    start_etcd,
    wait_healthy,
    without_member_fields,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ETCD is None or ETCDCTL is None,
                       reason="needs etcd and etcdctl 3.4 on PATH (Debian: apt-get install etcd-server etcd-client)"),
]

CALL_TIMEOUT_S = 15
ROOT = "root:root-pw"
ALICE = "alice:alice-pw"


@dataclass
class Stores:
    """A real etcd and a three-member raftkv, both serving."""

    etcd: Etcd
    cluster: Cluster
    leader: str
    follower: str

    def endpoint(self, via: str) -> str:
        """The raftkv member to ask: "follower" or "leader"."""
        return self.cluster.nodes[self.follower if via == "follower" else self.leader].address

    def logs(self) -> str:
        return f"etcd: {self.etcd.log_path}\n{self.cluster.log_tails()}"


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    etcd = start_etcd(tmp_path / "etcd")
    cluster = Cluster(tmp_path / "raftkv", 3)
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        follower = next(node for node in sorted(cluster.nodes) if node != leader)
        wait_healthy("etcd", etcd.endpoint, etcd.check_alive)
        for node in cluster.nodes.values():
            wait_healthy("raftkv", node.address, node.check_alive)
        yield Stores(etcd, cluster, leader, follower)
    finally:
        cluster.close()
        etcd.kill()


# ---- etcdctl's auth flow ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    args: tuple[str, ...]
    user: str | None = None  # etcdctl's --user NAME:PASSWORD
    stdin: str | None = None
    json: bool = False  # add -w json and compare the parsed output
    via: str = "follower"  # the raftkv member asked
    refused: bool = False  # etcd refuses it: a non-zero exit and an Error line

    def command(self) -> str:
        user = f" --user {self.user}" if self.user else ""
        return f"etcdctl{user} {' '.join(self.args)}" + (" -w json" if self.json else "") + f" (raftkv's {self.via})"


def new_user(name: str, password: str, **kwargs: Any) -> Step:
    return Step(("user", "add", name, f"--new-user-password={password}", "--interactive=false"), **kwargs)


FLOW: list[Step] = [
    Step(("auth", "enable"), refused=True),                                      # root user does not exist
    new_user("root", "root-pw"),
    new_user("root", "again", refused=True),                                    # user name already exists
    Step(("role", "add", "app")),
    Step(("role", "add", "app"), refused=True, via="leader"),                   # role name already exists
    Step(("role", "grant-permission", "app", "readwrite", "/app/", "--prefix")),
    Step(("role", "grant-permission", "app", "read", "/pub", "--from-key"), via="leader"),
    Step(("role", "grant-permission", "app", "write", "/one")),
    Step(("role", "grant-permission", "nope", "read", "/x"), refused=True),     # role name not found
    Step(("role", "get", "app")),
    Step(("role", "get", "app"), json=True),
    new_user("alice", "alice-pw", json=True),
    Step(("user", "grant-role", "alice", "app")),
    Step(("user", "grant-role", "alice", "nope"), refused=True),                # role name not found
    Step(("user", "grant-role", "nobody", "app"), refused=True),                # user name not found
    Step(("user", "get", "alice")),
    Step(("user", "get", "alice", "--detail")),
    Step(("user", "list")),
    Step(("role", "list"), json=True),
    Step(("auth", "enable")),                                                   # adds the root role itself
    Step(("get", "/app/x"), refused=True),                                      # no user
    Step(("put", "/app/x", "1"), user=ALICE),
    Step(("put", "/app/y", "2"), user=ALICE, via="leader"),
    Step(("get", "/app/", "--prefix"), user=ALICE, json=True),
    Step(("put", "/other", "1"), user=ALICE, refused=True),                     # outside the prefix
    Step(("get", "/other"), user=ALICE, refused=True, via="leader"),
    Step(("del", "/app/y", "--prev-kv"), user=ALICE),
    Step(("put", "/one", "w"), user=ALICE),                                     # write-only key
    Step(("get", "/one"), user=ALICE, refused=True),
    Step(("get", "/pub/z"), user=ALICE),                                        # read from /pub on
    Step(("get", "/app/x"), user="alice:wrong", refused=True),                  # wrong password
    Step(("get", "/app/x"), user="nobody:pw", refused=True),
    Step(("user", "list"), user=ALICE, refused=True),                           # not root
    Step(("user", "get", "alice"), user=ALICE),                                 # itself: allowed
    Step(("role", "get", "app"), user=ALICE, via="leader"),                     # its role: allowed
    Step(("role", "get", "root"), user=ALICE, refused=True),
    Step(("user", "get", "root"), user=ROOT),
    Step(("user", "list"), user=ROOT, json=True),
    Step(("role", "list"), user=ROOT),
    Step(("role", "get", "root"), user=ROOT),
    Step(("user", "passwd", "alice", "--interactive=false"), user=ROOT, stdin="alice-new\n"),
    Step(("get", "/app/x"), user=ALICE, refused=True),                          # the old password
    Step(("get", "/app/x"), user="alice:alice-new", via="leader"),
    Step(("role", "revoke-permission", "app", "/app/", "--prefix"), user=ROOT),
    Step(("role", "revoke-permission", "app", "/app/", "--prefix"), user=ROOT, refused=True),  # not granted
    Step(("get", "/app/x"), user="alice:alice-new", refused=True),
    Step(("user", "revoke-role", "alice", "app"), user=ROOT),
    Step(("user", "revoke-role", "alice", "app"), user=ROOT, refused=True),   # not granted
    Step(("user", "get", "alice"), user=ROOT, json=True),
    Step(("user", "delete", "root"), user=ROOT, refused=True),                 # invalid auth management
    Step(("user", "revoke-role", "root", "root"), user=ROOT, refused=True),
    Step(("role", "delete", "root"), user=ROOT, refused=True),
    Step(("user", "delete", "alice"), user=ROOT),
    Step(("user", "delete", "alice"), user=ROOT, refused=True),                # user name not found
    Step(("get", "/app/x"), user="alice:alice-new", refused=True),
    Step(("role", "delete", "app"), user=ROOT, via="leader"),
    Step(("role", "get", "app"), user=ROOT, refused=True),
    Step(("auth", "disable"), user=ROOT),
    Step(("get", "/app/", "--prefix"), json=True),                              # open again
    Step(("role", "delete", "root")),
    Step(("user", "delete", "root"), json=True),
]


def run_flow(endpoint_of: Callable[[Step], str], cwd: Path) -> list[dict[str, Any]]:
    results = []
    for step in FLOW:
        args = (*(("--user", step.user) if step.user else ()), *step.args, *(("-w", "json") if step.json else ()))
        endpoint = endpoint_of(step)
        outcome = etcdctl(endpoint, args, step.stdin, cwd)
        results.append(compared(step, outcome))
    return results


def compared(step: Step, outcome: Outcome) -> dict[str, Any]:
    out: Any = outcome.stdout
    if step.json and outcome.code == 0:
        out = without_member_fields(json.loads(outcome.stdout))
    return {"exit": outcome.code, "out": out, "errors": list(outcome.errors)}


def test_etcdctl_auth_flow_on_three_members_matches_etcd(stores: Stores, tmp_path: Path) -> None:
    theirs = run_flow(lambda step: stores.etcd.endpoint, tmp_path)
    ours = run_flow(lambda step: stores.endpoint(step.via), tmp_path)
    unexpected = [f"{step.command()}: {outcome}" for step, outcome in zip(FLOW, theirs)
                  if (outcome["exit"] != 0) != step.refused or (step.refused and not outcome["errors"])]
    assert not unexpected, "etcd did not do what the flow expects:\n" + "\n".join(unexpected)
    differences = [f"{step.command()}\n    etcd:   {a}\n    raftkv: {b}"
                   for step, a, b in zip(FLOW, theirs, ours) if a != b]
    assert not differences, (f"{len(differences)} of {len(FLOW)} etcdctl commands differ ({stores.logs()}):\n"
                             + "\n".join(differences))
