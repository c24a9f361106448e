"""Users, roles and permissions on a real three-member cluster (docs/security.md): who may read and
write what, logins and tokens (a short --auth-token-ttl, so tokens expire within the test),
admin for root only, client sessions bound to their user, and the auth state through restarts
of every member and a snapshot install on a wiped follower. One cluster for the module: the
tests build on the users and roles `secured` sets up, in file order."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kv import Client, errors
from raftkv_proto import export_pb2, export_pb2_grpc, kv_pb2
from statemachine.auth_state import AUTH_FAILED, INVALID_TOKEN, PERMISSION_DENIED, ROOT_USER_MISSING, AuthHolder
from statemachine.kv_state import KVStateMachine
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until

pytestmark = pytest.mark.integration

TOKEN_TTL_S = 2.0
SNAPSHOT_THRESHOLD = 50
PASSWORDS = {"root": "root-pw", "alice": "alice-pw", "bob": "bob-pw"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("auth"), 3, (*FAST_TIMING, "--auth-token-ttl", str(TOKEN_TTL_S),
                                                          "--snapshot-threshold", str(SNAPSHOT_THRESHOLD)))
    try:
        cluster.start()
        cluster.wait_for_leader()
        yield cluster
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.close()


def as_user(cluster: Cluster, user: str, **kwargs: object) -> Client:
    return cluster.client(user=user, password=PASSWORDS[user], **kwargs)


def test_enabling_auth_without_a_root_user_is_refused(cluster: Cluster) -> None:
    with cluster.client() as client, pytest.raises(errors.FailedPreconditionError, match=ROOT_USER_MISSING):
        client.auth_enable()
    with cluster.client() as client:
        assert client.auth_status() == {"enabled": False}


@pytest.fixture(scope="module")
def secured(cluster: Cluster) -> Cluster:
    """root; alice reads app/ (a prefix); bob reads and writes app/; auth enabled."""
    with cluster.client() as client:
        client.put("app/seed", "1")
        client.put("other/seed", "2")
        for user, password in PASSWORDS.items():
            client.user_add(user, password)
        client.role_add("root")
        client.user_grant_role("root", "root")
        client.role_add("app-reader")
        client.role_grant_permission("app-reader", "app/", prefix=True, perm="read")
        client.role_add("app-writer")
        client.role_grant_permission("app-writer", "app/", prefix=True, perm="readwrite")
        client.user_grant_role("alice", "app-reader")
        client.user_grant_role("bob", "app-writer")
        client.auth_enable()
    return cluster


def test_a_reader_reads_its_prefix_only_and_writes_nothing(secured: Cluster) -> None:
    alice = as_user(secured, "alice")
    assert alice.get("app/seed") == b"1"
    assert alice.scan(prefix="app/") == [(b"app/seed", b"1")]
    with pytest.raises(errors.PermissionDeniedError, match=PERMISSION_DENIED):
        alice.put("app/x", "v")
    with pytest.raises(errors.PermissionDeniedError):
        alice.get("other/seed")
    with pytest.raises(errors.PermissionDeniedError):
        alice.scan(prefix="")  # the whole range is more than app/
    with pytest.raises(errors.PermissionDeniedError):
        alice.batch({"app/y": "v"})


def test_a_readwrite_user_writes_its_prefix_and_nothing_else(secured: Cluster) -> None:
    bob = as_user(secured, "bob")
    bob.put("app/bob", "b")
    assert bob.batch({"app/b1": "1"}, deletes=["app/b1"]) == [False, True]
    assert bob.get("app/bob") == b"b"
    with pytest.raises(errors.PermissionDeniedError):
        bob.batch({"app/b2": "1", "other/b2": "1"})  # one op outside: the batch is refused whole
    assert as_user(secured, "root").get("app/b2") is None


def test_no_login_or_a_wrong_password_is_unauthenticated(secured: Cluster) -> None:
    with secured.client() as anonymous, pytest.raises(errors.UnauthenticatedError):
        anonymous.get("app/seed")
    with pytest.raises(errors.UnauthenticatedError, match=AUTH_FAILED):
        secured.client(user="alice", password="wrong").get("app/seed")
    with pytest.raises(errors.UnauthenticatedError, match=AUTH_FAILED):
        secured.client(user="nobody", password="x").get("app/seed")
    assert secured.client().status()[0]["role"] in ("leader", "follower")  # health checks stay open


def test_a_password_guesser_is_slowed_and_the_right_password_still_gets_in(secured: Cluster) -> None:
    """Failed logins on a name slow its next ones (kv/server/login_throttle.py); the slowing is
    measured in tests/unit/test_login_throttle.py, and here the right password is not locked out."""
    leader = secured.nodes[secured.wait_for_leader()]
    stub = secured.kv_stub(leader.id)
    for guess in range(8):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Authenticate(kv_pb2.AuthenticateRequest(name="bob", password=f"guess-{guess}"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with as_user(secured, "bob") as bob:
        assert bob.get("app/seed") is not None


def token_of(cluster: Cluster, user: str) -> str:
    stub = cluster.kv_stub("n1")
    return stub.Authenticate(kv_pb2.AuthenticateRequest(name=user, password=PASSWORDS[user]), timeout=5).token


def raw_get(cluster: Cluster, token: str, key: bytes = b"app/seed") -> kv_pb2.GetResponse:
    return cluster.kv_stub("n2").Get(kv_pb2.GetRequest(key=key, consistency=kv_pb2.STALE), timeout=5,
                                     metadata=(("token", token),))


def refused_code(call: object) -> grpc.StatusCode | None:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code()
    return None


def test_an_expired_token_is_refused_and_a_client_logs_in_again(secured: Cluster) -> None:
    token = token_of(secured, "alice")
    assert raw_get(secured, token).value == b"1"  # another member than the one that made it
    wait_until("alice's token to expire", lambda: refused(secured, token), timeout=5 * TOKEN_TTL_S)
    with pytest.raises(grpc.RpcError) as refusal:
        raw_get(secured, token)
    assert refusal.value.details() == INVALID_TOKEN
    # A client with a password logs in again by itself when its token expires, on a unary call
    # and on a stream opened with the old token alike.
    for streams in (False, True):
        bob = as_user(secured, "bob", streams=streams)
        bob.put("app/t", "1")
        first_token = bob._credentials.metadata[0][1]
        wait_until("bob's token to expire", lambda: refused(secured, first_token), timeout=5 * TOKEN_TTL_S)
        bob.put("app/t", "2")
        assert bob.get("app/t") == b"2"
        assert bob._credentials.metadata[0][1] != first_token


def refused(cluster: Cluster, token: str) -> bool:
    return refused_code(lambda: raw_get(cluster, token)) == grpc.StatusCode.UNAUTHENTICATED


def test_threads_sharing_a_client_go_on_its_pipeline_as_its_user(secured: Cluster) -> None:
    """Concurrent requests of one process travel on a node's pipeline (kv/client/request_pipeline.py):
    each authenticated client's on its own, with its token, renewed when it expires."""
    bob, alice = as_user(secured, "bob"), as_user(secured, "alice")

    def bob_puts(n: int) -> int:
        return bob.put(f"app/p{n}", str(n))

    def alice_put(n: int) -> str:
        try:
            alice.put(f"app/p{n}", "alice")
        except errors.PermissionDeniedError as e:
            return e.kind
        return "written"

    with ThreadPoolExecutor(8) as pool:
        assert all(index > 0 for index in pool.map(bob_puts, range(64)))
        assert set(pool.map(alice_put, range(64))) == {"PERMISSION_DENIED"}
        first_token = bob._credentials.metadata[0][1]
        wait_until("bob's token to expire", lambda: refused(secured, first_token), timeout=5 * TOKEN_TTL_S)
        assert all(index > 0 for index in pool.map(bob_puts, range(64)))
    assert bob._credentials.metadata[0][1] != first_token
    assert bob.scan(prefix="app/p", limit=1000) == sorted((f"app/p{n}".encode(), str(n).encode()) for n in range(64))


