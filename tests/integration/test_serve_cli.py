"""`raftkv serve` with (almost) no flags: a single-node store in ./raftkv-data. The defaults
themselves (127.0.0.1:7001) are checked through the parser in tests/unit/test_cli.py; here the
one flag given is --listen on a free port, so the test never collides with a real 7001."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kv import Client
from kv.cluster_up import child_env
from tests.integration.cluster import free_ports, wait_until

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
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
