"""`raftkv get/scan --rev`, `raftkv compact`, `raftkv revision` and `raftkv txn` (etcdctl's txn
format), run as an operator runs them: the real console script (`raftkv`, else `python -m kv`) in
a subprocess, against a real three-member cluster. The same txn stdin through etcdctl (which
talks to raftkv's etcd API) must print the same bytes and leave the same keys."""
from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kv.tools.cluster_up import child_env
from kv.txn import delete, put
from tests.integration.cluster import Cluster, module_cluster

pytestmark = pytest.mark.integration

ETCDCTL = shutil.which("etcdctl")
COMPACTED = "etcdserver: mvcc: required revision has been compacted"
FUTURE = "etcdserver: mvcc: required revision is a future revision"


@functools.cache
def console_script() -> list[str]:
    """`raftkv` as installed (pyproject's [project.scripts]) when it runs this source tree, else
    `python -m kv`, the same entry point (kv/__main__.py)."""
    script = shutil.which("raftkv")
    if script is not None:
        found = subprocess.run([script, "--help"], capture_output=True, env=child_env(), timeout=60)
        if found.returncode == 0:
            return [script]
    return [sys.executable, "-m", "kv"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three members with a leader, shared by the module's tests (each uses keys of its own)."""
    yield from module_cluster(tmp_path_factory.mktemp("cluster"))


def environment() -> dict[str, str]:
    """child_env() (this source tree importable, first on the path), without the caller's
    RAFTKV_* and ETCDCTL_* settings."""
    return {k: v for k, v in child_env().items() if not k.startswith(("RAFTKV_", "ETCDCTL_"))}


def raftkv(cluster: Cluster, *argv: str, stdin: bytes = b"", endpoints: list[str] | None = None
           ) -> subprocess.CompletedProcess[bytes]:
    command = [*console_script(), *argv, "--endpoints", ",".join(endpoints or cluster.endpoints), "--timeout", "10"]
    return subprocess.run(command, input=stdin, capture_output=True, env=environment(), timeout=60)


def etcdctl(cluster: Cluster, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    assert ETCDCTL is not None
    command = [ETCDCTL, "--endpoints", ",".join(cluster.endpoints), "--command-timeout", "10s", *argv]
    return subprocess.run(command, input=stdin, capture_output=True, env={**environment(), "ETCDCTL_API": "3"},
                          timeout=60)


def ok(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert done.stderr == b"", done.stderr
    return done.stdout.decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def revision_now(cluster: Cluster) -> int:
    return int(ok(raftkv(cluster, "revision")))


def test_get_and_scan_at_a_past_revision_and_below_a_compaction(cluster: Cluster):
    ok(raftkv(cluster, "put", "rev/a", "one"))
    first = revision_now(cluster)  # rev/a's create revision
    ok(raftkv(cluster, "put", "rev/a", "two"))
    ok(raftkv(cluster, "put", "rev/b", "bee"))
    second = revision_now(cluster)
    assert second == first + 2  # one revision a write
    leader = cluster.wait_for_leader()
    follower = next(node.address for node_id, node in cluster.nodes.items() if node_id != leader)

    assert ok(raftkv(cluster, "get", "rev/a")) == "two\n"
    assert ok(raftkv(cluster, "get", "rev/a", "--rev", str(first), endpoints=[follower])) == "one\n"
    absent = raftkv(cluster, "get", "rev/b", "--rev", str(first))
    assert (absent.returncode, absent.stdout, absent.stderr) == (1, b"", b"not found: rev/b\n")
    assert ok(raftkv(cluster, "scan", "--prefix", "rev/", "--rev", str(first))) == "rev/a\tone\n"
    assert ok(raftkv(cluster, "scan", "--prefix", "rev/", "--rev", str(second - 1), "--limit", "0")) == \
        "rev/a\ttwo\n"
    assert ok(raftkv(cluster, "scan", "--start", "rev/", "--end", "rev/z")) == "rev/a\ttwo\nrev/b\tbee\n"
    assert ok(raftkv(cluster, "scan", "--start", "rev/b", "--rev", str(second), "--limit", "0")) == "rev/b\tbee\n"

    # -w json: get's fields of before (key, value, found) and etcdctl's revisions after them.
    as_json = json.loads(ok(raftkv(cluster, "get", "rev/a", "-w", "json")))
    assert as_json == {"key": b64(b"rev/a"), "value": b64(b"two"), "found": True, "create_revision": first,
                       "mod_revision": first + 1, "version": 2, "lease": 0}
    assert list(as_json)[:3] == ["key", "value", "found"]
    assert json.loads(ok(raftkv(cluster, "get", "rev/a", "--rev", str(first), "--json"))) == {
        "key": b64(b"rev/a"), "value": b64(b"one"), "found": True, "create_revision": first,
        "mod_revision": first, "version": 1, "lease": 0}
    missing = raftkv(cluster, "get", "rev/none", "-w", "json")
    assert missing.returncode == 1 and json.loads(missing.stdout) == {
        "key": b64(b"rev/none"), "value": None, "found": False, "create_revision": None, "mod_revision": None,
        "version": None, "lease": None}
    scanned = json.loads(ok(raftkv(cluster, "scan", "--prefix", "rev/", "-w", "json")))
    assert scanned == {"kvs": [{"key": b64(b"rev/a"), "value": b64(b"two"), "create_revision": first,
                                "mod_revision": first + 1, "version": 2, "lease": 0},
                               {"key": b64(b"rev/b"), "value": b64(b"bee"), "create_revision": second,
                                "mod_revision": second, "version": 1, "lease": 0}],
                       "count": 2, "more": False}
    cut = raftkv(cluster, "scan", "--prefix", "rev/", "--limit", "1", "--json", "--rev", str(second))
    assert json.loads(cut.stdout)["more"] is True and b"1 keys shown, more exist" in cut.stderr

    # etcdctl reads the same revisions.
    if ETCDCTL is not None:
        etcd_view = json.loads(etcdctl(cluster, "get", "rev/a", "-w", "json").stdout)["kvs"][0]
        assert {k: etcd_view[k] for k in ("create_revision", "mod_revision", "version")} == {
            k: as_json[k] for k in ("create_revision", "mod_revision", "version")}

    assert ok(raftkv(cluster, "compact", str(second))) == f"compacted revision {second}\n"
    for argv in (("get", "rev/a", "--rev", str(first)), ("scan", "--prefix", "rev/", "--rev", str(first)),
                 ("compact", str(first))):
        refused = raftkv(cluster, *argv)
        assert (refused.returncode, refused.stdout) == (1, b""), refused
        assert refused.stderr.decode() == f"raftkv {argv[0]}: error: OUT_OF_RANGE: {COMPACTED}\n"
    assert ok(raftkv(cluster, "get", "rev/b", "--rev", str(second))) == "bee\n"  # the compacted revision itself
    future = raftkv(cluster, "get", "rev/a", "--rev", str(second + 10_000))
    assert (future.returncode, future.stdout) == (1, b"")
    assert future.stderr.decode() == f"raftkv get: error: OUT_OF_RANGE: {FUTURE}\n"
    # etcdctl's name for the command, and its --physical (always so here), at a revision past the
    # compacted one (at it, etcd refuses it, as above).
    ok(raftkv(cluster, "put", "rev/c", "sea"))
    later = revision_now(cluster)
    assert ok(raftkv(cluster, "compaction", str(later), "--physical")) == f"compacted revision {later}\n"


# The success branch: every compare holds. Keys with spaces and tabs go through Go-quoted words.
SUCCESS_STDIN = b'''value("ok/cfg") = "v1"
version("ok/cfg") > "0"
create("ok/absent") = "0"
mod("ok/cfg") < "1000000000"

put ok/cfg v2 --prev-kv
put "ok/sp ace" "a\\tb"
get ok/ --prefix
del ok/old
get ok/cfg --keys-only

put ok/cfg never

'''

SUCCESS_OUTPUT = b"SUCCESS\n\nOK\nok/cfg\nv1\n\nOK\n\nok/cfg\nv2\nok/old\ngone\nok/sp ace\na\tb\n\n1\n\nok/cfg\n\n"

# The failure branch: one compare fails, so the failure ops run; the success ops never do.
FAILURE_STDIN = b'''value("no/cfg") = "v1"
value("no/cfg") = "something else"

put no/cfg never
del no/o --prefix

get no/cfg
put no/new fresh
del no/cfg no/cfh
get no/ --prefix

'''

FAILURE_OUTPUT = b"FAILURE\n\nno/cfg\nv1\n\nOK\n\n1\n\nno/new\nfresh\nno/old\ngone\n"


def seed(cluster: Cluster, prefix: str) -> None:
    """`prefix`cfg = v1 and `prefix`old = gone, nothing else under `prefix`."""
    with cluster.client() as client:
        client.txn(success=[delete(prefix, prefix=True)])
        client.txn(success=[put(f"{prefix}cfg", "v1"), put(f"{prefix}old", "gone")])


def pairs(cluster: Cluster, prefix: str) -> list[tuple[bytes, bytes]]:
    with cluster.client() as client:
        return client.scan(prefix=prefix, limit=1000)


def test_txn_from_stdin_takes_the_success_branch(cluster: Cluster):
    seed(cluster, "ok/")
    before = revision_now(cluster)
    assert ok(raftkv(cluster, "txn", stdin=SUCCESS_STDIN)).encode() == SUCCESS_OUTPUT
    assert revision_now(cluster) == before + 1  # the whole transaction is one revision
    assert pairs(cluster, "ok/") == [(b"ok/cfg", b"v2"), (b"ok/sp ace", b"a\tb")]


def test_txn_from_stdin_takes_the_failure_branch(cluster: Cluster):
    seed(cluster, "no/")
    assert ok(raftkv(cluster, "txn", stdin=FAILURE_STDIN)).encode() == FAILURE_OUTPUT
    assert pairs(cluster, "no/") == [(b"no/new", b"fresh"), (b"no/old", b"gone")]


def test_txn_json_and_the_end_of_stdin_ending_a_part(cluster: Cluster):
    seed(cluster, "js/")
    # No blank line after the failure part (nor after the success part here): the end of stdin ends it.
    done = raftkv(cluster, "txn", "-w", "json", stdin=b'mod("js/cfg") > "0"\n\nput js/cfg v2 --prev-kv\nget js/cfg\n'
                                                     b"del js/old\nput js/new n")
    result = json.loads(ok(done))
    revision = result["revision"]
    assert result == {"succeeded": True, "revision": revision, "responses": [
        {"op": "put", "prev_kv": {"key": b64(b"js/cfg"), "value": b64(b"v1"), "create_revision": revision - 1,
                                  "mod_revision": revision - 1, "version": 1, "lease": 0}},
        {"op": "get", "kvs": [{"key": b64(b"js/cfg"), "value": b64(b"v2"), "create_revision": revision - 1,
                               "mod_revision": revision, "version": 2, "lease": 0}]},
        {"op": "del", "deleted": 1},
        {"op": "put", "prev_kv": None}]}
    failed = json.loads(ok(raftkv(cluster, "txn", "--json", stdin=b'value("js/cfg") = "v1"\n\n\nget js/new\n')))
    assert failed["succeeded"] is False and failed["responses"][0]["kvs"][0]["value"] == b64(b"n")
    # -i prompts only on a terminal: from a pipe the output is the same as without it.
    assert ok(raftkv(cluster, "txn", "-i", stdin=b'value("js/cfg") = "v2"\n\nget js/cfg\n\n\n')) == \
        "SUCCESS\n\njs/cfg\nv2\n"


def test_txn_puts_with_a_lease_and_compares_leases(cluster: Cluster):
    with cluster.client() as client:
        with client.lease(ttl=60) as lease:
            attached = f"{lease.id:x}"  # in hex, as etcdctl's put --lease takes it
            stdin = f'lease("ls/k") = "0"\n\nput ls/k v --lease {attached}\n\n\n'.encode()
            assert ok(raftkv(cluster, "txn", stdin=stdin)) == "SUCCESS\n\nOK\n"
            assert json.loads(ok(raftkv(cluster, "get", "ls/k", "--json")))["lease"] == lease.id
            stdin = f'lease("ls/k") = "{attached}"\nlease("ls/k") != "0"\n\nget ls/k\n\n\n'.encode()
            assert ok(raftkv(cluster, "txn", stdin=stdin)) == "SUCCESS\n\nls/k\nv\n"
        assert client.get("ls/k") is None  # the lease revoked, its key went with it


@pytest.mark.parametrize("stdin, message", [
    (b'bogus("k") = "v"\n\n\n', 'malformed comparison: bogus("k") = "v" (unknown target bogus)'),
    (b'value(k) = "v"\n\n\n', "malformed comparison: value(k) = \"v\""),
    (b'version("k") = "one"\n\n\n', 'invalid txn compare request: version("k") = "one"'),
    (b'\nput k\n\n', "invalid txn request: put k (put needs KEY and VALUE)"),
    (b'\nput k v --lease zz\n\n', "invalid txn request: put k v --lease zz (bad lease ID ('zz'), expecting ID in Hex)"),
    (b'lease("k") = "x"\n\n', 'invalid txn compare request: lease("k") = "x"'),
    (b'\nfetch k\n\n', "invalid txn request: fetch k (an op is a put, get or del)"),
    (b'\n\nget k --prefix --from-key\n', "invalid txn request: get k --prefix --from-key (`--prefix` and "
                                         "`--from-key` cannot be set at the same time, choose one)"),
])
def test_txn_with_malformed_stdin_sends_nothing_and_exits_2(cluster: Cluster, stdin: bytes, message: str):
    before = revision_now(cluster)
    done = raftkv(cluster, "txn", stdin=stdin)
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == f"raftkv txn: error: {message}\n"
    assert revision_now(cluster) == before


def test_a_refused_txn_is_one_error_line(cluster: Cluster):
    done = raftkv(cluster, "txn", stdin=b'\nput dup/k 1\nput dup/k 2\n\n\n')
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode() == ("raftkv txn: error: INVALID_ARGUMENT: etcdserver: duplicate key given in txn "
                                    "request\n")


COMPARED = [
    SUCCESS_STDIN.replace(b"ok/", b"cmp/"),
    FAILURE_STDIN.replace(b"no/", b"cmp/"),
    b'version("cmp/cfg") = "1"\nc("cmp/cfg") > "0"\nm("cmp/old") > "0"\nval("cmp/cfg") != "x"\n\n'
    b'get cmp/ --prefix --limit 1\nget cmp/ --prefix --sort-by=VALUE --order DESCEND\nget cmp/cfg cmp/old\n'
    b'put cmp/cfg v9 --prev-kv\nget "" --from-key --keys-only --limit 1\ndel cmp/o --prefix\n\nget cmp/cfg\n\n',
    b'value(`cmp/cfg`) = `v1`\n\nget "\\x63\\u006dp/cfg"\nput cmp/uni "caf\\u00e9 \\x00"\nget cmp/uni\n\n\n',
]


@pytest.mark.skipif(ETCDCTL is None, reason="etcdctl is not installed")
@pytest.mark.parametrize("stdin", COMPARED, ids=["success", "failure", "flags", "quoting"])
def test_the_same_txn_stdin_through_etcdctl_prints_the_same(cluster: Cluster, stdin: bytes):
    seed(cluster, "cmp/")
    theirs = etcdctl(cluster, "txn", stdin=stdin)
    assert theirs.returncode == 0, theirs.stderr
    after_theirs = pairs(cluster, "cmp/")
    seed(cluster, "cmp/")
    ours = raftkv(cluster, "txn", stdin=stdin)
    assert (ours.returncode, ours.stderr) == (0, b"")
    assert ours.stdout == theirs.stdout
    assert pairs(cluster, "cmp/") == after_theirs


def test_help_explains_each_command_with_an_example(cluster: Cluster):
    assert 'value("cfg") = "v1"' in ok(raftkv(cluster, "txn", "--help"))
    assert "raftkv get user/1 --rev 42" in ok(raftkv(cluster, "get", "--help"))
    assert "raftkv compact 42" in ok(raftkv(cluster, "compact", "--help"))
    assert "--rev 42" in ok(raftkv(cluster, "scan", "--help"))
    assert "raftkv revision" in ok(raftkv(cluster, "revision", "--help"))
