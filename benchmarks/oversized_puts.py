"""What 16 concurrent puts of 60 MiB values (each refused) cost the leader of a local three-node
cluster: its peak RSS (VmHWM) and whether it kept its leadership. Extra arguments go to every
`raftkv serve`, so the request limit can be compared:

    python benchmarks/oversized_puts.py                              # --max-request-bytes 1.5 MiB
    python benchmarks/oversized_puts.py --max-request-bytes 64MiB
"""
from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "proto"))

from raftkv_proto import kv_pb2  # noqa: E402
from tests.integration.cluster import FAST_TIMING, Cluster  # noqa: E402

PUTS, VALUE_BYTES = 16, 60 << 20


def main(serve_args: list[str]) -> None:
    with tempfile.TemporaryDirectory() as base:
        cluster = Cluster(Path(base), 3, (*FAST_TIMING, *serve_args)).start()
        try:
            leader = cluster.wait_for_leader()
            term = cluster.status(leader)["term"]
            stub = cluster.kv_stub(leader)
            value = b"x" * VALUE_BYTES

            def put(i: int) -> str:
                try:
                    stub.Put(kv_pb2.PutRequest(key=b"big/%d" % i, value=value), timeout=60)
                except grpc.RpcError as e:
                    return e.code().name
                return "OK"

            with ThreadPoolExecutor(PUTS) as pool:
                answers = sorted(set(pool.map(put, range(PUTS))))
            process = cluster.nodes[leader].process
            assert process is not None
            with open(f"/proc/{process.pid}/status") as status:
                peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
            kept = cluster.wait_for_leader() == leader and cluster.status(leader)["term"] == term
            print(f"serve {' '.join(serve_args) or '(defaults)'}: answers {', '.join(answers)}; "
                  f"leader peak RSS {peak_kib // 1024} MiB; leadership kept: {kept}")
        finally:
            cluster.close()


if __name__ == "__main__":
    main(sys.argv[1:])
