"""A large round trip through etcd's snapshot format, timed: a real etcd 3.4 gets N keys (one Txn
per 128), is compacted at its newest revision (so that every key lies below the compacted
revision: the export's worst case, which sorts them), and its `etcdctl snapshot save` is restored
into raftkv (`raftkv snapshot restore`); the raftkv node started on it streams an etcd snapshot
to `etcdctl snapshot save`, which `etcdctl snapshot restore` makes into an etcd data directory,
and that etcd's key count and a sample of keys are compared with the first. Each step's wall time
and peak memory (the maximum resident set of the process doing it; for the raftkv node, its
high-water mark across the whole save) are printed as a table for docs/performance.md. Not a
test; run it by hand:

    python benchmarks/etcd_snapshot_round_trip.py --keys 1000000
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import grpc  # noqa: E402

from kv import Client  # noqa: E402
from kv.tools.cluster_up import child_env, free_ports  # noqa: E402
from raftkv_proto import etcd_rpc_pb2 as pb  # noqa: E402
from raftkv_proto import etcd_rpc_pb2_grpc  # noqa: E402

PER_TXN = 128


def etcd(data: Path, name: str, client: int, peer: int, log: Path) -> subprocess.Popen[bytes]:
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    return subprocess.Popen(["etcd", "--data-dir", str(data), "--name", name, "--listen-client-urls", url,
                             "--advertise-client-urls", url, "--listen-peer-urls", peer_url,
                             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"{name}={peer_url}",
                             "--quota-backend-bytes", str(8 << 30)],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def wait_serving(endpoint: str) -> pb.RangeResponse:
    with grpc.insecure_channel(endpoint) as channel:
        kv = etcd_rpc_pb2_grpc.KVStub(channel)
        for _ in range(600):
            try:
                return kv.Range(pb.RangeRequest(key=b"\0", range_end=b"\0", count_only=True), timeout=5)
            except grpc.RpcError:
                time.sleep(0.1)
    raise SystemExit(f"{endpoint} never served")


def timed(what: str, command: list[str], rows: list[tuple[str, float, float]], cwd: Path) -> None:
    """Run `command`, recording its wall time and its peak resident set (its own rusage, wait4)."""
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=child_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{what}: {' '.join(command)} exited {process.returncode}")
    rows.append((what, time.monotonic() - start, usage.ru_maxrss / 1024))


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="etcd-snapshot-round-trip-"))
    processes: list[subprocess.Popen[bytes]] = []
    rows: list[tuple[str, float, float]] = []
    try:
        c1, p1, c2, p2, r_client, r_peer = free_ports(6)
        first = f"127.0.0.1:{c1}"
        processes.append(etcd(work / "etcd1", "one", c1, p1, work / "etcd1.log"))
        wait_serving(first)
        start = time.monotonic()
        value = b"v" * args.value_bytes
        with grpc.insecure_channel(first) as channel:
            kv = etcd_rpc_pb2_grpc.KVStub(channel)
            for lo in range(0, args.keys, PER_TXN):
                kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
                    key=b"key/%09d" % i, value=value)) for i in range(lo, min(lo + PER_TXN, args.keys))]), timeout=60)
            revision = kv.Range(pb.RangeRequest(key=b"key/", count_only=True)).header.revision
            kv.Compact(pb.CompactionRequest(revision=revision, physical=True), timeout=600)
        print(f"loaded {args.keys} keys into etcd in {time.monotonic() - start:.1f} s (revision {revision})")

        etcd_file, raftkv_file = work / "from-etcd.db", work / "from-raftkv.db"
        timed("etcdctl snapshot save (from etcd)", ["etcdctl", f"--endpoints={first}", "snapshot", "save",
                                                   str(etcd_file)], rows, work)
        timed("raftkv snapshot inspect (etcd file)", [sys.executable, "-m", "kv", "snapshot", "inspect",
                                                      str(etcd_file)], rows, work)
        timed("raftkv snapshot restore (etcd file)", [sys.executable, "-m", "kv", "snapshot", "restore", str(etcd_file),
                                                      "--data-dir", str(work / "raftkv"), "--id", "r1", "--peers",
                                                      f"r1=127.0.0.1:{r_peer}"], rows, work)
        node = subprocess.Popen([sys.executable, "-m", "kv", "serve", "--id", "r1", "--data-dir", str(work / "raftkv"),
                                 "--listen", f"127.0.0.1:{r_client}", "--peers", f"r1=127.0.0.1:{r_peer}"],
                                env=child_env(), stdout=open(work / "raftkv.log", "wb"), stderr=subprocess.STDOUT)
        processes.append(node)
        with Client([f"127.0.0.1:{r_client}"], timeout=60) as client:
            for _ in range(600):
                if client.status()[0].get("role") == "leader":
                    break
                time.sleep(0.1)
        served = wait_serving(f"127.0.0.1:{r_client}")
        assert served.count == args.keys and served.header.revision == revision, served
        node_before = peak_mib(node.pid)
        timed("etcdctl snapshot save (from raftkv)", ["etcdctl", f"--endpoints=127.0.0.1:{r_client}", "snapshot", "save",
                                                     str(raftkv_file)], rows, work)
        rows[-1] = (rows[-1][0] + f"; raftkv node peak {peak_mib(node.pid):.0f} MiB (was {node_before:.0f})",
                    rows[-1][1], rows[-1][2])
        timed("etcdctl snapshot status (raftkv's file)", ["etcdctl", "snapshot", "status", str(raftkv_file)], rows, work)
        peer = f"http://127.0.0.1:{p2}"
        timed("etcdctl snapshot restore (raftkv's file)", ["etcdctl", "snapshot", "restore", str(raftkv_file),
                                                          "--data-dir", str(work / "etcd2"), "--name", "two",
                                                          "--initial-cluster", f"two={peer}",
                                                          "--initial-advertise-peer-urls", peer], rows, work)
        processes.append(etcd(work / "etcd2", "two", c2, p2, work / "etcd2.log"))
        second = wait_serving(f"127.0.0.1:{c2}")
        assert second.count == args.keys and second.header.revision == revision, second
        with grpc.insecure_channel(first) as one, grpc.insecure_channel(f"127.0.0.1:{c2}") as two:
            a, b = etcd_rpc_pb2_grpc.KVStub(one), etcd_rpc_pb2_grpc.KVStub(two)
            for i in random.Random(1).sample(range(args.keys), 1000):
                request = pb.RangeRequest(key=b"key/%09d" % i)
                assert a.Range(request).kvs == b.Range(request).kvs, i
        print(f"round trip verified: {args.keys} keys, revision {revision}, 1,000 sampled keys equal "
              f"(value, create/mod revision, version)")
        print(f"files: etcd's {etcd_file.stat().st_size / 2**20:.0f} MiB, raftkv's {raftkv_file.stat().st_size / 2**20:.0f} MiB")
        print("| step | seconds | peak RSS (MiB) |\n| --- | --- | --- |")
        for what, seconds, peak in rows:
            print(f"| {what} | {seconds:.1f} | {peak:.0f} |")
    finally:
        for process in processes:
            process.kill()
            process.wait()
        if os.environ.get("KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
