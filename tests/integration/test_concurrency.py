"""Locks and elections (kv.concurrency) on real members: mutual exclusion checked by fencing
revisions while leaders are killed, and the same lock and election shared with etcdctl."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kv.concurrency import Election, Lock
from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration

ETCDCTL = shutil.which("etcdctl")

# One contender: takes the lock ROUNDS times, holding it briefly; prints each hold's fencing
# revision and its start and end on the machine's monotonic clock.
_CONTENDER = """
import json, sys, time
from kv import Client
from kv.concurrency import Lock
endpoints, rounds = sys.argv[1].split(","), int(sys.argv[2])
with Client(endpoints, timeout=30) as client:
    for _ in range(rounds):
        with Lock(client, "fenced", ttl=10) as held:
            start = time.monotonic()
            time.sleep(0.02)
            print(json.dumps([held.revision, start, time.monotonic()]), flush=True)
"""


def test_lock_holders_never_overlap_while_leaders_are_killed(cluster: Cluster, tmp_path: Path) -> None:
    cluster.wait_for_leader()
    contenders = [subprocess.Popen([sys.executable, "-c", _CONTENDER, ",".join(cluster.endpoints), "25"],
                                   stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for _ in range(2):
            time.sleep(2)
            leader = cluster.wait_for_leader()
            cluster.kill(leader)
            cluster.wait_for_leader(among=[n for n in cluster.nodes if n != leader])
            cluster.start_node(leader)
        outputs = [p.communicate(timeout=240)[0] for p in contenders]
    finally:
        for p in contenders:
            p.kill()
    assert all(p.returncode == 0 for p in contenders)
    holds = sorted(json.loads(line) for out in outputs for line in out.splitlines())
    assert len(holds) == 75
    revisions = [hold[0] for hold in holds]
    assert len(set(revisions)) == len(revisions)  # every hold has a fencing revision of its own
    for earlier, later in zip(holds, holds[1:]):
        assert earlier[2] <= later[1], f"holds {earlier} and {later} overlap"  # in fencing order, one after another


@pytest.mark.skipif(ETCDCTL is None, reason="etcdctl is not installed (Debian: etcd-client)")
def test_etcdctl_and_a_python_service_share_one_lock(cluster: Cluster, tmp_path: Path) -> None:
    cluster.wait_for_leader()
    c = cluster.client()
    endpoint = cluster.endpoints[0]
    marker = tmp_path / "etcdctl-held"
    with Lock(c, "shared"):
        waiting = subprocess.Popen([ETCDCTL, "--endpoints", endpoint, "lock", "shared", "touch", str(marker)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until("etcdctl waiting for the lock", lambda: len(c.get_range("shared/")[0]) == 2 or None)
        time.sleep(0.5)
        assert not marker.exists() and waiting.poll() is None  # it waits while Python holds the lock
    waiting.communicate(timeout=30)
    assert marker.exists()
    # And the other way round: etcdctl holds it while its command runs, and that command waits for
    # a go file; Python asks for the lock meanwhile and gets it only after the command finished.
    held, go, finished = tmp_path / "etcdctl-holds", tmp_path / "go", tmp_path / "etcdctl-command-finished"
    holder = subprocess.Popen([ETCDCTL, "--endpoints", endpoint, "lock", "shared", "--", "sh", "-c",
                               f"touch {held}; while [ ! -e {go} ]; do sleep 0.05; done; touch {finished}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until("etcdctl holding the lock", lambda: held.exists())
    acquired: list[bool] = []

    def take_the_lock() -> None:
        with Lock(c, "shared"):
            acquired.append(finished.exists() and len(c.get_range("shared/")[0]) == 1)

    taker = threading.Thread(target=take_the_lock)
    taker.start()
    wait_until("Python waiting for the lock", lambda: len(c.get_range("shared/")[0]) == 2 or None)
    assert acquired == []  # it waits while etcdctl holds it
    go.touch()
    taker.join(timeout=30)
    assert acquired == [True]  # once etcdctl's command finished and its key was gone
    holder.communicate(timeout=30)


@pytest.mark.skipif(ETCDCTL is None, reason="etcdctl is not installed (Debian: etcd-client)")
def test_etcdctl_and_a_python_service_share_one_election(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    c = cluster.client()
    endpoint = cluster.endpoints[1]
    python_side = Election(c, "sched", ttl=5)
    python_side.campaign(b"python")
    assert python_side.leader() == b"python"
    contender = subprocess.Popen([ETCDCTL, "--endpoints", endpoint, "elect", "sched", "etcdctl"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(contender.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    wait_until("etcdctl campaigning", lambda: len(c.get_range("sched/")[0]) == 2 or None)
    time.sleep(0.5)
    assert python_side.leader() == b"python" and not lines  # etcdctl waits behind the Python leader
    python_side.close()
    wait_until("etcdctl elected", lambda: python_side.leader() == b"etcdctl" or None)
    wait_until("etcdctl says it leads", lambda: any("etcdctl" in line for line in lines) or None)
    contender.terminate()
    contender.wait(10)


def test_observe_reports_each_leader_as_it_changes(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    c = cluster.client()
    first, second = Election(c, "obs", ttl=5), Election(c, "obs", ttl=5)
    first.campaign(b"a")
    seen: list[bytes] = []
    observer = Election(c, "obs", ttl=5)

    def observe() -> None:
        for value in observer.observe():
            seen.append(value)
            if len(seen) == 3:
                return
    thread = threading.Thread(target=observe, daemon=True)
    thread.start()
    wait_until("the first leader observed", lambda: seen == [b"a"] or None)
    first.proclaim(b"a2")
    wait_until("the proclaimed value observed", lambda: seen == [b"a", b"a2"] or None)
    campaigning = threading.Thread(target=second.campaign, args=(b"b",))
    campaigning.start()
    first.close()  # resigns: the second participant leads
    campaigning.join(20)
    thread.join(20)
    assert seen == [b"a", b"a2", b"b"]
    second.close()
    observer.close()
