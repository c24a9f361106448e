"""One client cannot take a node down with large requests or replies: requests over
--max-request-bytes are refused by gRPC before they are built, a scan page stops at a byte budget,
and a Pipeline call whose client never reads holds a bounded number of requests and reply bytes.
Each test watches the node process's memory (/proc/PID/status) and its leadership."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kv.errors import InvalidArgumentError
from raftkv_proto import kv_pb2
from tests.integration.cluster import FAST_TIMING, STEADY_TIMING, Cluster, wait_until

pytestmark = pytest.mark.integration

MiB = 1 << 20
# Far above what a node needs for these tests (about 100 MB), far below what the unbounded cases
# took (2.1 GB for the puts, 1.3 GB for the scan).
RSS_BOUND_BYTES = 500 * MiB


def memory(cluster: Cluster, node_id: str) -> dict[str, int]:
    """VmRSS and VmHWM (the peak RSS since the process started) of a node process, in bytes."""
    process = cluster.nodes[node_id].process
    assert process is not None
    out: dict[str, int] = {}
    with open(f"/proc/{process.pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out


def test_oversized_puts_are_refused_before_the_node_builds_them(make_cluster) -> None:
    cluster = make_cluster(3, extra_args=STEADY_TIMING)  # it checks the leader kept its term
    leader = cluster.wait_for_leader()
    term = cluster.status(leader)["term"]
    stub = cluster.kv_stub(leader)
    value = b"x" * (60 * MiB)

    def put(i: int) -> grpc.RpcError | None:
        try:
            stub.Put(kv_pb2.PutRequest(key=f"big/{i}".encode(), value=value), timeout=60)
        except grpc.RpcError as error:
            return error
        return None

    with ThreadPoolExecutor(16) as pool:
        errors = list(pool.map(put, range(16)))
    peak = memory(cluster, leader)["VmHWM"]
    print(f"leader {leader} VmHWM after 16 concurrent 60 MiB puts: {peak / MiB:.0f} MiB")
    assert all(e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in errors), \
        [(e.code(), e.details()) if e else None for e in errors]
    assert "1572864" in (errors[0].details() or "")
    assert peak < RSS_BOUND_BYTES, f"the leader's RSS peaked at {peak / MiB:.0f} MiB"

    # kv.Client names the limit and the flag, and does not retry: the request can never fit.
    client = cluster.client(timeout=30)
    with pytest.raises(InvalidArgumentError, match=r"--max-request-bytes.*1572864|1572864.*--max-request-bytes"):
        client.put("big", b"x" * (2 * MiB))
    # A batch over the limit is refused the same way (it is one request, one raft entry).
    with pytest.raises(InvalidArgumentError, match="--max-request-bytes"):
        client.batch({f"k{i}": b"v" * (512 << 10) for i in range(4)})
    # The largest valid put still fits, and the leader kept its leadership throughout.
    client.put(b"k" * 511, b"v" * MiB)
    assert client.get(b"k" * 511) == b"v" * MiB
    assert cluster.wait_for_leader() == leader
    assert cluster.status(leader)["term"] == term


def test_a_larger_request_limit_admits_larger_values(make_cluster) -> None:
    cluster = make_cluster(1, extra_args=(*FAST_TIMING, "--max-value-bytes", str(3 * MiB), "--max-request-bytes", "4MiB"))
    leader = cluster.wait_for_leader()
    status = cluster.status(leader)
    assert status["max_request_bytes"] == 4 * MiB
    client = cluster.client()
    client.put("three", b"3" * (3 * MiB))
    assert client.get("three") == b"3" * (3 * MiB)


def test_a_huge_scan_comes_back_in_pages_within_the_byte_budget(make_cluster) -> None:
    cluster = make_cluster(1, extra_args=(*FAST_TIMING, "--no-fsync"))
    leader = cluster.wait_for_leader()
    client = cluster.client(timeout=30)
    values = 200
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: client.put(f"v/{i:04}", bytes([i % 251]) * MiB), range(values)))
    stub = cluster.kv_stub(leader)

    try:
        page = stub.Scan(kv_pb2.ScanRequest(prefix=b"v/", limit=2**32 - 1), timeout=30)
    finally:
        peak = memory(cluster, leader)["VmHWM"]
        print(f"node VmHWM after a scan of 200 x 1 MiB values: {peak / MiB:.0f} MiB")
    page_bytes = sum(len(kv.key) + len(kv.value) for kv in page.items)
    assert page.more and 0 < len(page.items) < values
    assert page_bytes <= 4 * MiB + MiB, f"a page of {page_bytes} bytes"
    assert peak < RSS_BOUND_BYTES, f"the node's RSS peaked at {peak / MiB:.0f} MiB"

    # The client follows the pages: every value comes back, in order.
    items = client.scan(prefix="v/", limit=2**32 - 1)
    assert [k for k, _ in items] == [f"v/{i:04}".encode() for i in range(values)]
    assert all(v == bytes([i % 251]) * MiB for i, (_, v) in enumerate(items))
    assert client.scan(start="v/0010", end="v/0020", limit=5) == items[10:15]
    assert memory(cluster, leader)["VmHWM"] < RSS_BOUND_BYTES

    # Keys only: no value crosses, so one page holds every key (a page's budget is its bytes).
    keys_only = stub.Scan(kv_pb2.ScanRequest(prefix=b"v/", limit=2**32 - 1, keys_only=True), timeout=30)
    assert [(kv.key, kv.value) for kv in keys_only.items] == [(k, b"") for k, _ in items]
    assert not keys_only.more
    assert client.scan(prefix="v/", limit=3, keys_only=True) == [(k, b"") for k, _ in items[:3]]


def test_a_pipeline_whose_client_never_reads_holds_bounded_requests_and_bytes(make_cluster) -> None:
    cluster = make_cluster(1, extra_args=FAST_TIMING)
    leader = cluster.wait_for_leader()
    cluster.client().put("big", b"b" * (128 << 10))
    channel = grpc.insecure_channel(cluster.nodes[leader].address)
    pipeline = channel.stream_stream("/raftkv.kv.KV/Pipeline",
                                     request_serializer=kv_pb2.PipelineRequest.SerializeToString,
                                     response_deserializer=kv_pb2.PipelineReply.FromString)
    messages, per_message = 256, 64  # 16,384 gets of a 128 KiB value: 2 GiB of replies
    sent = 0
    done = threading.Event()

    def requests() -> Iterator[kv_pb2.PipelineRequest]:
        nonlocal sent
        for m in range(messages):
            yield kv_pb2.PipelineRequest(requests=[
                kv_pb2.TaggedRequest(tag=m * per_message + i, request=kv_pb2.StreamRequest(
                    get=kv_pb2.GetRequest(key=b"big")))
                for i in range(per_message)])
            sent += 1
        done.wait()  # keep the call open (half-closing is not what this test is about)

    call = pipeline(requests(), timeout=120)  # its replies are never read
    try:
        def full() -> dict[str, int] | None:
            status = cluster.status(leader)
            rss = memory(cluster, leader)["VmRSS"]
            held = status.get("pipeline_requests_held", 0), status.get("pipeline_reply_bytes_held", 0)
            if rss > RSS_BOUND_BYTES or held[0] >= 4096 or held[1] >= 8 * MiB:
                return {"rss": rss, "requests": held[0], "bytes": held[1]}
            return None

        seen = wait_until("the pipeline to fill its node's budget", full, timeout=60)
        print(f"node held {seen['requests']} requests, {seen['bytes']} reply bytes; RSS {seen['rss'] / MiB:.0f} MiB; "
              f"client sent {sent * per_message} gets")
        # The node stopped reading: what it holds stays within its budget however long the
        # client keeps not reading (a few more polls, each a full status round trip).
        for _ in range(5):
            assert memory(cluster, leader)["VmRSS"] < RSS_BOUND_BYTES
            status = cluster.status(leader)
            assert status["pipeline_requests_held"] <= 4096
            # The 8 MiB budget, and the gets in flight when the first large replies came back.
            assert status["pipeline_reply_bytes_held"] <= 32 * MiB, status
        assert memory(cluster, leader)["VmHWM"] < RSS_BOUND_BYTES
        # Other clients are still served.
        client = cluster.client()
        client.put("alive", "yes")
        assert client.get("alive") == b"yes"
    finally:
        done.set()
        call.cancel()
        channel.close()