def test_a_forged_token_and_one_of_an_old_password_are_refused(secured: Cluster) -> None:
    token = token_of(secured, "bob")
    user, generation, expiry, mac = token.split(".")
    assert refused_code(lambda: raw_get(secured, ".".join((user, generation, str(int(expiry) + 600), mac)))) \
        == grpc.StatusCode.UNAUTHENTICATED
    root = as_user(secured, "root")
    root.user_change_password("bob", "bob-pw2")
    try:
        # n2 serves raw_get: refused as soon as it has applied the change.
        wait_until("n2 to refuse the token of bob's old password", lambda: refused(secured, token), timeout=10)
    finally:
        root.user_change_password("bob", PASSWORDS["bob"])


def test_a_revoked_permission_holds_from_the_next_request(secured: Cluster) -> None:
    root, bob = as_user(secured, "root"), as_user(secured, "bob")
    bob.put("app/r", "1")
    root.role_revoke_permission("app-writer", "app/", prefix=True)
    try:
        with pytest.raises(errors.PermissionDeniedError):
            bob.put("app/r", "2")
        with pytest.raises(errors.PermissionDeniedError):
            bob.get("app/r")
    finally:
        root.role_grant_permission("app-writer", "app/", prefix=True, perm="readwrite")
    bob.put("app/r", "3")
    assert root.role_get("app-writer")["permissions"] == [{"perm": "readwrite", "key": b"app/", "range_end": b"app0"}]


