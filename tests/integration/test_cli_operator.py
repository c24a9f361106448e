"""The `raftkv` client commands an operator meets first, run through the real console entry
(kv.tools.cli.main, or `python -m kv` where stdin matters) against a real `raftkv serve` process:
endpoint health, status of a partly unreachable cluster, values from stdin or a file, and scan's
limit, escaping and JSON."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kv import Client
from kv.tools import cli
from kv.tools.cluster_up import child_env
from tests.integration.cluster import Cluster, free_ports, stop_process, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A single-node store in a `raftkv serve` process; yields its client address."""
    data = tmp_path_factory.mktemp("node")
    address = f"127.0.0.1:{free_ports(1)[0]}"
    log = open(data / "serve.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "kv", "serve", "--listen", address, "--data-dir",
                                str(data / "data"), "--no-fsync"], stdout=log, stderr=subprocess.STDOUT,
                               env=child_env(), start_new_session=True)
    try:
        with Client(address, timeout=10.0) as client:
            wait_until("the single node to lead", lambda: client.status()[0].get("role") == "leader")
        yield address
    finally:
        stop_process(process)
        log.close()


def unreachable() -> str:
    return f"127.0.0.1:{free_ports(1)[0]}"


# A command's --timeout where one endpoint is down: it waits for it that long, and on a busy machine
# even a refused connection, and the healthy member's answer, can take over a second.
DOWN_TIMEOUT = "5"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_endpoint_health_of_a_healthy_member_and_an_unreachable_one(node: str, capsys):
    code, out, err = run(capsys, "endpoint", "health", "--endpoints", node)
    assert (code, err) == (0, "")
    assert re.fullmatch(rf"{re.escape(node)} is healthy: took \d+\.\d ms\n", out), out
    down = unreachable()
    code, out, _ = run(capsys, "endpoint", "health", "--endpoints", f"{node},{down}", "--timeout", DOWN_TIMEOUT)
    healthy, unhealthy = out.splitlines()
    assert code == 1
    assert healthy.startswith(f"{node} is healthy: took ")
    assert unhealthy.startswith(f"{down} is unhealthy: ") and "UNAVAILABLE" in unhealthy
    code, out, _ = run(capsys, "endpoint", "health", "--json", "--endpoints", f"{node},{down}", "--timeout", DOWN_TIMEOUT)
    first, second = json.loads(out)
    assert code == 1
    assert first["endpoint"] == node and first["health"] is True and first["took_ms"] >= 0
    assert "error" not in first
    assert second["endpoint"] == down and second["health"] is False and "UNAVAILABLE" in second["error"]


def test_endpoint_health_of_a_three_member_cluster_with_one_member_killed(tmp_path: Path, capsys):
    cluster = Cluster(tmp_path).start()
    try:
        leader = cluster.wait_for_leader()
        endpoints = ("--endpoints", ",".join(cluster.endpoints), "--timeout", DOWN_TIMEOUT)
        code, out, _ = run(capsys, "endpoint", "health", *endpoints)
        assert code == 0 and out.count(" is healthy: took ") == 3, out
        follower = next(n for n in cluster.nodes if n != leader)
        cluster.kill(follower)
        code, out, _ = run(capsys, "endpoint", "health", *endpoints)
        lines = dict(line.split(" is ", 1) for line in out.splitlines())
        assert code == 1
        assert lines[cluster.nodes[follower].address].startswith("unhealthy: ")
        assert all(verdict.startswith("healthy: ") for address, verdict in lines.items()
                   if address != cluster.nodes[follower].address), out  # two of three are still a quorum
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.close()


def test_status_exits_1_when_an_endpoint_is_unreachable_but_prints_the_others(node: str, capsys):
    assert run(capsys, "status", "--endpoints", node)[0] == 0
    down = unreachable()
    code, out, _ = run(capsys, "status", "--endpoints", f"{node},{down}", "--timeout", DOWN_TIMEOUT)
    _, _, up_row, down_row = out.splitlines()  # the header, its rule, then one row per endpoint
    assert code == 1
    assert up_row.startswith(node) and "leader" in up_row
    assert down_row.split()[:8] == [down] + ["-"] * 7 and len(down_row.split()) > 8  # then its error


def test_put_reads_a_1_mb_binary_value_from_stdin_or_a_file(node: str, tmp_path: Path, capsys):
    value = (bytes(range(256)) * 3907)[:999_996] + b"\n\x00\r\n"  # 1 MB (1,000,000 bytes) of every byte
    assert len(value) == 1_000_000
    put = subprocess.run([sys.executable, "-m", "kv", "put", "big/stdin", "-", "--endpoints", node],
                         input=value, capture_output=True, env=child_env(), timeout=60)
    assert put.returncode == 0, put.stderr
    assert put.stdout.startswith(b"OK index=")
    (tmp_path / "value").write_bytes(value[::-1])
    assert run(capsys, "put", "big/file", "--value-file", str(tmp_path / "value"), "--endpoints", node)[0] == 0
    (tmp_path / "dash").write_bytes(b"-")
    assert run(capsys, "put", "dash", "--value-file", str(tmp_path / "dash"), "--endpoints", node)[0] == 0
    with Client(node, timeout=10.0) as client:
        assert client.get("big/stdin") == value
        assert client.get("big/file") == value[::-1]
        assert client.get("dash") == b"-"
    got = subprocess.run([sys.executable, "-m", "kv", "get", "big/stdin", "--endpoints", node],
                         capture_output=True, env=child_env(), timeout=60)
    assert got.stdout == value + b"\n"  # get prints the bytes as they are


