"""TLS on the client port, end to end on real node processes: a cluster started with --cert-file
serves kv.Client(tls=...) and the CLI (flags and RAFTKV_* variables); a client without TLS, or
trusting another CA, is refused with an error that says what to check; with --client-cert-auth a
client needs a certificate the cluster's CA signed; and the members' state checks, which ask each
other's client ports, work over mutual TLS (they find a member whose state differs).

Two clusters, one per class (TLS; TLS with client certificates), each shared by its tests and
stopped before the next starts, keep it short."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import lmdb
import pytest

from kv import TLS, Client
from kv.errors import PermissionDeniedError, UnavailableError
from kv.tools.certs import DEFAULT_HOSTS, ensure_ca, issue
from kv.tools.cluster_up import child_env
from statemachine.value_checksum import seal
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until

pytestmark = pytest.mark.integration

MEMBERS = ("n1", "n2", "n3")
# State checks every second: the mutual TLS test waits for one to find a damaged member.
CHECKED = (*FAST_TIMING, "--state-check-interval", "1")
REFUSED_TIMEOUT_S = 1.0  # a refused client retries until its timeout: keep it short


@dataclass(frozen=True)
class Certs:
    """A CA with member certificates n1..n3 and a client certificate (alice), and a second,
    unrelated CA with a client certificate of its own (mallory)."""

    directory: Path
    ca: Path
    alice: TLS  # trusts the CA, presents alice's certificate
    rogue_ca: Path
    mallory: TLS  # trusts the CA, presents a certificate the CA did not sign

    def member_args(self, client_cert_auth: bool) -> Callable[[str], tuple[str, ...]]:
        def args(node_id: str) -> tuple[str, ...]:
            return ("--cert-file", str(self.directory / f"{node_id}.pem"),
                    "--key-file", str(self.directory / f"{node_id}-key.pem"),
                    "--trusted-ca-file", str(self.ca), *(("--client-cert-auth",) if client_cert_auth else ()))
        return args


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    ca = ensure_ca(directory)
    for member in MEMBERS:
        issue(directory, member, DEFAULT_HOSTS, server=True)
    alice = issue(directory, "alice", server=False)
    rogue = ensure_ca(directory / "rogue")
    mallory = issue(directory / "rogue", "mallory", server=False)
    return Certs(directory, ca.cert, TLS(ca.cert, alice.cert, alice.key), rogue.cert,
                 TLS(ca.cert, mallory.cert, mallory.key))


def started(base: Path, args: Callable[[str], tuple[str, ...]], tls: TLS,
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster = Cluster(base, 3, CHECKED, node_args=args, client_tls=tls)
    failed_before = request.session.testsfailed
    try:
        cluster.start()
        cluster.wait_for_leader()
        yield cluster
    finally:
        if request.session.testsfailed > failed_before:
            print(cluster.log_tails())
        cluster.close()


@pytest.fixture(scope="class")
def tls_cluster(certs: Certs, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """TLS on the client port; clients verify the members with the CA, no client certificates."""
    yield from started(tmp_path_factory.mktemp("tls"), certs.member_args(False), TLS(certs.ca), request)


@pytest.fixture(scope="class")
def mtls_cluster(certs: Certs, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """TLS with --client-cert-auth: clients must present a certificate the CA signed."""
    yield from started(tmp_path_factory.mktemp("mtls"), certs.member_args(True), certs.alice, request)


def raftkv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kv", *args], capture_output=True, text=True, timeout=60,
                          env={**child_env(), **(env or {})})


@pytest.fixture(autouse=True)
def no_tls_variables_from_the_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads RAFTKV_CACERT and friends; a developer's own must not leak into the tests."""
    for variable in ("RAFTKV_CACERT", "RAFTKV_CERT", "RAFTKV_KEY", "RAFTKV_ENDPOINTS"):
        monkeypatch.delenv(variable, raising=False)


