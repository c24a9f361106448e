"""A maintained Python etcd client from PyPI drives raftkv through its etcd v3 gRPC API (issue 27):
aetcd (asyncio, on grpc.aio), pinned below. It runs in a virtualenv of its own, not in ours: it
registers etcd's own rpc.proto, kv.proto and auth.proto in protobuf's default descriptor pool, as
raftkv_proto's etcd messages do, and brings its own grpcio and protobuf pins.

The virtualenv is made once per client version and Python version under
~/.cache/raftkv-tests/ (XDG_CACHE_HOME when set) and reused by later runs. Without PyPI it cannot be
made: the test is skipped then, except under CI (CI=true), where PyPI is reachable and a failure to
install is a failure."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration

CLIENT = "aetcd"
CLIENT_VERSION = "1.0.0"
INSTALL_TIMEOUT_S = 300
SCRIPT_TIMEOUT_S = 60

# Runs inside the client's virtualenv (python -I: none of our sys.path, none of our packages).
# argv: host port. Prints one JSON object: what each call returned.
SCRIPT = textwrap.dedent('''
    import asyncio, json, sys

    import aetcd


    def kv(item):
        return {"key": item.key.decode(), "value": item.value.decode(), "version": item.version,
                "create_revision": item.create_revision, "mod_revision": item.mod_revision}


    async def main(host, port):
        out = {}
        async with aetcd.Client(host, port, timeout=10) as client:
            tx = client.transactions
            out["put_python"] = (await client.put(b"lang/python", b"aetcd")).header.revision
            out["put_go"] = (await client.put(b"lang/go", b"etcd")).header.revision
            out["put_other"] = (await client.put(b"other", b"outside the prefix")).header.revision
            out["get"] = kv(await client.get(b"lang/python"))
            out["get_missing"] = await client.get(b"lang/none")
            prefix = await client.get_prefix(b"lang/")
            out["prefix"] = [kv(item) for item in prefix]
            out["prefix_count"] = len(prefix)
            deleted = await client.delete(b"lang/go")
            out["delete"] = {"deleted": deleted.deleted, "revision": deleted.header.revision}
            out["delete_again"] = await client.delete(b"lang/go")
            out["get_deleted"] = await client.get(b"lang/go")

            # The compare holds: the success branch runs (a put, then a get that sees it).
            succeeded, responses = await client.transaction(
                compare=[tx.value(b"lang/python") == b"aetcd", tx.version(b"lang/python") == 1],
                success=[tx.put(b"lang/python", b"changed in txn"), tx.get(b"lang/python")],
                failure=[tx.put(b"lang/failure", b"should not be written")],
            )
            ((value, got),) = responses[1]
            out["txn_success"] = {"succeeded": succeeded, "responses": len(responses),
                                  "get_value": value.decode(), "get_version": got.version}

            # The version is 2 now: the compare fails and the failure branch runs.
            succeeded, responses = await client.transaction(
                compare=[tx.version(b"lang/python") == 1],
                success=[tx.put(b"lang/python", b"should not be written")],
                failure=[tx.put(b"lang/failure", b"written by the failure branch"),
                         tx.get(b"lang/python")],
            )
            ((value, got),) = responses[1]
            out["txn_failure"] = {"succeeded": succeeded, "responses": len(responses),
                                  "get_value": value.decode(), "get_version": got.version}

            out["final"] = [kv(item) for item in await client.get_prefix(b"lang/")]
            out["final_other"] = kv(await client.get(b"other"))
        print(json.dumps(out))


    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
''')


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "raftkv-tests"


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _client_python() -> Path:
    """The virtualenv's python, made (under a lock, for concurrent runs) when it is not there yet.
    A virtualenv counts as made once its marker file is written, after pip succeeded."""
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    venv = cache / f"{CLIENT}-{CLIENT_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}-venv"
    python = venv / "bin" / "python"
    ready = venv / ".raftkv-ready"
    with open(cache / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists() and python.exists():
            return python
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", f"{CLIENT}=={CLIENT_VERSION}"],
        ]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, env=_child_env(),
                                      timeout=INSTALL_TIMEOUT_S)
                failure = None if done.returncode == 0 else f"exit {done.returncode}:\n{done.stderr[-3000:]}"
            except subprocess.TimeoutExpired:
                failure = f"no answer within {INSTALL_TIMEOUT_S}s"
            if failure is not None:
                reason = (f"cannot make the virtualenv for {CLIENT}=={CLIENT_VERSION} "
                          f"({' '.join(step[-3:])}): {failure}")
                if os.environ.get("CI"):
                    pytest.fail(f"{reason}\n(under CI, PyPI is reachable: not skipped)")
                pytest.skip(f"{reason}\n(no network to PyPI?)")
        ready.write_text(f"{CLIENT}=={CLIENT_VERSION}\n")
        return python


@pytest.fixture(scope="module")
def client_python() -> Path:
    return _client_python()


def run_client(python: Path, script: Path, endpoint: str) -> dict[str, Any]:
    host, port = endpoint.rsplit(":", 1)
    done = subprocess.run([str(python), "-I", str(script), host, port], capture_output=True, text=True,
                          env=_child_env(), timeout=SCRIPT_TIMEOUT_S)
    assert done.returncode == 0, f"{CLIENT} script failed (exit {done.returncode}):\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_aetcd_puts_gets_deletes_and_runs_txns_through_a_follower(
        client_python: Path, cluster: Cluster, tmp_path: Path) -> None:
    leader = cluster.wait_for_leader()
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    script = tmp_path / "drive_raftkv.py"
    script.write_text(SCRIPT)

    out = run_client(client_python, script, cluster.nodes[follower].address)

    # put: each write is a new revision.
    assert 0 < out["put_python"] < out["put_go"] < out["put_other"]
    # get
    assert out["get"] == {"key": "lang/python", "value": "aetcd", "version": 1,
                          "create_revision": out["put_python"], "mod_revision": out["put_python"]}
    assert out["get_missing"] is None
    # get with a prefix: both keys under lang/, in key order, and not "other".
    assert [(kv["key"], kv["value"]) for kv in out["prefix"]] == [("lang/go", "etcd"), ("lang/python", "aetcd")]
    assert out["prefix_count"] == 2
    # delete: one key, a new revision; deleting it again deletes nothing, and it is gone.
    assert out["delete"] == {"deleted": 1, "revision": out["put_other"] + 1}
    assert out["delete_again"] is None
    assert out["get_deleted"] is None
    # txn whose compare (value and version) holds: the success branch.
    assert out["txn_success"] == {"succeeded": True, "responses": 2,
                                  "get_value": "changed in txn", "get_version": 2}
    # txn whose compare (version) fails: the failure branch.
    assert out["txn_failure"] == {"succeeded": False, "responses": 2,
                                  "get_value": "changed in txn", "get_version": 2}
    assert [(kv["key"], kv["value"]) for kv in out["final"]] == [
        ("lang/failure", "written by the failure branch"), ("lang/python", "changed in txn")]
    final = {kv["key"]: kv for kv in out["final"]}
    assert final["lang/python"]["create_revision"] == out["put_python"]
    assert final["lang/python"]["mod_revision"] == out["delete"]["revision"] + 1  # the first txn
    assert final["lang/failure"]["mod_revision"] == out["delete"]["revision"] + 2  # the second
    assert out["final_other"]["value"] == "outside the prefix"

    # What the etcd client wrote is what raftkv's own client reads.
    native = cluster.client()
    assert native.get("lang/python") == b"changed in txn"
    assert native.get("lang/failure") == b"written by the failure branch"
    assert native.get("lang/go") is None
