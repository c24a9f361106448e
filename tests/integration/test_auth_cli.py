"""The auth commands as an operator runs them (`python -m kv user|role|auth ...`, etcdctl's flow)
against a single real node: root first, `auth enable` making the root role, a role with a
prefix permission, a user whose password comes from stdin, and --user / RAFTKV_USER /
RAFTKV_PASSWORD on the data commands; refusals print their kind."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kv.tools.cluster_up import child_env
from tests.integration.cluster import FAST_TIMING, Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    cluster = Cluster(tmp_path, 1, FAST_TIMING)
    try:
        cluster.start()
        cluster.wait_for_leader()
        yield cluster.endpoints[0]
    finally:
        cluster.close()


def raftkv(endpoint: str, *argv: str, stdin: str = "", env: dict[str, str] | None = None) -> tuple[int, str, str]:
    environment = {k: v for k, v in child_env().items() if not k.startswith("RAFTKV_")}
    done = subprocess.run([sys.executable, "-m", "kv", *argv, "--endpoints", endpoint], input=stdin.encode(),
                          capture_output=True, env={**environment, **(env or {})}, timeout=60, cwd=os.getcwd())
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_etcdctls_setup_flow(endpoint: str) -> None:
    assert raftkv(endpoint, "user", "add", "root", "--new-user-password", "rootpw")[:2] == (0, "User root created\n")
    assert raftkv(endpoint, "auth", "enable")[:2] == (0, "Authentication Enabled\n")  # made the role root
    code, _, err = raftkv(endpoint, "put", "app/1", "v")
    assert code == 1 and "UNAUTHENTICATED" in err
    root = ("--user", "root:rootpw")
    assert raftkv(endpoint, "put", "app/1", "v", *root)[0] == 0
    assert raftkv(endpoint, "put", "other/1", "w", *root)[0] == 0
    assert raftkv(endpoint, "role", "add", "reader", *root)[1] == "Role reader created\n"
    assert raftkv(endpoint, "role", "grant-permission", "reader", "read", "app/", "--prefix", *root)[0] == 0
    assert raftkv(endpoint, "user", "add", "alice", *root, stdin="alicepw\n")[1] == "User alice created\n"
    assert raftkv(endpoint, "user", "grant-role", "alice", "reader", *root)[0] == 0
    assert raftkv(endpoint, "user", "get", "alice", *root)[1] == "User: alice\nRoles: reader\n"
    assert raftkv(endpoint, "role", "get", "reader", *root)[1] == "Role reader\nKV Read:\n\t[app/, app0)\nKV Write:\n"

    alice = {"RAFTKV_USER": "alice", "RAFTKV_PASSWORD": "alicepw"}
    assert raftkv(endpoint, "get", "app/1", env=alice)[:2] == (0, "v\n")
    code, _, err = raftkv(endpoint, "get", "other/1", env=alice)
    assert code == 1 and "PERMISSION_DENIED: etcdserver: permission denied" in err
    code, _, err = raftkv(endpoint, "user", "list", env=alice)
    assert code == 1 and "PERMISSION_DENIED" in err
    code, _, err = raftkv(endpoint, "get", "app/1", "--user", "alice", "--password", "wrong")
    assert code == 1 and "UNAUTHENTICATED: etcdserver: authentication failed, invalid user ID or password" in err
    assert raftkv(endpoint, "auth", "status", env=alice)[1] == "Authentication Status: true\n"