class TestTLSCluster:
    """A cluster with TLS on its client port."""

    def test_a_tls_cluster_serves_writes_and_linearizable_reads(self, tls_cluster: Cluster, certs: Certs) -> None:
        with Client(tls_cluster.endpoints, timeout=10.0, tls=TLS(ca_file=certs.ca)) as client:
            client.put("tls/one", "1")
            # Many threads at once: requests share the node's pipeline as well as the request streams.
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: client.put(f"tls/{i:03d}", str(i)), range(64)))
            assert client.get("tls/one") == b"1"
            assert len(client.scan(prefix="tls/", limit=1000)) == 65
        for member in MEMBERS:  # a linearizable read through each member (followers ask the leader)
            with Client([tls_cluster.nodes[member].address], timeout=10.0, tls=TLS(certs.ca)) as client:
                assert client.get("tls/042") == b"42"

    def test_a_plaintext_client_is_refused_and_told_the_node_may_serve_tls(self, tls_cluster: Cluster) -> None:
        with Client(tls_cluster.endpoints, timeout=REFUSED_TIMEOUT_S) as client:
            with pytest.raises(UnavailableError, match=r"TLS: .*if it serves TLS \(--cert-file\), give --cacert"):
                client.get("tls/one")
            assert all("give --cacert" in status["error"] for status in client.status())

    def test_a_client_trusting_another_ca_is_refused_and_told_to_check_its_ca(self, tls_cluster: Cluster,
                                                                               certs: Certs) -> None:
        with Client(tls_cluster.endpoints, timeout=REFUSED_TIMEOUT_S, tls=TLS(certs.rogue_ca)) as client:
            with pytest.raises(UnavailableError, match=r"TLS: the node's certificate was not accepted: is --cacert"):
                client.put("tls/never", "x")

    def test_the_cli_takes_cacert_cert_and_key_as_flags_and_from_the_environment(self, tls_cluster: Cluster,
                                                                                 certs: Certs) -> None:
        endpoints = ",".join(tls_cluster.endpoints)
        tls_flags = ("--cacert", str(certs.ca), "--cert", str(certs.alice.cert_file),
                     "--key", str(certs.alice.key_file))
        put = raftkv("put", "cli/k", "v1", "--endpoints", endpoints, *tls_flags)
        assert put.returncode == 0, put.stderr

        env = {"RAFTKV_ENDPOINTS": endpoints, "RAFTKV_CACERT": str(certs.ca)}
        got = raftkv("get", "cli/k", env=env)
        assert (got.returncode, got.stdout.strip()) == (0, "v1"), got.stderr
        status = raftkv("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert sorted(s["role"] for s in json.loads(status.stdout)) == ["follower", "follower", "leader"]

        refused = raftkv("get", "cli/k", "--endpoints", endpoints, "--timeout", str(REFUSED_TIMEOUT_S),
                         env={"RAFTKV_CACERT": ""})
        assert refused.returncode == 1
        assert "UNAVAILABLE" in refused.stderr and "give --cacert" in refused.stderr


class TestClientCertAuth:
    """A cluster with TLS that requires client certificates (--client-cert-auth)."""

    def test_client_cert_auth_refuses_clients_without_a_certificate_of_its_ca(self, mtls_cluster: Cluster,
                                                                              certs: Certs) -> None:
        with Client(mtls_cluster.endpoints, timeout=REFUSED_TIMEOUT_S, tls=TLS(certs.ca)) as client:
            with pytest.raises(UnavailableError, match=r"TLS: .*requires client certificates .*, give --cert/--key"):
                client.get("k")
        with Client(mtls_cluster.endpoints, timeout=REFUSED_TIMEOUT_S, tls=certs.mallory) as client:
            with pytest.raises(UnavailableError, match=r"TLS: .*is --cert signed by the CA it trusts"):
                client.get("k")
        with Client(mtls_cluster.endpoints, timeout=10.0, tls=certs.alice) as client:
            client.put("k", "v")
            assert client.get("k") == b"v"

    def test_with_auth_on_a_client_certificate_names_its_user(self, mtls_cluster: Cluster, certs: Certs) -> None:
        """With auth enabled, a request with no token is made by the user its client certificate
        names (CN), as etcd does: alice's certificate reads what alice may read and writes nothing,
        root's administers with no password. Auth is disabled again at the end."""
        root_files = issue(certs.directory, "root", server=False)
        root = TLS(certs.ca, root_files.cert, root_files.key)
        with Client(mtls_cluster.endpoints, timeout=10.0, tls=root) as admin:
            admin.put("app/1", "v")
            admin.user_add("root", "root-pw")
            admin.user_grant_role("root", "root")
            admin.user_add("alice", "alice-pw")
            admin.role_add("app-reader")
            admin.role_grant_permission("app-reader", "app/", prefix=True, perm="read")
            admin.user_grant_role("alice", "app-reader")
            admin.auth_enable()
            try:
                with Client(mtls_cluster.endpoints, timeout=10.0, tls=certs.alice) as alice:
                    assert alice.get("app/1") == b"v"
                    with pytest.raises(PermissionDeniedError):
                        alice.put("app/2", "x")
                    with pytest.raises(PermissionDeniedError):
                        alice.get("other/1")
                    with pytest.raises(PermissionDeniedError):
                        alice.user_list()
                assert {"root", "alice"} <= set(admin.user_list())
            finally:
                admin.auth_disable()

    def test_state_checks_reach_the_other_members_over_mutual_tls(self, mtls_cluster: Cluster, certs: Certs) -> None:
        """A member asks its peers' client ports for their state hashes, presenting its own member
        certificate: only then can it learn that its state differs from theirs. (Last in the module:
        it leaves one member of mtls_cluster stopped as corrupt.)"""
        cluster = mtls_cluster
        index = cluster.client().put("checked", "the right value")
        for member in MEMBERS:
            cluster.wait_applied(member, index)
        victim = next(m for m in MEMBERS if cluster.status(m)["role"] != "leader")
        cluster.kill(victim)
        state = cluster.nodes[victim].spec.data_dir / "state"
        env = lmdb.open(str(state), max_dbs=8, subdir=True)
        with env.begin(write=True) as txn:  # rewritten whole, checksum and all: only the peers can tell
            txn.put(b"checked", seal(b"checked", b"another value"), db=env.open_db(b"data", txn=txn))
        env.close()
        cluster.start_node(victim)

        status = wait_until("the member to find its state differs from its peers'",
                            lambda: (s := cluster.status(victim))["corrupt"] and s, timeout=30)
        assert "agree on" in status["corrupt"]
