"""Patroni (Debian's patroni 3, PostgreSQL high availability) keeps two PostgreSQL 15 nodes on a
store of three members, its `etcd3: hosts:` the members' HTTP URLs (Patroni's etcd3 store speaks
etcd's JSON gateway): a primary is elected and the other node streams from it, a row written on
the primary appears on the replica; SIGKILL the primary's Patroni and its postgres, and the replica
is promoted within a minute; the old node, started again, rejoins as a replica; SIGKILL the
store's leader, and Patroni keeps its primary (no demotion while the store elects another).

Roles are read from Patroni's REST API (GET /patroni on each node's `restapi` port) and the
store's keys, never guessed from time. Patroni's timing is short (ttl 10 s, loop_wait 2 s,
retry_timeout 3 s: loop_wait + 2 * retry_timeout <= ttl, as Patroni asks) so that failover is
quick. PostgreSQL refuses to run as root: when the test runs as root (CI), Patroni and postgres
run as the `postgres` user, in a directory of their own under /tmp that it owns.

Needs Debian's `patroni` and `postgresql-15` (/usr/lib/postgresql/15/bin); CI installs them (there
a missing one fails the test), elsewhere the test is skipped naming what is missing."""
from __future__ import annotations

import base64
import ctypes
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from kv.tools.cluster_up import free_ports, release_ports
from tests.integration.cluster import wait_until
from tests.integration.gateway_stores import GatewayStore, gateway_store, post_json
from tests.integration.installed import program_missing, require

pytestmark = pytest.mark.integration

PATRONI = "/usr/bin/patroni"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SCOPE = "raftkv-test"
TTL_S, LOOP_WAIT_S, RETRY_TIMEOUT_S = 10, 2, 3
PROMOTION_DEADLINE_S = 60.0
# The store under Patroni: raftkv; RAFTKV_PATRONI_STORE=etcd runs the same test on etcd 3.4 members.
STORE_KIND = os.environ.get("RAFTKV_PATRONI_STORE", "raftkv")
PRIMARY_ROLES = ("master", "primary")  # Patroni 3.0 says master; later releases say primary


@pytest.fixture(scope="module", autouse=True)
def programs_installed() -> None:
    require(program_missing((Path(PATRONI), PG_BIN / "postgres", PG_BIN / "initdb", PG_BIN / "psql"),
                            "patroni postgresql-15"))


# ---- one Patroni node ----------------------------------------------------------------------------

def _runs_as() -> pwd.struct_passwd:
    """Root's processes run as `postgres` (PostgreSQL refuses root); anyone else's as themselves."""
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())


def _die_with_test_process() -> None:
    # After the switch to the postgres user (Popen's user= comes first), so that the kernel keeps
    # it: Patroni is SIGKILLed when the test process dies, however it dies.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


