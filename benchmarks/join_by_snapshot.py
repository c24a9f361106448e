"""Seconds from `member add` of a learner to a promoted voter when the new member must install a
snapshot: a local three-node cluster whose members snapshot (and compact their logs) every 50
entries, 100,000 keys of 16-byte values in 100 batches, then a learner n4 added, started with
`serve --join` on an empty data directory, waited for until it has applied the leader's commit
index, and promoted (asked again while refused as not in sync). `raftkv bench --workloads W16`
measures the same on the bench's cluster, whose default threshold leaves the store in the log.

    python benchmarks/join_by_snapshot.py [ROUNDS]
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "proto"))

from kv import Client  # noqa: E402
from kv.errors import FailedPreconditionError  # noqa: E402
from tests.integration.cluster import Cluster, wait_until  # noqa: E402

KEYS, BATCH = 100_000, 1_000


def one_round(base: Path) -> str:
    cluster = Cluster(base, extra_args=("--snapshot-threshold", "50")).start()
    try:
        leader = cluster.wait_for_leader()
        with cluster.client() as client:
            for first in range(0, KEYS, BATCH):
                client.batch([(b"user/%08d" % i, b"v" * 16) for i in range(first, first + BATCH)])
        wait_until("the leader to compact its log", lambda: cluster.status(leader)["log_begin_index"] > 50, 60)
        node = cluster.joining_member("n4")
        with Client(cluster.endpoints, timeout=10) as admin:
            began = time.monotonic()
            admin.member_add("n4", node.peer_address, learner=True)
            node.start()
            cluster.wait_applied("n4", cluster.status(leader)["commit_index"], timeout=120)
            caught_up = time.monotonic()
            while True:
                try:
                    admin.member_promote("n4")
                    break
                except FailedPreconditionError:  # not in sync yet
                    time.sleep(0.05)
            promoted = time.monotonic()
        joined = cluster.status("n4")
        return (f"add -> caught up {caught_up - began:.2f} s, add -> promoted voter {promoted - began:.2f} s "
                f"(n4 installed the snapshot at index {joined['snapshot_index']}; state "
                f"{joined['state_size_bytes'] / 2**20:.1f} MiB)")
    finally:
        cluster.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for n in range(rounds):
        with tempfile.TemporaryDirectory(prefix="raftkv-join-") as work:
            print(f"round {n + 1}: {one_round(Path(work))}")


if __name__ == "__main__":
    main()