def test_only_root_administers_takes_snapshots_and_exports(secured: Cluster, tmp_path: Path) -> None:
    alice = as_user(secured, "alice")
    for admin in (lambda: alice.user_add("mallory", "x"), lambda: alice.role_grant_permission("app-reader", "other/"),
                  lambda: alice.user_list(), lambda: alice.save_snapshot(tmp_path / "s.snap")):
        with pytest.raises(errors.PermissionDeniedError):
            admin()
    assert alice.auth_status() == {"enabled": True}
    export = export_pb2_grpc.ExportStub(secured._channel("n1"))
    for token in (token_of(secured, "alice"), None):
        metadata = (("token", token),) if token else None
        code = refused_code(lambda: export.BeginExport(export_pb2.BeginExportRequest(prefix=b"app/"), timeout=5,
                                                       metadata=metadata))
        assert code == (grpc.StatusCode.PERMISSION_DENIED if token else grpc.StatusCode.UNAUTHENTICATED)
    root = as_user(secured, "root")
    assert root.user_list() == ["alice", "bob", "root"]
    assert root.user_get("alice") == {"name": "alice", "roles": ["app-reader"]}
    assert root.save_snapshot(tmp_path / "s.snap")["index"] > 0
    # A cluster restored from the snapshot has the same users, roles and permissions.
    Client.restore_snapshot(tmp_path / "s.snap", tmp_path / "restored")
    holder = AuthHolder()
    KVStateMachine(tmp_path / "restored" / "state", map_size=64 << 20, auth=holder).close()
    assert holder.enabled and sorted(holder.view.users) == ["alice", "bob", "root"]
    assert holder.view.may_read("alice", (b"app/1", b"app/1\0")) and not holder.view.may_write("alice", [(b"app/1", None)])


def test_a_write_on_another_users_session_is_refused(secured: Cluster) -> None:
    leader = secured.wait_for_leader()
    stub = secured.kv_stub(leader)
    bob, root = (("token", token_of(secured, "bob")),), (("token", token_of(secured, "root")),)
    session = stub.RegisterClient(kv_pb2.RegisterClientRequest(name="bob"), timeout=5, metadata=bob).client_id
    request = kv_pb2.PutRequest(key=b"app/s", value=b"root", header=kv_pb2.WriteHeader(client_id=session, seq=1))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Put(request, timeout=5, metadata=root)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    request.value = b"bob"
    stub.Put(request, timeout=5, metadata=bob)
    assert as_user(secured, "root").get("app/s") == b"bob"


def test_bulk_loads_and_exports_go_as_their_user(secured: Cluster, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from kv.tools.spark.bulk_load import BulkLoader
    from kv.tools.spark.export_client import ExportClient
    from kv.tools.spark.parquet_export import export_live

    with BulkLoader(secured.endpoints, user="bob", password=PASSWORDS["bob"]) as loader:
        assert loader.load([(b"app/bulk%d" % i, b"v") for i in range(10)]) == 10
    with pytest.raises(errors.PermissionDeniedError):
        with BulkLoader(secured.endpoints, user="alice", password=PASSWORDS["alice"]) as loader:
            loader.load([(b"app/bulk", b"v")])
    manifest = export_live(secured.endpoints, tmp_path / "out", prefix=b"app/bulk", user="root",
                           password=PASSWORDS["root"])
    assert manifest.rows == 10
    with ExportClient(secured.endpoints, user="bob", password=PASSWORDS["bob"]) as bob:
        with pytest.raises(errors.PermissionDeniedError):
            bob.begin(prefix=b"app/")


def test_auth_survives_a_snapshot_install_on_a_wiped_follower_and_restarts(secured: Cluster) -> None:
    root = as_user(secured, "root")
    leader = secured.wait_for_leader()
    follower = next(n for n in secured.nodes if n != leader)
    secured.kill(follower)
    shutil.rmtree(secured.nodes[follower].spec.data_dir)
    for i in range(3 * SNAPSHOT_THRESHOLD):  # the leader compacts past what the follower had
        root.put(f"app/k{i}", "v")
    secured.start_node(follower)
    commit = secured.status(leader)["commit_index"]
    secured.wait_applied(follower, commit)
    assert "installed a snapshot" in secured.nodes[follower].log_path.read_text(errors="replace")
    for node_id in (follower, *secured.nodes):  # the wiped follower first, then every member restarted
        with Client([secured.nodes[node_id].address], timeout=10, user="alice", password=PASSWORDS["alice"]) as alice:
            assert alice.get("app/seed", consistency="stale") == b"1"
            with pytest.raises(errors.PermissionDeniedError):
                alice.get("other/seed", consistency="stale")
        if node_id != follower:
            secured.restart(node_id)
    secured.wait_for_leader()
    for node_id in secured.nodes:
        with Client([secured.nodes[node_id].address], timeout=10, user="alice", password=PASSWORDS["alice"]) as alice:
            assert alice.get("app/k0", consistency="stale") == b"v"
    assert as_user(secured, "root").auth_status() == {"enabled": True}
