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
    Etcd,
    Outcome,
    etcdctl,
    start_etcd,
    wait_healthy,
    without_member_fields,
)
from tests.integration.real_etcd import needs_etcd

pytestmark = [
    pytest.mark.integration,
    needs_etcd,
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

    def settle(self) -> None:
        """Return once the follower has applied all the leader has committed: what the follower
        answers from its own state (a serializable read, a watch's header) is then as fresh as
        etcd's one member."""
        self.cluster.wait_applied(self.follower, self.cluster.status(self.leader)["commit_index"])

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


# ---- refusals, as raw gRPC calls ---------------------------------------------------------------------

PASSWORDS = {"root": "root-pw", "alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
# alice reads and writes /app/, bob only reads it, carol only writes it.
ROLES = {"app": ("alice", authpb.Permission.READWRITE), "reader": ("bob", authpb.Permission.READ),
         "writer": ("carol", authpb.Permission.WRITE)}


class Calls:
    """etcd's stubs on one endpoint, and each user's token there ("anon": none, "bogus": a forged one)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.auth = etcd_rpc_pb2_grpc.AuthStub(channel)
        self.kv = etcd_rpc_pb2_grpc.KVStub(channel)
        self.lease = etcd_rpc_pb2_grpc.LeaseStub(channel)
        self.watch = etcd_rpc_pb2_grpc.WatchStub(channel)
        self.maintenance = etcd_rpc_pb2_grpc.MaintenanceStub(channel)
        self.cluster = etcd_rpc_pb2_grpc.ClusterStub(channel)
        self.tokens: dict[str, str] = {"bogus": "bogus.1.2.3"}

    def set_up(self) -> None:
        """The same users, roles and keys on either store, then auth on and everyone logged in."""
        auth = self.auth
        for user, password in PASSWORDS.items():
            auth.UserAdd(pb.AuthUserAddRequest(name=user, password=password), timeout=CALL_TIMEOUT_S)
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=CALL_TIMEOUT_S)
        for role, (user, perm_type) in ROLES.items():
            auth.RoleAdd(pb.AuthRoleAddRequest(name=role), timeout=CALL_TIMEOUT_S)
            auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
                name=role, perm=authpb.Permission(permType=perm_type, key=b"/app/", range_end=b"/app0")),
                timeout=CALL_TIMEOUT_S)
            auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user=user, role=role), timeout=CALL_TIMEOUT_S)
        self.kv.Put(pb.PutRequest(key=b"/app/k", value=b"v"), timeout=CALL_TIMEOUT_S)
        self.kv.Put(pb.PutRequest(key=b"/secret", value=b"s"), timeout=CALL_TIMEOUT_S)
        auth.AuthEnable(pb.AuthEnableRequest(), timeout=CALL_TIMEOUT_S)
        for user, password in PASSWORDS.items():
            self.tokens[user] = auth.Authenticate(pb.AuthenticateRequest(name=user, password=password),
                                                  timeout=CALL_TIMEOUT_S).token

    def md(self, user: str) -> tuple[tuple[str, str], ...]:
        return () if user == "anon" else (("token", self.tokens[user]),)

    def first_watch_response(self, user: str, key: bytes, range_end: bytes = b"") -> pb.WatchResponse:
        """What a watch stream answers a create request with."""
        create = pb.WatchCreateRequest(key=key, range_end=range_end)
        call = self.watch.Watch(iter([pb.WatchRequest(create_request=create)]), metadata=self.md(user),
                                timeout=CALL_TIMEOUT_S)
        try:
            return next(call)
        finally:
            call.cancel()


@dataclass(frozen=True)
class Case:
    name: str
    expected: str  # what etcd answers: "OK" or a gRPC code's name
    call: Callable[[Calls], Any]
    # What raftkv answers where it differs from etcd by design (docs/etcd-compatibility.md): a
    # refusal's code, or a cancelled watch's reason (`summary`); and why.
    deliberate: tuple[str, str] | None = None


def summary(found: Answer) -> str:
    """An answer in brief: a refusal's code, a cancelled watch's reason, else "OK"."""
    return found[1] if found[0] == "error" else found[1].get("cancel_reason", "OK")


def put(key: bytes, lease: int = 0, prev_kv: bool = False) -> pb.PutRequest:
    return pb.PutRequest(key=key, value=b"x", lease=lease, prev_kv=prev_kv)


def txn(*ops: pb.RequestOp, compare: tuple[pb.Compare, ...] = ()) -> pb.TxnRequest:
    return pb.TxnRequest(compare=compare, success=ops)


T = CALL_TIMEOUT_S
ROOT_ONLY = "raftkv lets only root compact, raise or clear alarms (etcd 3.4 lets anyone, even with no user)"
REFUSALS: list[Case] = [
    # -- logins and the Auth service
    Case("a wrong password", "INVALID_ARGUMENT",
         lambda c: c.auth.Authenticate(pb.AuthenticateRequest(name="alice", password="no"), timeout=T)),
    Case("an unknown user's login", "INVALID_ARGUMENT",
         lambda c: c.auth.Authenticate(pb.AuthenticateRequest(name="nobody", password="no"), timeout=T)),
    Case("user list with no user", "INVALID_ARGUMENT",
         lambda c: c.auth.UserList(pb.AuthUserListRequest(), timeout=T)),
    Case("user list with a forged token", "UNAUTHENTICATED",
         lambda c: c.auth.UserList(pb.AuthUserListRequest(), metadata=c.md("bogus"), timeout=T)),
    Case("user list by alice", "PERMISSION_DENIED",
         lambda c: c.auth.UserList(pb.AuthUserListRequest(), metadata=c.md("alice"), timeout=T)),
    Case("alice gets herself", "OK",
         lambda c: c.auth.UserGet(pb.AuthUserGetRequest(name="alice"), metadata=c.md("alice"), timeout=T)),
    Case("alice gets bob", "PERMISSION_DENIED",
         lambda c: c.auth.UserGet(pb.AuthUserGetRequest(name="bob"), metadata=c.md("alice"), timeout=T)),
    Case("alice gets her role", "OK",
         lambda c: c.auth.RoleGet(pb.AuthRoleGetRequest(role="app"), metadata=c.md("alice"), timeout=T)),
    Case("alice gets another role", "PERMISSION_DENIED",
         lambda c: c.auth.RoleGet(pb.AuthRoleGetRequest(role="reader"), metadata=c.md("alice"), timeout=T)),
    Case("auth disable by alice", "PERMISSION_DENIED",
         lambda c: c.auth.AuthDisable(pb.AuthDisableRequest(), metadata=c.md("alice"), timeout=T)),
    Case("auth enable with no user", "INVALID_ARGUMENT",
         lambda c: c.auth.AuthEnable(pb.AuthEnableRequest(), timeout=T)),
    Case("auth enable again", "OK",
         lambda c: c.auth.AuthEnable(pb.AuthEnableRequest(), metadata=c.md("root"), timeout=T)),
    Case("a user with no name", "INVALID_ARGUMENT",
         lambda c: c.auth.UserAdd(pb.AuthUserAddRequest(name="", password="p"), metadata=c.md("root"), timeout=T)),
    Case("a user twice", "FAILED_PRECONDITION",
         lambda c: c.auth.UserAdd(pb.AuthUserAddRequest(name="bob", password="p"), metadata=c.md("root"), timeout=T)),
    Case("a user with an empty password", "OK",
         lambda c: c.auth.UserAdd(pb.AuthUserAddRequest(name="dave", password=""), metadata=c.md("root"), timeout=T),
         ("INVALID_ARGUMENT", "raftkv keeps no user without a password")),
    Case("a user without a password (no_password)", "OK",
         lambda c: c.auth.UserAdd(pb.AuthUserAddRequest(name="erin", options=authpb.UserAddOptions(no_password=True)),
                                  metadata=c.md("root"), timeout=T),
         ("INVALID_ARGUMENT", "raftkv keeps no user without a password")),
    Case("a role with no name", "INVALID_ARGUMENT",
         lambda c: c.auth.RoleAdd(pb.AuthRoleAddRequest(name=""), metadata=c.md("root"), timeout=T)),
    Case("a role twice", "FAILED_PRECONDITION",
         lambda c: c.auth.RoleAdd(pb.AuthRoleAddRequest(name="app"), metadata=c.md("root"), timeout=T)),
    Case("deleting root", "INVALID_ARGUMENT",
         lambda c: c.auth.UserDelete(pb.AuthUserDeleteRequest(name="root"), metadata=c.md("root"), timeout=T)),
    Case("revoking root's root role", "INVALID_ARGUMENT",
         lambda c: c.auth.UserRevokeRole(pb.AuthUserRevokeRoleRequest(name="root", role="root"),
                                         metadata=c.md("root"), timeout=T)),
    Case("deleting the root role", "INVALID_ARGUMENT",
         lambda c: c.auth.RoleDelete(pb.AuthRoleDeleteRequest(role="root"), metadata=c.md("root"), timeout=T)),
    Case("deleting no user", "FAILED_PRECONDITION",
         lambda c: c.auth.UserDelete(pb.AuthUserDeleteRequest(name="nobody"), metadata=c.md("root"), timeout=T)),
    Case("deleting the empty user name", "FAILED_PRECONDITION",
         lambda c: c.auth.UserDelete(pb.AuthUserDeleteRequest(name=""), metadata=c.md("root"), timeout=T)),
    Case("getting no user", "FAILED_PRECONDITION",
         lambda c: c.auth.UserGet(pb.AuthUserGetRequest(name="nobody"), metadata=c.md("root"), timeout=T)),
    Case("no user's password", "FAILED_PRECONDITION",
         lambda c: c.auth.UserChangePassword(pb.AuthUserChangePasswordRequest(name="nobody", password="p"),
                                             metadata=c.md("root"), timeout=T)),
    Case("granting to no user", "FAILED_PRECONDITION",
         lambda c: c.auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="nobody", role="app"),
                                        metadata=c.md("root"), timeout=T)),
    Case("granting no role", "FAILED_PRECONDITION",
         lambda c: c.auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="alice", role="nope"),
                                        metadata=c.md("root"), timeout=T)),
    Case("revoking a role not granted", "FAILED_PRECONDITION",
         lambda c: c.auth.UserRevokeRole(pb.AuthUserRevokeRoleRequest(name="alice", role="reader"),
                                         metadata=c.md("root"), timeout=T)),
    Case("getting no role", "FAILED_PRECONDITION",
         lambda c: c.auth.RoleGet(pb.AuthRoleGetRequest(role="nope"), metadata=c.md("root"), timeout=T)),
    Case("deleting no role", "FAILED_PRECONDITION",
         lambda c: c.auth.RoleDelete(pb.AuthRoleDeleteRequest(role="nope"), metadata=c.md("root"), timeout=T)),
    Case("a permission for no role", "FAILED_PRECONDITION",
         lambda c: c.auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
             name="nope", perm=authpb.Permission(key=b"/x")), metadata=c.md("root"), timeout=T)),
    Case("revoking a permission not granted", "FAILED_PRECONDITION",
         lambda c: c.auth.RoleRevokePermission(pb.AuthRoleRevokePermissionRequest(role="app", key=b"/zz"),
                                               metadata=c.md("root"), timeout=T)),
    # -- KV
    Case("a range with no user", "INVALID_ARGUMENT", lambda c: c.kv.Range(pb.RangeRequest(key=b"/app/k"), timeout=T)),
    Case("a range with a forged token", "UNAUTHENTICATED",
         lambda c: c.kv.Range(pb.RangeRequest(key=b"/app/k"), metadata=c.md("bogus"), timeout=T)),
    Case("bob reads /app/", "OK",
         lambda c: c.kv.Range(pb.RangeRequest(key=b"/app/", range_end=b"/app0"), metadata=c.md("bob"), timeout=T)),
    Case("bob reads serializably", "OK",
         lambda c: c.kv.Range(pb.RangeRequest(key=b"/app/k", serializable=True), metadata=c.md("bob"), timeout=T)),
    Case("bob reads outside", "PERMISSION_DENIED",
         lambda c: c.kv.Range(pb.RangeRequest(key=b"/secret"), metadata=c.md("bob"), timeout=T)),
    Case("bob reads from /app/ on", "PERMISSION_DENIED",
         lambda c: c.kv.Range(pb.RangeRequest(key=b"/app/", range_end=b"\0"), metadata=c.md("bob"), timeout=T)),
    Case("bob writes", "PERMISSION_DENIED", lambda c: c.kv.Put(put(b"/app/k"), metadata=c.md("bob"), timeout=T)),
    Case("alice writes", "OK", lambda c: c.kv.Put(put(b"/app/a"), metadata=c.md("alice"), timeout=T)),
    Case("alice writes outside", "PERMISSION_DENIED",
         lambda c: c.kv.Put(put(b"/secret"), metadata=c.md("alice"), timeout=T)),
    Case("carol writes", "OK", lambda c: c.kv.Put(put(b"/app/c"), metadata=c.md("carol"), timeout=T)),
    Case("carol puts with prev_kv", "PERMISSION_DENIED",
         lambda c: c.kv.Put(put(b"/app/c", prev_kv=True), metadata=c.md("carol"), timeout=T)),
    Case("carol deletes with prev_kv", "PERMISSION_DENIED",
         lambda c: c.kv.DeleteRange(pb.DeleteRangeRequest(key=b"/app/c", prev_kv=True), metadata=c.md("carol"),
                                    timeout=T)),
    Case("carol deletes", "OK",
         lambda c: c.kv.DeleteRange(pb.DeleteRangeRequest(key=b"/app/c"), metadata=c.md("carol"), timeout=T)),
    Case("alice deletes outside", "PERMISSION_DENIED",
         lambda c: c.kv.DeleteRange(pb.DeleteRangeRequest(key=b"/app/", range_end=b"\0"), metadata=c.md("alice"),
                                    timeout=T)),
    Case("alice compares outside", "PERMISSION_DENIED",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_put=put(b"/app/t")), compare=(pb.Compare(
             key=b"/secret", target=pb.Compare.VERSION, version=1),)), metadata=c.md("alice"), timeout=T)),
    Case("alice's txn writes outside", "PERMISSION_DENIED",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_put=put(b"/app/t")), pb.RequestOp(request_put=put(b"/s2"))),
                            metadata=c.md("alice"), timeout=T)),
    Case("bob's read-only txn outside", "PERMISSION_DENIED",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_range=pb.RangeRequest(key=b"/secret"))), metadata=c.md("bob"),
                            timeout=T)),
    # -- Maintenance and Cluster: etcd's Maintenance passes the auth store's errors on unmapped
    Case("hash with no user", "UNKNOWN", lambda c: c.maintenance.Hash(pb.HashRequest(), timeout=T)),
    Case("hashkv by alice", "UNKNOWN", lambda c: c.maintenance.HashKV(pb.HashKVRequest(), metadata=c.md("alice"),
                                                                      timeout=T)),
    Case("defragment with a forged token", "UNKNOWN",
         lambda c: c.maintenance.Defragment(pb.DefragmentRequest(), metadata=c.md("bogus"), timeout=T)),
    Case("a snapshot by bob", "UNKNOWN",
         lambda c: next(c.maintenance.Snapshot(pb.SnapshotRequest(), metadata=c.md("bob"), timeout=T))),
    Case("status with no user", "OK", lambda c: pb.StatusResponse(
        version=c.maintenance.Status(pb.StatusRequest(), timeout=T).version and "-")),
    Case("member list with no user", "OK", lambda c: pb.MemberListResponse(
        members=[pb.Member() for _ in c.cluster.MemberList(pb.MemberListRequest(), timeout=T).members[:1]])),
    Case("member add with no user", "INVALID_ARGUMENT",
         lambda c: c.cluster.MemberAdd(pb.MemberAddRequest(peerURLs=["http://127.0.0.1:1"]), timeout=T)),
    Case("member add by alice", "PERMISSION_DENIED",
         lambda c: c.cluster.MemberAdd(pb.MemberAddRequest(peerURLs=["http://127.0.0.1:1"]), metadata=c.md("alice"),
                                       timeout=T)),
    # -- leases (the keys attached: test_watch_and_lease_checks_match_etcd)
    Case("a lease with no user", "OK",
         lambda c: c.lease.LeaseGrant(pb.LeaseGrantRequest(ID=101, TTL=600), timeout=T)),
    Case("a lease with a forged token", "UNAUTHENTICATED",
         lambda c: c.lease.LeaseGrant(pb.LeaseGrantRequest(ID=102, TTL=600), metadata=c.md("bogus"), timeout=T)),
    Case("revoking a keyless lease with no user", "OK",
         lambda c: c.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=101), timeout=T),
         ("INVALID_ARGUMENT", "raftkv refuses a lease revoke that names no user at once (etcd checks the lease's "
                              "keys, and lets it through when there are none)")),
    # -- last: what etcd lets through and raftkv refuses changes etcd's state (its revision)
    Case("carol's txn puts with prev_kv", "OK",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_put=put(b"/app/c", prev_kv=True))), metadata=c.md("carol"),
                            timeout=T),
         ("PERMISSION_DENIED", "etcd 3.4 checks a put's prev_kv outside a transaction only: it would show carol a "
                               "value she may not read")),
    Case("alice's nested txn writes outside", "OK",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_txn=txn(pb.RequestOp(request_put=put(b"/s3"))))),
                            metadata=c.md("alice"), timeout=T),
         ("PERMISSION_DENIED", "etcd 3.4 does not check the ops of a nested transaction")),
    Case("an alarm raised by alice", "OK",
         lambda c: c.maintenance.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=5, alarm=pb.NOSPACE),
                                       metadata=c.md("alice"), timeout=T), ("PERMISSION_DENIED", ROOT_ONLY)),
    Case("an alarm cleared with no user", "OK",
         lambda c: c.maintenance.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=5,
                                                       alarm=pb.NOSPACE), timeout=T), ("INVALID_ARGUMENT", ROOT_ONLY)),
    Case("a compaction with no user", "OK",
         lambda c: c.kv.Compact(pb.CompactionRequest(revision=2), timeout=T), ("INVALID_ARGUMENT", ROOT_ONLY)),
    Case("a compaction by alice", "OK",
         lambda c: c.kv.Compact(pb.CompactionRequest(revision=3), metadata=c.md("alice"), timeout=T),
         ("PERMISSION_DENIED", ROOT_ONLY)),
]


def run_cases(endpoint: str, cases: list[Case], settle: Callable[[], None] = lambda: None) -> dict[str, Answer]:
    """Each case's answer on the store at `endpoint`, set up (Calls.set_up) first; `settle` runs
    before each case."""
    answers: dict[str, Answer] = {}
    with grpc.insecure_channel(endpoint) as channel:
        calls = Calls(channel)
        calls.set_up()
        for case in cases:
            settle()
            answers[case.name] = answer(lambda: case.call(calls))
    return answers


def judge(cases: list[Case], theirs: dict[str, Answer], ours: dict[str, Answer], logs: str) -> None:
    """etcd answers each case as expected; raftkv answers as etcd, or as a deliberate difference says."""
    unexpected = [f"{case.name}: {theirs[case.name]}" for case in cases
                  if (theirs[case.name][0] == "ok") != (case.expected == "OK")
                  or (case.expected != "OK" and theirs[case.name][1] != case.expected)]
    assert not unexpected, "etcd did not answer as the cases expect:\n" + "\n".join(unexpected)
    differing = []
    for case in cases:
        if case.deliberate is None:
            if theirs[case.name] != ours[case.name]:
                differing.append(f"{case.name}:\n    etcd   {theirs[case.name]}\n    raftkv {ours[case.name]}")
        elif summary(ours[case.name]) != case.deliberate[0]:
            differing.append(f"{case.name}: raftkv should answer {case.deliberate[0]} ({case.deliberate[1]}), "
                             f"not {ours[case.name]}")
    assert not differing, f"{len(differing)} of {len(cases)} answers differ ({logs}):\n" + "\n".join(differing)


def test_refusals_match_etcd_by_code_and_message(stores: Stores) -> None:
    theirs = run_cases(stores.etcd.endpoint, REFUSALS)
    ours = run_cases(stores.endpoint("follower"), REFUSALS, stores.settle)
    judge(REFUSALS, theirs, ours, stores.logs())


# ---- watches and leases ------------------------------------------------------------------------------

WATCH_DENIED = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
WATCHES_AND_LEASES: list[Case] = [
    Case("bob watches a key he may not read", "OK", lambda c: c.first_watch_response("bob", b"/secret")),
    Case("bob watches from /app/ on", "OK", lambda c: c.first_watch_response("bob", b"/app/", b"\0"),
         (WATCH_DENIED, "etcd 3.4 checks a watch from a key on (range_end \"\\0\") as one of that key alone")),
    Case("bob watches /app/", "OK", lambda c: c.first_watch_response("bob", b"/app/", b"/app0")),
    Case("a watch with no user", "OK", lambda c: c.first_watch_response("anon", b"/app/k")),
    Case("a watch with a forged token", "OK", lambda c: c.first_watch_response("bogus", b"/app/k")),
    Case("root grants lease 200", "OK",
         lambda c: c.lease.LeaseGrant(pb.LeaseGrantRequest(ID=200, TTL=600), metadata=c.md("root"), timeout=T)),
    Case("root attaches /secret to it", "OK",
         lambda c: c.kv.Put(put(b"/secret", lease=200), metadata=c.md("root"), timeout=T)),
    Case("alice revokes it", "PERMISSION_DENIED",
         lambda c: c.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=200), metadata=c.md("alice"), timeout=T)),
    Case("alice attaches her key to it", "PERMISSION_DENIED",
         lambda c: c.kv.Put(put(b"/app/a", lease=200), metadata=c.md("alice"), timeout=T)),
    Case("alice grants lease 300", "OK",
         lambda c: c.lease.LeaseGrant(pb.LeaseGrantRequest(ID=300, TTL=600), metadata=c.md("alice"), timeout=T)),
    Case("alice attaches her key to hers", "OK",
         lambda c: c.kv.Put(put(b"/app/a", lease=300), metadata=c.md("alice"), timeout=T)),
    Case("bob revokes hers", "PERMISSION_DENIED",
         lambda c: c.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=300), metadata=c.md("bob"), timeout=T)),
    Case("alice revokes hers", "OK",
         lambda c: c.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=300), metadata=c.md("alice"), timeout=T)),
    Case("her key went with it", "OK",
         lambda c: c.kv.Range(pb.RangeRequest(key=b"/app/a"), metadata=c.md("alice"), timeout=T)),
    Case("alice revokes no lease", "NOT_FOUND",
         lambda c: c.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=999), metadata=c.md("alice"), timeout=T)),
    Case("root revokes lease 200", "OK",
         lambda c: c.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=200), metadata=c.md("root"), timeout=T)),
    Case("root grants lease 400 for /secret", "OK",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_put=put(b"/secret", lease=c.lease.LeaseGrant(
             pb.LeaseGrantRequest(ID=400, TTL=600), metadata=c.md("root"), timeout=T).ID))),
             metadata=c.md("root"), timeout=T)),
    # last: etcd lets it through, and its revision moves on
    Case("alice attaches her key to it in a txn", "OK",
         lambda c: c.kv.Txn(txn(pb.RequestOp(request_put=put(b"/app/b", lease=400))), metadata=c.md("alice"),
                            timeout=T),
         ("PERMISSION_DENIED", "etcd 3.4 checks the lease of a put outside a transaction only; then alice could "
                               "attach her key to a lease she could not revoke")),
]


def test_watch_and_lease_checks_match_etcd(stores: Stores) -> None:
    """A watch of a range the user may not read is cancelled at its creation, with etcd's reason;
    a lease is revoked, or a key attached to it, only by a user who may write every key it holds."""
    theirs = run_cases(stores.etcd.endpoint, WATCHES_AND_LEASES)
    ours = run_cases(stores.endpoint("follower"), WATCHES_AND_LEASES, stores.settle)
    judge(WATCHES_AND_LEASES, theirs, ours, stores.logs())
    refused_watch = ours["bob watches a key he may not read"][1]
    assert refused_watch["canceled"] and refused_watch["cancel_reason"] == WATCH_DENIED
    assert "canceled" not in ours["bob watches /app/"][1]
    assert ours["her key went with it"][1].get("kvs") is None
