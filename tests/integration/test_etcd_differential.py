"""A differential test of raftkv's etcd face: one script of etcdctl 3.4 commands run against a real
etcd 3.4 (one member, a process of its own) and against a raftkv node, through the same client,
with `-w json` wherever etcdctl has it (plain output for a few gets and txns, as people read them).

Every op's outcome is compared: its exit code, its stdout (parsed JSON, or text), and the
`Error: ...` lines etcdctl writes to stderr. Before comparing, the member-specific fields of every
response header go (cluster_id, member_id, raft_term: ids and terms that name a member or an
election, not the data); the revisions, versions, create/mod revisions, counts, `more`, kvs, prev
kvs, deleted counts, txn branches and error messages must be EQUAL. The few ops whose outputs
differ by design say so in a written exception (`Deliberate`: its reason, and what of the output
both must still agree on). Any other difference fails the test, listing each op that differed with
its command, etcd's outcome and raftkv's.

What etcdctl 3.4 cannot ask for is not here: it has no --count-only and no min/max mod/create
revision flags (they came with etcdctl 3.5), no nested txns, and raftkv grants no leases (a put
naming one is compared as an error)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kv.tools.cluster_up import free_ports
from tests.integration.cluster import Cluster, NodeProcess

ETCD = shutil.which("etcd")
ETCDCTL = shutil.which("etcdctl")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ETCD is None or ETCDCTL is None,
                       reason="needs etcd and etcdctl 3.4 on PATH (Debian: apt-get install etcd-server etcd-client)"),
]

CALL_TIMEOUT_S = 30
START_TIMEOUT_S = 30

# As the harness's nodes (tests/integration/cluster.py): the kernel SIGKILLs etcd when the test
# process dies, however it dies, so that no etcd outlives a killed pytest.
_ORPHAN_GUARD = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


# ---- running etcdctl -------------------------------------------------------------------------------

def etcdctl_env() -> dict[str, str]:
    """The environment with ETCDCTL_API=3 and no other ETCDCTL_* setting (an ETCDCTL_ENDPOINTS of
    the caller's must not redirect the test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return env


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    errors: tuple[str, ...]  # etcdctl's "Error: ..." lines (its other stderr is timestamped logs)


def etcdctl(endpoint: str, args: tuple[str, ...], stdin: str | None = None, cwd: Path | None = None) -> Outcome:
    assert ETCDCTL is not None
    command = [ETCDCTL, f"--endpoints={endpoint}", "--dial-timeout=5s", "--command-timeout=15s", *args]
    done = subprocess.run(command, input=stdin if stdin is not None else "", capture_output=True, text=True,
                          errors="surrogateescape", env=etcdctl_env(), cwd=cwd, timeout=CALL_TIMEOUT_S)
    errors = tuple(line for line in done.stderr.splitlines() if line.startswith("Error:"))
    return Outcome(done.returncode, done.stdout, errors)


# ---- the script ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Deliberate:
    """A known, deliberate difference: `reason` says why, `keep` maps an op's parsed output to
    the part both stores must still agree on."""

    reason: str
    keep: Callable[[Any], Any]


@dataclass(frozen=True)
class Op:
    args: tuple[str, ...]
    stdin: str | None = None
    json: bool = True  # add -w json and parse stdout
    exception: Deliberate | None = None
    refused: bool = False  # etcd refuses it (an error and a non-zero exit): the script checks itself

    def command(self) -> str:
        words = " ".join(repr(a) if (not a or " " in a or not a.isprintable()) else a for a in self.args)
        text = f"etcdctl {words}" + (" -w json" if self.json else "")
        return text + (f"  <<< {self.stdin!r}" if self.stdin is not None else "")


def txn(compares: list[str], success: list[str], failure: list[str]) -> str:
    """etcdctl's txn input: compares, a blank line, success ops, a blank line, failure ops."""
    return "\n".join([*compares, "", *success, "", *failure, ""]) + "\n"


def _endpoint_status(out: Any) -> Any:
    (entry,) = out
    return {"revision": entry["Status"]["header"]["revision"], "fields": sorted(entry["Status"])}


def _endpoint_hashkv(out: Any) -> Any:
    (entry,) = out
    return {"header": entry["HashKV"]["header"], "compact_revision": entry["HashKV"].get("compact_revision")}


def _endpoint_health(out: Any) -> Any:
    (entry,) = out
    return {"health": entry["health"], "error": entry.get("error")}


def _member_list(out: Any) -> Any:
    return {"header": out["header"], "members": [sorted(member) for member in out["members"]]}


STATUS = Deliberate(
    "version: etcd reports its release (3.4.23), raftkv the etcd API it speaks (3.4.0); dbSize and "
    "dbSizeInUse: bbolt's file against LMDB's; raftIndex, raftAppliedIndex and raftTerm: two "
    "different logs (etcd's holds its membership and attribute entries, and etcd starts in term 2); "
    "leader: a member id. Kept: the store's revision and which fields are reported.",
    _endpoint_status)
HASHKV = Deliberate(
    "hash: etcd hashes its bbolt records (CRC-32C over revision keys and KeyValue protos), raftkv "
    "its LMDB records (CRC-32); equal hashes are required among raftkv's members only "
    "(test_etcdctl.py). Kept: the header's revision and compact_revision.",
    _endpoint_hashkv)
HEALTH = Deliberate("took: how long the check took. Kept: health and error.", _endpoint_health)
MEMBERS = Deliberate(
    "members' ids, names (default against n1) and URLs name different processes. Kept: the header, "
    "the member count and the fields each member has.",
    _member_list)

# The keys the script writes live under k/ (plus `other`, outside the prefix); "k/\udcff" is the
# key b"k/\xff", not UTF-8, passed as the bytes it stands for.
HIGH = "k/\udcff"

# The revisions in the comments are etcd's (an empty store is at revision 1).
SCRIPT: list[Op] = [
    # -- puts
    Op(("put", "k/a", "v1")),                                       # rev 2
    Op(("put", "k/b", "v2")),                                       # rev 3
    Op(("put", "k/c", "v3"), json=False),                           # rev 4, "OK"
    Op(("put", "k/a", "v4", "--prev-kv")),                          # rev 5: an overwrite with its prev kv
    Op(("put", "k/a", "v4", "--prev-kv")),                          # rev 6: the same value, version 3
    Op(("put", "k/d", "v0")),                                       # rev 7
    Op(("put", HIGH, "vz")),                                        # rev 8
    Op(("put", "other", "x1")),                                     # rev 9
    Op(("put", "k/b", "--ignore-value")),                           # rev 10: b's value again, version 2
    Op(("put", "k/missing", "--ignore-value"), refused=True),                       # key not found
    Op(("put", "k/e", "v5", "--lease=1234"), refused=True),                         # lease not found
    Op(("put", "k/new", "n1", "--prev-kv")),                        # rev 11: --prev-kv of a new key
    # -- gets
    Op(("get", "k/a")),
    Op(("get", "k/nothing")),
    Op(("get", "k/a"), json=False),
    Op(("get", "--prefix", "k/")),
    Op(("get", "--from-key", "k/c")),
    Op(("get", "k/a", "k/c")),                                      # [k/a, k/c)
    Op(("get", "k/a", "--rev=2")),                                  # a past revision
    Op(("get", "--prefix", "k/", "--rev=4")),
    Op(("get", "k/d", "--rev=6")),                                  # before k/d existed
    Op(("get", "--prefix", "k/", "--limit=2")),                     # count 6, more
    Op(("get", "--prefix", "k/", "--limit=6")),                     # exactly all: no more
    Op(("get", "--prefix", "k/", "--sort-by=KEY", "--order=ASCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=KEY", "--order=DESCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=CREATE", "--order=ASCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=CREATE", "--order=DESCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=MODIFY", "--order=ASCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=MODIFY", "--order=DESCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=VALUE", "--order=ASCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=VALUE", "--order=DESCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=VERSION", "--order=ASCEND")),   # ties: versions 1 and 2
    Op(("get", "--prefix", "k/", "--sort-by=VERSION", "--order=DESCEND")),
    Op(("get", "--prefix", "k/", "--sort-by=VALUE")),               # a target without an order: ascending
    Op(("get", "--prefix", "k/", "--sort-by=VALUE", "--limit=2")),
    Op(("get", "--prefix", "k/", "--sort-by=MODIFY", "--order=DESCEND", "--limit=2")),
    Op(("get", "--prefix", "k/", "--keys-only")),
    Op(("get", "--prefix", "k/", "--keys-only", "--limit=1"), json=False),
    Op(("get", "--prefix", "k/", "--print-value-only"), json=False),
    Op(("get", "--consistency=s", "k/a")),
    Op(("get", ""), refused=True),                                                  # key is not provided
    # -- deletes
    Op(("del", "k/nothing")),                                       # deleted 0, no new revision
    Op(("del", "k/d", "--prev-kv")),                                # rev 12
    Op(("del", "k/nothing", "--prev-kv"), json=False),              # "0"
    Op(("get", "k/d", "--rev=11")),                                 # a deleted key at a past revision
    Op(("get", "k/d", "--rev=12")),
    # -- transactions
    Op(("txn",), txn(['value("k/a") = "v4"'], ["put k/t1 t", "get k/t1"], ["put k/f1 f"])),  # rev 13
    Op(("txn",), txn(['value("k/a") = "nope"'], ["put k/t1 t"], ["put k/f1 f", "get k/f1"])),  # rev 14
    Op(("txn",), txn(['version("k/a") = "3"'], ["get k/a"], ["get k/b"])),             # reads only
    Op(("txn",), txn(['version("k/a") = "2"'], ["get k/a"], ["get k/b --rev=3"])),     # reads only
    Op(("txn",), txn(['create("k/b") = "3"'], ["del k/c --prev-kv", "put k/g g --prev-kv"], [])),  # rev 15
    Op(("txn",), txn(['create("k/b") > "3"'], ["put k/g g2"], [])),                    # fails, no ops
    Op(("txn",), txn(['mod("k/a") > "5"'], ["put k/a v5 --prev-kv"], ["get k/a"])),    # rev 16
    Op(("txn",), txn(['mod("k/a") < "5"'], ["put k/a v6"], ["get --prefix k/ --limit=1 --rev=7"])),
    Op(("txn",), txn(['create("k/zz") = "0"'], ["put k/zz new"], [])),                 # rev 17: a missing key
    Op(("txn",), txn(['value("k/zz2") = ""'], [], ["del k/nothing"])),                 # value of a missing key
    Op(("txn",), txn(['version("k/a") != "1"', 'value("other") = "x1"'],
                     ["put k/h h", "del other --prev-kv"], [])),                       # rev 18
    Op(("txn",), txn([], ["put k/i i", "get --prefix k/ --keys-only --sort-by=VERSION --order=DESCEND"], [])),  # 19
    Op(("txn",), txn(['value("k/a") = "v5"'], ["put k/h h2", "get k/h"], ["get k/a"]), json=False),  # rev 20
    Op(("txn",), txn(['value("k/a") = "v1"'], ["put k/h h3"], ["get k/a", "get k/h"]), json=False),
    Op(("txn",), txn([], ["put k/x 1", "put k/x 2"], []), refused=True),            # duplicate key
    Op(("txn",), txn([], ["put k/p 1", "del --prefix k/p"], []), refused=True),     # put, then deleted: duplicate key
    # -- compaction
    Op(("compact", "10"), json=False),
    Op(("get", "k/a", "--rev=9"), refused=True),                                    # compacted
    Op(("get", "k/a", "--rev=10")),                                 # the compacted revision itself: served
    Op(("get", "--prefix", "k/", "--rev=11", "--keys-only")),
    Op(("txn",), txn([], ["get k/a --rev=5"], []), refused=True),                   # compacted, inside a txn too
    Op(("compact", "8"), json=False, refused=True),                                 # already compacted
    Op(("compact", "1000"), json=False, refused=True),                              # a future revision
    Op(("get", "k/a", "--rev=1000"), refused=True),                                 # a future revision
    Op(("compact", "12", "--physical"), json=False),
    Op(("get", "k/d", "--rev=11"), refused=True),                                   # compacted now
    # -- deletes of ranges
    Op(("del", "--prefix", "k/", "--prev-kv")),                     # rev 21
    Op(("put", "other", "x2")),                                     # rev 22
    Op(("put", "zeta", "z")),                                       # rev 23
    Op(("del", "--from-key", "other")),                             # rev 24
    Op(("get", "--prefix", "")),                                    # the whole store: empty
    Op(("get", "--prefix", "k/", "--rev=20", "--limit=3")),
    # -- a key deleted and put again, empty and multi-line values
    Op(("put", "k/d", "again")),                                    # rev 25: create_revision 25, version 1
    Op(("get", "k/d")),
    Op(("get", "k/d", "--rev=24")),                                 # absent then
    Op(("put", "k/empty", "")),                                     # rev 26: an empty value
    Op(("put", "k/nl"), stdin="l1\nl2"),                            # rev 27: the value read from stdin
    Op(("get", "--prefix", "k/")),
    Op(("txn",), txn(['mod("k/none") = "0"', 'version("k/d") = "1"'],
                     ["del k/d --prev-kv", "get k/d"], [])),                            # rev 28: sees its delete
    Op(("txn",), txn(['create("k/d") = "0"'], ["get --prefix k/ --sort-by=KEY --order=DESCEND --limit=1"], [])),
    Op(("get", "--from-key", "", "--limit=1")),
    Op(("get", "--prefix", "k/", "--sort-by=KEY", "--order=DESCEND", "--limit=1")),
    Op(("endpoint", "hashkv", "--rev=5"), refused=True),                            # compacted
    Op(("endpoint", "hashkv", "--rev=1000"), refused=True),                         # a future revision
    Op(("endpoint", "hashkv", "--rev=27"), exception=HASHKV),       # below the newest revision
    Op(("compact", "28"), json=False),                              # the store's revision itself
    Op(("get", "--prefix", "k/", "--rev=28")),
    Op(("del", "k/a", "k/f", "--prev-kv")),                         # rev 29: [k/a, k/f) holds k/empty
    Op(("del", "--prefix", "", "--prev-kv")),                       # rev 30: every key
    Op(("get", "--prefix", "", "--rev=29")),
    # -- maintenance and cluster
    Op(("endpoint", "status"), exception=STATUS),
    Op(("endpoint", "hashkv"), exception=HASHKV),
    Op(("endpoint", "health"), exception=HEALTH),
    Op(("member", "list"), exception=MEMBERS),
    Op(("alarm", "list")),
    Op(("defrag",), json=False),
    Op(("snapshot", "save", "snap.db"), json=False),                # stdout only: each file is its store's own
]

MEMBER_FIELDS = ("cluster_id", "member_id", "raft_term")


def without_member_fields(value: Any) -> Any:
    """`value` with cluster_id, member_id and raft_term dropped from every response header in it."""
    if isinstance(value, dict):
        return {k: (({f: v for f, v in without_member_fields(x).items() if f not in MEMBER_FIELDS}
                     if k == "header" and isinstance(x, dict) else without_member_fields(x)))
                for k, x in value.items()}
    if isinstance(value, list):
        return [without_member_fields(x) for x in value]
    return value


def compared(op: Op, outcome: Outcome) -> dict[str, Any]:
    """What of an op's outcome both stores must agree on."""
    out: Any = outcome.stdout
    if op.json and outcome.code == 0:
        out = json.loads(outcome.stdout)
    out = without_member_fields(out)
    if op.exception is not None and outcome.code == 0:
        out = op.exception.keep(out)
    return {"exit": outcome.code, "out": out, "errors": list(outcome.errors)}


def run_script(endpoint: str, cwd: Path) -> list[dict[str, Any]]:
    """The script's outcomes on the store at `endpoint` (host:port), which etcdctl's messages
    name ("Finished defragmenting etcd member[ENDPOINT]"): the address is replaced by ENDPOINT."""
    results = []
    for op in SCRIPT:
        args = (*op.args, "-w", "json") if op.json else op.args
        outcome = etcdctl(endpoint, args, op.stdin, cwd)
        outcome = Outcome(outcome.code, outcome.stdout.replace(endpoint, "ENDPOINT"),
                          tuple(line.replace(endpoint, "ENDPOINT") for line in outcome.errors))
        results.append(compared(op, outcome))
    return results


# ---- the two stores --------------------------------------------------------------------------------

@dataclass
class Etcd:
    endpoint: str  # host:port of its client URL
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"etcd exited with code {self.process.returncode}:\n{self.log_tail()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_etcd(base: Path, name: str = "default", peer_url: str | None = None, initial_cluster: str | None = None,
               existing: bool = False) -> Etcd:
    """One etcd member on free loopback ports, data in `base`/data, output in `base`/etcd.log: a
    cluster of its own, or (`existing`) the member `name` at `peer_url` joining `initial_cluster`."""
    assert ETCD is not None
    client_port, peer_port = free_ports(2)
    client, peer = f"http://127.0.0.1:{client_port}", peer_url or f"http://127.0.0.1:{peer_port}"
    command = [ETCD, "--data-dir", str(base / "data"), "--name", name,
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", initial_cluster or f"{name}={peer}",
               *(("--initial-cluster-state", "existing") if existing else ())]
    if sys.platform.startswith("linux"):
        command = [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *command]
    base.mkdir(parents=True, exist_ok=True)
    log_path = base / "etcd.log"
    with open(log_path, "wb") as log:
        # No ETCD_* variable of the caller's may configure it (etcd reads its flags from them too).
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={k: v for k, v in os.environ.items() if not k.startswith("ETCD")})
    return Etcd(f"127.0.0.1:{client_port}", process, log_path)