@pytest.mark.parametrize("argv, message", [
    (["put", "k", "v", "--value-file", "f"], "give VALUE or --value-file, not both"),
    (["put", "k", "-", "--value-file", "f"], "give VALUE or --value-file, not both"),
    (["put", "k"], "required"),
])
def test_put_needs_exactly_one_value(argv: list[str], message: str, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_put_value_file_that_cannot_be_read_is_one_error_line(tmp_path: Path, capsys):
    code, _, err = run(capsys, "put", "k", "--value-file", str(tmp_path / "absent"), "--endpoints", unreachable())
    assert code == 1 and err.startswith("raftkv put: error:") and "absent" in err


@pytest.fixture(scope="module")
def hundred_and_five_keys(node: str) -> list[bytes]:
    keys = [f"many/{i:03}".encode() for i in range(105)]
    with Client(node, timeout=10.0) as client:
        client.batch({key: b"v" for key in keys})
    return keys


def test_scan_says_on_stderr_when_it_stopped_at_its_limit_and_limit_0_is_all(node: str, hundred_and_five_keys,
                                                                            capsys):
    endpoints = ("--endpoints", node)
    code, out, err = run(capsys, "scan", "--prefix", "many/", *endpoints)
    assert code == 0 and len(out.splitlines()) == 100
    assert err == "raftkv scan: 100 keys shown, more exist; --limit 0 shows all\n"
    code, out, err = run(capsys, "scan", "--prefix", "many/", "--limit", "0", *endpoints)
    assert (code, err) == (0, "")
    assert [line.split("\t")[0].encode() for line in out.splitlines()] == hundred_and_five_keys
    assert run(capsys, "scan", "--prefix", "many/", "--limit", "105", *endpoints)[2] == ""  # exactly all of them
    assert "104 keys shown, more exist" in run(capsys, "scan", "--prefix", "many/", "--limit", "104", *endpoints)[2]
    code, out, _ = run(capsys, "scan", "--start", "many/100", "--end", "many/103", "--limit", "0", *endpoints)
    assert out == "many/100\tv\nmany/101\tv\nmany/102\tv\n"


ODD_PAIRS = {b"esc/a\tb": b"line1\nline2\\", "esc/café".encode(): b"\r", b"esc/\xff\x00": b"\x01 \x7f"}


def test_scan_escapes_tabs_newlines_backslashes_and_binary_in_its_plain_output(node: str, capfd):
    import codecs
    with Client(node, timeout=10.0) as client:
        client.batch(ODD_PAIRS)
    assert cli.main(["scan", "--prefix", "esc/", "--endpoints", node]) == 0
    out = capfd.readouterr().out.encode()
    assert out == (b"esc/a\\tb\tline1\\nline2\\\\\n"
                   + "esc/café".encode() + b"\t\\r\n"  # printable UTF-8 stays as it is
                   + b"esc/\\xff\\x00\t\\x01 \\x7f\n")
    # Each field decodes back to its bytes as a Python bytes literal's body does.
    decoded = dict(tuple(codecs.escape_decode(field)[0] for field in line.split(b"\t")) for line in out.splitlines())
    assert decoded == ODD_PAIRS


def test_put_get_delete_scan_json_print_base64_keys_and_values(node: str, capsys):
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    endpoints = ("--endpoints", node)
    code, out, _ = run(capsys, "put", "json/1", "one", "--json", *endpoints)
    put = json.loads(out)
    assert code == 0 and put["key"] == b64(b"json/1") and put["index"] > 0
    got = json.loads(run(capsys, "get", "json/1", "--json", *endpoints)[1])
    assert got == {"key": b64(b"json/1"), "value": b64(b"one"), "found": True, "version": 1, "lease": 0,
                   "create_revision": got["mod_revision"], "mod_revision": got["mod_revision"]}
    with Client(node, timeout=10.0) as client:
        client.put(b"json/\xff\t", b"\n\x00")
    code, out, err = run(capsys, "scan", "--prefix", "json/", "--limit", "1", "--json", *endpoints)
    assert code == 0 and "more exist" in err
    listed = json.loads(out)
    assert [{k: kv[k] for k in ("key", "value")} for kv in listed["kvs"]] == [{"key": b64(b"json/1"),
                                                                             "value": b64(b"one")}]
    assert (listed["count"], listed["more"], listed["kvs"][0]["version"]) == (1, True, 1)
    second = json.loads(run(capsys, "scan", "--prefix", "json/", "--json", *endpoints)[1])["kvs"][1]
    assert (second["key"], second["value"]) == (b64(b"json/\xff\t"), b64(b"\n\x00"))
    assert json.loads(run(capsys, "delete", "json/1", "--json", *endpoints)[1]) == {
        "key": b64(b"json/1"), "deleted": True}
    code, out, _ = run(capsys, "get", "json/1", "--json", *endpoints)
    assert code == 1 and json.loads(out) == {"key": b64(b"json/1"), "value": None, "found": False,
                                             "create_revision": None, "mod_revision": None, "version": None,
                                             "lease": None}
    assert json.loads(run(capsys, "delete", "json/1", "--json", *endpoints)[1])["deleted"] is False


def test_a_write_without_quorum_says_what_each_endpoint_answered(tmp_path: Path, capsys):
    cluster = Cluster(tmp_path).start()
    try:
        leader = cluster.wait_for_leader()
        survivor = next(n for n in cluster.nodes if n != leader)
        for node_id in cluster.nodes:
            if node_id != survivor:
                cluster.kill(node_id)
        code, _, err = run(capsys, "put", "k", "v", "--endpoints", ",".join(cluster.endpoints), "--timeout", DOWN_TIMEOUT)
        assert code == 1
        assert f"no node served the request within {DOWN_TIMEOUT}s" in err, err
        for node_id, node in cluster.nodes.items():
            expected = "not the leader, and knows no leader" if node_id == survivor else "no connection"
            assert f"{node.address}: {expected}" in err, err
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.close()
