"""etcd's snapshot files both ways, with etcd 3.4 itself: a real etcd writes a history (puts,
overwrites, deletes, a txn, a lease, a compaction, a few thousand keys, users and roles);
`etcdctl snapshot save` of it is restored into raftkv (`raftkv snapshot restore`), which then
answers etcdctl exactly as the etcd it came from (values, create/mod revisions, versions, leases,
the header's revision; reads at past revisions; the compacted revision refused alike). Then
`etcdctl snapshot save` against raftkv gives a file `etcdctl snapshot status` reports and
`etcdctl snapshot restore` turns into a data directory etcd starts and serves with the same
keys, values and revisions. Damaged and truncated etcd files are refused, nothing written; users
restored with auth on log in with the passwords they had in etcd."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from kv import Client, errors
from kv.tools.cluster_up import NodeSpec
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.integration.cluster import NodeProcess, free_ports, wait_until
from tests.integration.test_etcd_differential import (
    Etcd,
    etcdctl,
    start_etcd,
    wait_healthy,
)
from tests.integration.real_etcd import ETCDCTL, needs_etcd

pytestmark = [
    pytest.mark.integration,
    needs_etcd,
]

BULK_KEYS = 2_000
BULK_PER_TXN = 100  # etcd's --max-txn-ops is 128
ROOT = ("--user", "root:rootpw")
TXN = 'value("a") = "11"\n\nput x X\nput y Y\n\n\n'


def ok(endpoint: str, *args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    outcome = etcdctl(endpoint, args, stdin, cwd)
    assert outcome.code == 0, f"etcdctl {' '.join(args)} at {endpoint}: {outcome}"
    return outcome.stdout


def raftkv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kv", *args], capture_output=True, text=True, timeout=300)


@dataclass
class History:
    etcd: Etcd
    plain: Path  # snapshot saved with auth off (users and roles exist)
    with_auth: Path  # the same store, saved again once auth was on
    lease: str  # hex id
    compacted: int
    revision: int  # the store's revision when `plain` was saved


def write_history(endpoint: str) -> tuple[str, int]:
    """The history on a fresh etcd; returns (lease id, compacted revision)."""
    ok(endpoint, "put", "a", "1")                 # 2
    ok(endpoint, "put", "b", "2")                 # 3
    ok(endpoint, "put", "a", "11")                # 4: an overwrite
    ok(endpoint, "put", "c", "3")                 # 5
    ok(endpoint, "del", "b")                      # 6: a delete
    ok(endpoint, "txn", stdin=TXN)                # 7: two puts in one revision
    lease = ok(endpoint, "lease", "grant", "600").split()[1]
    ok(endpoint, "put", "leased", "v", f"--lease={lease}")  # 8
    ok(endpoint, "compact", "5")
    ok(endpoint, "put", "a", "111")               # 9
    ok(endpoint, "del", "c")                      # 10
    ok(endpoint, "put", "big", "z" * 9000)        # 11: a value on overflow pages
    with grpc.insecure_channel(endpoint) as channel:  # 12..31: a few thousand keys, one txn per 100
        kv = etcd_rpc_pb2_grpc.KVStub(channel)
        for first in range(0, BULK_KEYS, BULK_PER_TXN):
            kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
                key=f"bulk/{i:05d}".encode(), value=f"value-{i}".encode() * 3))
                for i in range(first, first + BULK_PER_TXN)]), timeout=30)
    ok(endpoint, "role", "add", "reader")
    ok(endpoint, "role", "grant-permission", "reader", "read", "/foo", "--prefix")
    ok(endpoint, "role", "grant-permission", "reader", "readwrite", "/bar")
    ok(endpoint, "user", "add", "root:rootpw")
    ok(endpoint, "user", "grant-role", "root", "root")
    ok(endpoint, "user", "add", "alice:alicepw")
    ok(endpoint, "user", "grant-role", "alice", "reader")
    return lease, 5


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    base = tmp_path_factory.mktemp("etcd-snapshot")
    etcd = start_etcd(base / "etcd")
    try:
        wait_healthy("etcd", etcd.endpoint, etcd.check_alive)
        lease, compacted = write_history(etcd.endpoint)
        revision = json.loads(ok(etcd.endpoint, "get", "a", "-w", "json"))["header"]["revision"]
        plain, with_auth = base / "plain.db", base / "auth.db"
        ok(etcd.endpoint, "snapshot", "save", str(plain), cwd=base)
        ok(etcd.endpoint, "auth", "enable")
        ok(etcd.endpoint, *ROOT, "snapshot", "save", str(with_auth), cwd=base)
        yield History(etcd, plain, with_auth, lease, compacted, revision)
    finally:
        etcd.kill()


@contextlib.contextmanager
def restored_node(snapshot: Path, base: Path) -> Iterator[NodeProcess]:
    """`raftkv snapshot restore` of `snapshot`, then a node serving it (killed at the end)."""
    port, peer_port = free_ports(2)
    peers = {"r1": f"127.0.0.1:{peer_port}"}
    done = raftkv("snapshot", "restore", str(snapshot), "--data-dir", str(base / "data"), "--id", "r1",
                  "--peers", f"r1={peers['r1']}")
    assert done.returncode == 0, done.stderr
    node = NodeProcess(NodeSpec("r1", f"127.0.0.1:{port}", base / "data", peers), base / "r1.log")
    node.start()
    try:
        with Client([node.address], timeout=10.0) as client:
            wait_until("the restored node leads", lambda: node.check_alive() or
                       client.status()[0].get("role") == "leader")
        yield node
    finally:
        node.kill()


def reads(endpoint: str, compacted: int, revision: int, auth: tuple[str, ...] = ()) -> dict[str, Any]:
    """What etcdctl reads: every key now and at each revision from the compacted one on (values,
    revisions, versions, leases, the header's revision), and the refusal below it."""
    def get(*args: str) -> Any:
        answer = json.loads(ok(endpoint, *auth, "get", "--prefix", "", "-w", "json", *args))
        return {"revision": answer["header"]["revision"], "kvs": answer.get("kvs", []), "count": answer.get("count")}
    seen: dict[str, Any] = {"now": get()}
    for rev in range(compacted, revision + 1):
        seen[f"rev {rev}"] = get(f"--rev={rev}")
    below = etcdctl(endpoint, (*auth, "get", "a", f"--rev={compacted - 1}"))
    seen["below compacted"] = (below.code, below.errors)
    return seen


def lease_view(endpoint: str, lease: str, auth: tuple[str, ...] = ()) -> dict[str, Any]:
    answer = json.loads(ok(endpoint, *auth, "lease", "timetolive", lease, "--keys", "-w", "json"))
    return {"id": answer["id"], "granted": answer["granted-ttl"], "keys": answer.get("keys"),
            "ttl_within_grant": 0 < answer["ttl"] <= answer["granted-ttl"]}


def test_an_etcd_snapshot_restored_into_raftkv_reads_as_the_etcd_it_came_from(history: History,
                                                                              tmp_path: Path) -> None:
    inspected = raftkv("snapshot", "inspect", str(history.plain))
    assert inspected.returncode == 0, inspected.stdout
    report = json.loads(inspected.stdout)
    status = json.loads(subprocess.run([ETCDCTL, "snapshot", "status", str(history.plain), "-w", "json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert report["format"] == "etcd" and report["etcd"] == status  # hash, revision, totalKey, totalSize
    assert report["key_count"] == BULK_KEYS + 5 and report["revision"] == history.revision

    etcd = history.etcd.endpoint
    with restored_node(history.plain, tmp_path) as node:
        theirs = reads(etcd, history.compacted, history.revision, ROOT)
        ours = reads(node.address, history.compacted, history.revision)
        assert theirs["below compacted"][0] != 0
        for what in theirs:
            assert ours[what] == theirs[what], what
        assert lease_view(node.address, history.lease) == lease_view(etcd, history.lease, ROOT)
        with Client([node.address]) as client:
            assert sorted(client.user_list()) == ["alice", "root"]
            assert client.user_get("alice")["roles"] == ["reader"]
            assert client.role_get("reader")["permissions"] == [
                {"perm": "readwrite", "key": b"/bar", "range_end": b""},
                {"perm": "read", "key": b"/foo", "range_end": b"/fop"}]
            assert client.auth_status() == {"enabled": False}
        # the restored store goes on from the revision etcd had
        assert json.loads(ok(node.address, "put", "after", "1", "-w", "json"))["header"]["revision"] == \
            history.revision + 1


def test_raftkv_snapshot_save_through_etcdctl_restores_into_etcd(history: History, tmp_path: Path) -> None:
    with restored_node(history.plain, tmp_path / "raftkv") as node:
        saved = tmp_path / "from-raftkv.db"
        ok(node.address, "snapshot", "save", str(saved), cwd=tmp_path)
        status = json.loads(subprocess.run([ETCDCTL, "snapshot", "status", str(saved), "-w", "json"],
                                           capture_output=True, text=True, check=True).stdout)
        assert status["revision"] == history.revision
        report = json.loads(raftkv("snapshot", "inspect", str(saved)).stdout)
        assert report["etcd"] == status and report["key_count"] == BULK_KEYS + 5
        ours = reads(node.address, history.compacted, history.revision)

    peer_port = free_ports(1)[0]
    peer = f"http://127.0.0.1:{peer_port}"
    subprocess.run([ETCDCTL, "snapshot", "restore", str(saved), "--data-dir", str(tmp_path / "etcd" / "data"),
                    "--name", "back", "--initial-cluster", f"back={peer}", "--initial-advertise-peer-urls", peer],
                   capture_output=True, text=True, check=True, cwd=tmp_path)
    back = start_etcd(tmp_path / "etcd", "back", peer, f"back={peer}")
    try:
        wait_healthy("the etcd restored from raftkv", back.endpoint, back.check_alive)
        theirs = reads(back.endpoint, history.compacted, history.revision)
        for what in ours:
            assert theirs[what] == ours[what], what
        assert lease_view(back.endpoint, history.lease) == lease_view(history.etcd.endpoint, history.lease, ROOT)
        role = json.loads(ok(back.endpoint, "role", "get", "reader", "-w", "json"))
        assert [(p.get("permType", 0), p["key"], p.get("range_end")) for p in role["perm"]] == [
            (2, "L2Jhcg==", None), (0, "L2Zvbw==", "L2ZvcA==")]
    finally:
        back.kill()


def test_with_auth_on_users_log_in_with_their_etcd_passwords(history: History, tmp_path: Path) -> None:
    with restored_node(history.with_auth, tmp_path) as node:
        refused = etcdctl(node.address, ("get", "a"))
        assert refused.errors == etcdctl(history.etcd.endpoint, ("get", "a")).errors == (
            "Error: etcdserver: user name is empty",)
        with Client([node.address], user="root", password="rootpw") as root:
            assert root.get("a") == b"111"
            assert root.auth_status() == {"enabled": True}
        with Client([node.address], user="alice", password="alicepw") as alice:
            assert alice.get("/foo/x") is None  # may read /foo...
            with pytest.raises(errors.PermissionDeniedError):
                alice.get("a")
        with Client([node.address], user="alice", password="wrong") as wrong:
            with pytest.raises(errors.RaftKVError, match="authentication failed"):
                wrong.get("/foo/x")


@pytest.mark.parametrize("damage, word", [
    (lambda raw: raw[: len(raw) // 2], "truncated"),
    (lambda raw: raw[:-40], "truncated"),
    (lambda raw: raw[:8192] + bytes([raw[8192] ^ 0xFF]) + raw[8193:], "checksum mismatch"),
])
def test_damaged_or_truncated_etcd_files_are_refused_and_nothing_is_written(history: History, tmp_path: Path,
                                                                          damage, word: str) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.db"
    bad.write_bytes(damage(history.plain.read_bytes()))
    data_dir = tmp_path / "data"
    done = raftkv("snapshot", "restore", str(bad), "--data-dir", str(data_dir))
    assert done.returncode == 1 and word in done.stderr and str(bad) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not data_dir.exists()
    inspected = raftkv("snapshot", "inspect", str(bad))
    assert inspected.returncode == 1 and word in json.loads(inspected.stdout)["error"]