def wait_healthy(what: str, endpoint: str, check_alive: Callable[[], None]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Outcome | None = None
    while time.monotonic() < deadline:
        check_alive()
        last = etcdctl(endpoint, ("endpoint", "health"))
        if last.code == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} at {endpoint} never passed `etcdctl endpoint health`: {last}")


@dataclass(frozen=True)
class Runs:
    """The script's outcomes on each store, and where their logs are."""

    etcd: list[dict[str, Any]]
    raftkv: list[dict[str, Any]]
    logs: str


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """etcd and a one-member raftkv, started together; the script run on etcd, then on raftkv;
    both killed at teardown."""
    base = tmp_path_factory.mktemp("differential")
    with etcd_and_raftkv(base) as (etcd, node):
        for name in ("etcd-cwd", "raftkv-cwd"):
            (base / name).mkdir()
        theirs = run_script(etcd.endpoint, base / "etcd-cwd")
        ours = run_script(node.address, base / "raftkv-cwd")
        yield Runs(theirs, ours, f"logs: {etcd.log_path}, {node.log_path}")


@contextlib.contextmanager
def etcd_and_raftkv(base: Path, **options: Any) -> Iterator[tuple[Etcd, NodeProcess]]:
    """A real etcd and a one-member raftkv (Cluster's `options`), both serving (under `base`);
    both killed at the end."""
    etcd = start_etcd(base / "etcd")
    raftkv = Cluster(base / "raftkv", 1, **options)
    try:
        raftkv.start()
        node = raftkv.nodes["n1"]
        wait_healthy("etcd", etcd.endpoint, etcd.check_alive)
        raftkv.wait_for_leader()
        wait_healthy("raftkv", node.address, node.check_alive)
        yield etcd, node
    finally:
        raftkv.close()
        etcd.kill()