@dataclass
class PatroniNode:
    name: str
    base: Path  # owned by the user it runs as
    api_port: int
    pg_port: int
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def log_path(self) -> Path:
        return self.base.parent / f"{self.name}.log"

    def config(self, hosts: list[str]) -> dict[str, Any]:
        return {
            "scope": SCOPE, "name": self.name,
            "restapi": {"listen": f"127.0.0.1:{self.api_port}", "connect_address": f"127.0.0.1:{self.api_port}"},
            "etcd3": {"hosts": hosts},
            "bootstrap": {
                "dcs": {"ttl": TTL_S, "loop_wait": LOOP_WAIT_S, "retry_timeout": RETRY_TIMEOUT_S,
                        "postgresql": {"use_pg_rewind": True,
                                       "parameters": {"wal_log_hints": "on", "max_connections": 20,
                                                      "max_wal_senders": 5, "max_replication_slots": 5}}},
                "initdb": [{"encoding": "UTF8"}, "no-sync"],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}", "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data_dir), "bin_dir": str(PG_BIN), "pgpass": str(self.base / "pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "postgres"},
                                   "replication": {"username": "replicator", "password": "replicator"}},
                "parameters": {"unix_socket_directories": str(self.base), "shared_buffers": "16MB", "fsync": "off"},
            },
        }

    def start(self, hosts: list[str]) -> None:
        """Start Patroni (it starts postgres: a new cluster, a replica of the primary, or what the
        data directory holds)."""
        user = _runs_as()
        config = self.base / "patroni.yml"
        config.write_text(json.dumps(self.config(hosts), indent=1))  # JSON is YAML
        os.chown(config, user.pw_uid, user.pw_gid)
        self._log = open(self.log_path, "ab")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.base), "LANG": "C.UTF-8"}
        self.process = subprocess.Popen([PATRONI, str(config)], stdout=self._log, stderr=subprocess.STDOUT,
                                        env=env, cwd=self.base, user=user.pw_uid, group=user.pw_gid,
                                        extra_groups=[], start_new_session=True,
                                        preexec_fn=_die_with_test_process if sys.platform.startswith("linux") else None)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return None

    def kill(self) -> None:
        """SIGKILL Patroni and its postgres (the postmaster: its backends end when it is gone)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(f"{self.name}'s postgres to end", lambda: not _postgres_runs(pid), 10.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def state(self) -> dict[str, Any]:
        """Patroni's GET /patroni: its postgres's role and state, timeline, replication."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/patroni", timeout=2) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:  # 503 when not healthy: the body is the same JSON
            return json.loads(error.read())
        except OSError as error:
            return {"error": repr(error)}

    def sql(self, statement: str) -> str:
        found = self.try_sql(statement)
        assert isinstance(found, str), f"psql on {self.name} ({statement}): {found.stderr}"
        return found

    def try_sql(self, statement: str) -> str | subprocess.CompletedProcess[str]:
        """psql's output, or the finished psql when it failed."""
        done = subprocess.run([str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "postgres",
                               "-d", "postgres", "-XAtqc", statement], capture_output=True, text=True, timeout=20)
        return done.stdout.strip() if done.returncode == 0 else done

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _postgres_runs(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


# ---- the two nodes on a store ---------------------------------------------------------------------

@dataclass
class Deployment:
    store: GatewayStore
    nodes: dict[str, PatroniNode]

    def primary(self) -> str | None:
        """The one node Patroni runs as primary while the other is a running replica, or None."""
        states = {name: node.state() for name, node in self.nodes.items()}
        primaries = [n for n, s in states.items() if s.get("role") in PRIMARY_ROLES and s.get("state") == "running"]
        replicas = [n for n, s in states.items() if s.get("role") == "replica" and s.get("state") == "running"]
        return primaries[0] if len(primaries) == 1 and len(replicas) == 1 else None

    def streaming(self, primary: str) -> bool:
        """The primary lists the other node's walreceiver as streaming (pg_stat_replication)."""
        replication = self.nodes[primary].state().get("replication") or []
        others = {name for name in self.nodes if name != primary}
        return {r.get("application_name") for r in replication if r.get("state") == "streaming"} == others

    def leader_key(self) -> str | None:
        """The node Patroni's leader key in the store names ("" when there is no such key), read
        through the store's gateway; None when no member answered."""
        key = base64.b64encode(f"/service/{SCOPE}/leader".encode()).decode()
        for url in self.store.urls:
            try:
                found = post_json(url, "/v3/kv/range", {"key": key}, timeout=2)
            except OSError:  # killed, or between leaders
                continue
            kvs = found.get("kvs") or []
            return base64.b64decode(kvs[0]["value"]).decode() if kvs else ""
        return None

    def log_tails(self) -> str:
        return "\n".join(f"==== patroni {n.name} ({n.log_path})\n{n.log_tail()}" for n in self.nodes.values())


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    user = _runs_as()
    base = Path(tempfile.mkdtemp(prefix="raftkv-patroni-"))  # /tmp/pytest-of-root is root's alone
    ports = free_ports(4)
    nodes: dict[str, PatroniNode] = {}
    try:
        for i, name in enumerate(("pg1", "pg2")):
            (base / name).mkdir(mode=0o700)
            os.chown(base / name, user.pw_uid, user.pw_gid)
            nodes[name] = PatroniNode(name, base / name, ports[2 * i], ports[2 * i + 1])
        base.chmod(0o755)
        with gateway_store(STORE_KIND, tmp_path / "store") as store:
            deployed = Deployment(store, nodes)
            try:
                yield deployed
            except BaseException:
                print(deployed.log_tails())
                raise
            finally:
                for node in nodes.values():
                    node.kill()
    finally:
        release_ports(ports)
        shutil.rmtree(base, ignore_errors=True)


def insert_and_read_back(deployed: Deployment, primary: str, value: str) -> None:
    """A row written on the primary appears on the replica."""
    (replica,) = [name for name in deployed.nodes if name != primary]
    deployed.nodes[primary].sql("CREATE TABLE IF NOT EXISTS t (v text)")
    deployed.nodes[primary].sql(f"INSERT INTO t VALUES ('{value}')")
    wait_until(f"the row {value!r} on the replica {replica}",
               lambda: value in str(deployed.nodes[replica].try_sql("SELECT v FROM t")).split("\n"), 20.0)


# ---- the test ------------------------------------------------------------------------------------

def test_patroni_fails_over_on_the_store_and_keeps_its_primary_through_the_stores_failover(
        deployment: Deployment) -> None:
    deployed = deployment
    hosts = deployed.store.hosts
    for node in deployed.nodes.values():
        node.start(hosts)

    # A primary is elected, the other node streams from it, and a row written on one is on the other.
    first = wait_until("a primary and a running replica", deployed.primary, 90.0)
    wait_until(f"the replica streaming from {first}", lambda: deployed.streaming(first), 30.0)
    assert deployed.leader_key() == first
    insert_and_read_back(deployed, first, "before failover")

    # SIGKILL the primary's Patroni and postgres: the replica is promoted within a minute.
    (second,) = [name for name in deployed.nodes if name != first]
    killed_at = time.monotonic()
    deployed.nodes[first].kill()
    wait_until(f"{second} promoted", lambda: deployed.nodes[second].state().get("role") in PRIMARY_ROLES
               and deployed.leader_key() == second, PROMOTION_DEADLINE_S)
    assert time.monotonic() - killed_at < PROMOTION_DEADLINE_S
    assert deployed.nodes[second].sql("SELECT v FROM t") == "before failover"

    # The old primary, started again, rejoins as a replica of the new one.
    deployed.nodes[first].start(hosts)
    assert wait_until("the old primary back as a replica", deployed.primary, 90.0) == second
    wait_until(f"{first} streaming from {second}", lambda: deployed.streaming(second), 30.0)
    insert_and_read_back(deployed, second, "after failover")

    # SIGKILL the store's leader: the store elects another, and Patroni keeps its primary: for
    # longer than the leader key's ttl (had Patroni failed to keep its lease alive, the key would
    # be gone by then), the same node is primary and holds the leader key.
    store_leader = deployed.store.wait_for_leader()
    deployed.store.kill(store_leader)
    killed_at = time.monotonic()
    assert deployed.store.wait_for_leader() != store_leader
    while time.monotonic() - killed_at < TTL_S + LOOP_WAIT_S:
        assert deployed.nodes[second].state().get("role") in PRIMARY_ROLES, deployed.nodes[second].state()
        assert deployed.leader_key() in (second, None), "the leader key is gone or names another node"
        time.sleep(0.2)
    assert deployed.leader_key() == second
    assert deployed.primary() == second
    insert_and_read_back(deployed, second, "after the store failover")
