"""`raftkv serve` with (almost) no flags: a single-node store in ./raftkv-data. The defaults
themselves (127.0.0.1:7001) are checked through the parser in tests/unit/test_cli.py; here the
one flag given is --listen on a free port, so the test never collides with a real 7001. Then
`raftkv serve` on a data directory whose log is corrupt: refused at start, in one line."""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kv import Client
from kv.tools.cluster_up import child_env
from raft.core.types import Entry, EntryType, HardState
from raftkv_proto import kv_pb2
from raft.log import LOG_DIR, WalLogStore
from tests.integration.cluster import free_ports, stop_process, wait_until

pytestmark = pytest.mark.integration


def test_serve_without_flags_is_a_single_node_store_in_the_cwd(tmp_path: Path):
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "kv", "serve", "--listen", address], cwd=tmp_path,
                               stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
    try:
        with Client(address, timeout=10.0) as client:
            wait_until("the single node to lead", lambda: client.status()[0].get("role") == "leader")
            (status,) = client.status()
            assert status["id"] == "n1" and status["leader"] == "n1"
            client.put("hello", "world")
            assert client.get("hello") == b"world"
        assert (tmp_path / "raftkv-data").is_dir()

        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0  # a clean stop
    except BaseException:
        print((tmp_path / "serve.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()

    # Started again on the same directory, it still has the data.
    process = subprocess.Popen([sys.executable, "-m", "kv", "serve", "--listen", address], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                               start_new_session=True)
    try:
        with Client(address, timeout=15.0) as client:
            assert client.get("hello") == b"world"
    finally:
        stop_process(process)


@pytest.mark.parametrize("sigterms", [1, 2], ids=["sigterm", "sigterm-again-while-stopping"])
def test_stopping_ends_an_open_pipeline_with_unavailable(tmp_path: Path, sigterms: int):
    """A client's pipeline stays open between requests; a stopping node must end it at once, with
    UNAVAILABLE (its client then retries elsewhere), not hold its stop for the grace period. A
    second SIGTERM that arrives while it stops (the pipeline's end says it is stopping) must not
    cut the stop short: the exit stays clean."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "kv", "serve", "--listen", address, "--data-dir", "data"],
                               cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                               start_new_session=True)
    requests: queue.SimpleQueue[kv_pb2.PipelineRequest | None] = queue.SimpleQueue()

    def outgoing() -> Iterator[kv_pb2.PipelineRequest]:
        while (message := requests.get()) is not None:
            yield message

    channel = grpc.insecure_channel(address)
    try:
        with Client(address, timeout=10.0) as client:
            wait_until("the single node to lead", lambda: client.status()[0].get("role") == "leader")
        call = channel.stream_stream("/raftkv.kv.KV/Pipeline",
                                     request_serializer=kv_pb2.PipelineRequest.SerializeToString,
                                     response_deserializer=kv_pb2.PipelineReply.FromString)(outgoing(), timeout=60)
        put = kv_pb2.StreamRequest(put=kv_pb2.PutRequest(key=b"k", value=b"v"))
        requests.put(kv_pb2.PipelineRequest(requests=[kv_pb2.TaggedRequest(tag=7, request=put)]))
        (answered,) = next(call).replies
        assert answered.tag == 7 and answered.reply.put.index > 0
        process.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as ended:
            next(call)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (ended.value.details() or "")
        for _ in range(sigterms - 1):
            process.send_signal(signal.SIGTERM)
        returncode = process.wait(15)
        if sigterms == 1:
            assert returncode == 0
        else:
            # The stop can be over before the second SIGTERM arrives (it takes milliseconds once
            # the pipeline has ended): the node has then put its signal handlers back and the
            # signal ends a process that has already stopped cleanly. Either way the stop must
            # have run to its end; while it runs, the signal is ignored and the exit is clean.
            logged = (tmp_path / "serve.log").read_text(errors="replace")
            assert "node n1 stopped" in logged
            ignored = "node n1 is already shutting down (SIGTERM ignored)" in logged
            assert returncode == 0 if ignored else returncode in (0, -signal.SIGTERM)
    except BaseException:
        print((tmp_path / "serve.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        requests.put(None)
        channel.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def serve_on_a_corrupt_log(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`raftkv serve` on a data directory whose log has garbage where a segment should be. It must
    refuse to start: if it started anyway it would serve on --listen until the timeout."""
    data_dir = tmp_path / "data"
    with WalLogStore(data_dir / LOG_DIR) as store:
        store.save(HardState(1, "n1"), None, [Entry(1, 1, EntryType.NOOP)])
    for segment in (data_dir / LOG_DIR).iterdir():
        segment.write_bytes(b"not a raftkv log segment\n" * 4000)
    (port,) = free_ports(1)
    try:
        result = subprocess.run([sys.executable, "-m", "kv", "serve", "--listen", f"127.0.0.1:{port}",
                                 "--data-dir", str(data_dir)],
                                cwd=tmp_path, capture_output=True, text=True, env=child_env(), timeout=30)
    except subprocess.TimeoutExpired as hung:  # subprocess.run has killed it
        raise AssertionError(f"serve did not exit; its stderr:\n{hung.stderr}") from None
    return result


def test_serve_on_a_corrupt_log_exits_with_one_error_line_saying_what_to_do(tmp_path: Path):
    result = serve_on_a_corrupt_log(tmp_path)
    assert result.returncode == 1, result.stderr  # kv.tools.cli.EXIT_FAILED, as for its other errors
    assert "Traceback" not in result.stderr, result.stderr
    assert "raftkv serve: error: raft log at" in result.stderr and "is corrupt" in result.stderr
    assert "remove its data directory" in result.stderr