# ---- the tests -------------------------------------------------------------------------------------

def show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def difference(i: int, etcd_outcome: dict[str, Any], raftkv_outcome: dict[str, Any]) -> str:
    return (f"op {i}: {SCRIPT[i].command()}\n"
            f"    etcd:   exit {etcd_outcome['exit']} {show(etcd_outcome['out'])} {etcd_outcome['errors']}\n"
            f"    raftkv: exit {raftkv_outcome['exit']} {show(raftkv_outcome['out'])} {raftkv_outcome['errors']}")


def test_etcd_does_what_the_script_expects(runs: Runs):
    """The script reaches what it means to: a refusal (an error, a non-zero exit) where one is
    expected, none elsewhere. Judged on etcd's outcomes, the reference."""
    unexpected = [f"op {i}: {op.command()}: {outcome}" for i, (op, outcome) in enumerate(zip(SCRIPT, runs.etcd))
                  if (outcome["exit"] != 0) != op.refused or (op.refused and not outcome["errors"])]
    assert not unexpected, "etcd did not do what the script expects:\n" + "\n".join(unexpected)


def test_raftkv_answers_the_script_as_etcd_does(runs: Runs):
    """Every op compared: equal, or the test lists each op that differs."""
    compared_ops = list(range(len(SCRIPT)))
    differences = [difference(i, runs.etcd[i], runs.raftkv[i]) for i in compared_ops
                   if runs.etcd[i] != runs.raftkv[i]]
    print(f"{len(compared_ops)} of {len(SCRIPT)} ops compared ({sum(op.exception is not None for op in SCRIPT)} "
          f"under a written exception), {len(differences)} differ")
    assert not differences, (f"{len(differences)} of {len(compared_ops)} ops differ between etcd 3.4 and raftkv "
                             f"({runs.logs}):\n" + "\n".join(differences))
