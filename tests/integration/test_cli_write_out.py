"""`-w/--write-out simple|table|json` (etcdctl's) and rich's tables and progress bars, through the
real console script (`python -m kv`) against a real `raftkv serve` process. Its stdout and stderr
are pipes or files, never a terminal: rich must then write plain text (no ANSI codes) and a
progress bar's final state only (no `\\r` frames)."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kv import Client
from kv.tools.cluster_up import child_env
from tests.integration.test_cli_operator import node, unreachable  # noqa: F401 - node is a fixture

pytestmark = pytest.mark.integration

RULE = "─"  # rich's rule under a table's header


def raftkv(*argv: str, stderr: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """The console script; stderr to a pipe, or to an open file."""
    return subprocess.run([sys.executable, "-m", "kv", *argv], stdout=subprocess.PIPE, stderr=stderr, text=True,
                          env=child_env(), timeout=60)


def table_rows(out: str) -> list[list[str]]:
    """A table written to a pipe: header, a rule, then one row per line, cells apart by spaces."""
    assert "\x1b" not in out, "ANSI codes written to a pipe"
    header, rule, *rows = out.splitlines()
    assert set(rule.strip()) == {RULE}, out
    return [header.split(), *(row.split() for row in rows)]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture(scope="module")
def pairs(node: str) -> dict[bytes, bytes]:  # noqa: F811
    rows = {b"wo/a": b"alpha", b"wo/b\tx": b"two\nlines", b"wo/[bold]": b"not markup"}
    with Client(node) as client:
        for key, value in rows.items():
            client.put(key, value)
    return rows


def test_get_in_each_write_out_form(node: str, pairs):  # noqa: F811
    endpoints = ("--endpoints", node)
    assert raftkv("get", "wo/a", *endpoints).stdout == raftkv("get", "wo/a", "-w", "simple", *endpoints).stdout \
        == "alpha\n"
    assert table_rows(raftkv("get", "wo/a", "-w", "table", *endpoints).stdout) == [["KEY", "VALUE"], ["wo/a", "alpha"]]
    as_json = raftkv("get", "wo/a", "--write-out", "json", *endpoints).stdout
    got = json.loads(as_json)
    assert got == {"key": b64(b"wo/a"), "value": b64(b"alpha"), "found": True, "version": 1, "lease": 0,
                   "create_revision": got["mod_revision"], "mod_revision": got["mod_revision"]}
    assert raftkv("get", "wo/a", "--json", *endpoints).stdout == as_json
    absent = raftkv("get", "wo/none", "-w", "table", *endpoints)
    assert (absent.returncode, absent.stdout) == (1, "") and "not found" in absent.stderr


def test_scan_in_each_write_out_form(node: str, pairs):  # noqa: F811
    scan = ("scan", "--prefix", "wo/", "--endpoints", node)
    simple = raftkv(*scan).stdout
    assert simple == raftkv(*scan, "-w", "simple").stdout == "wo/[bold]\tnot markup\nwo/a\talpha\nwo/b\\tx\ttwo\\nlines\n"
    table = raftkv(*scan, "-w", "table").stdout
    assert table_rows(table) == [["KEY", "VALUE"], ["wo/[bold]", "not", "markup"], ["wo/a", "alpha"],
                                 ["wo/b\\tx", "two\\nlines"]]
    as_json = raftkv(*scan, "-w", "json").stdout
    listed = json.loads(as_json)
    assert [{k: kv[k] for k in ("key", "value")} for kv in listed["kvs"]] == [
        {"key": b64(k), "value": b64(pairs[k])} for k in sorted(pairs)]
    assert (listed["count"], listed["more"]) == (3, False)
    assert all(kv["version"] == 1 and kv["create_revision"] == kv["mod_revision"] > 1 for kv in listed["kvs"])
    assert raftkv(*scan, "--json").stdout == as_json
    cut = raftkv(*scan, "-w", "table", "--limit", "1")
    assert len(table_rows(cut.stdout)) == 2 and "1 keys shown, more exist" in cut.stderr
    keys = "wo/[bold]\nwo/a\nwo/b\\tx\n"
    assert raftkv(*scan, "--keys-only").stdout == raftkv(*scan, "--keys-only", "--limit", "0").stdout == keys
    assert table_rows(raftkv(*scan, "--keys-only", "-w", "table").stdout) == [["KEY"], ["wo/[bold]"], ["wo/a"],
                                                                               ["wo/b\\tx"]]
    keys_json = json.loads(raftkv(*scan, "--keys-only", "-w", "json").stdout)
    assert [(kv["key"], kv["value"]) for kv in keys_json["kvs"]] == [(b64(k), "") for k in sorted(pairs)]


def test_status_in_each_write_out_form(node: str):  # noqa: F811
    down = unreachable()
    endpoints = ("--endpoints", f"{node},{down}", "--timeout", "1")
    default, table = raftkv("status", *endpoints), raftkv("status", "-w", "table", *endpoints)
    assert default.returncode == table.returncode == 1  # one endpoint did not answer
    header, up, down_row = table_rows(table.stdout)
    assert table_rows(default.stdout)[0] == header == [
        "ADDRESS", "ID", "ROLE", "TERM", "LEADER", "COMMIT_INDEX", "APPLIED_INDEX", "SNAPSHOT_INDEX", "ERROR"]
    assert up[:3] == [node, "n1", "leader"] and down_row[:8] == [down] + ["-"] * 7
    simple = raftkv("status", "-w", "simple", *endpoints).stdout.splitlines()
    assert [line.split(", ")[:3] for line in simple] == [[node, "n1", "leader"], [down, "-", "-"]]
    as_json = raftkv("status", "-w", "json", *endpoints)
    statuses = json.loads(as_json.stdout)
    assert as_json.returncode == 1
    # The field names are a contract for scripts (docs/operations.md#status-fields).
    assert {"address", "id", "role", "term", "leader", "commit_index", "applied_index",
            "snapshot_index"} <= statuses[0].keys()
    assert statuses[1]["address"] == down and "error" in statuses[1]
    alias, written_out = (raftkv("status", flag, "--endpoints", node).stdout for flag in ("--json", "-wjson"))
    assert alias == written_out and json.loads(alias)[0]["address"] == node  # an idle node: nothing changed


def test_endpoint_health_and_user_and_role_list_tables(node: str):  # noqa: F811
    health = raftkv("endpoint", "health", "-w", "table", "--endpoints", node)
    header, row = table_rows(health.stdout)
    assert header == ["ENDPOINT", "HEALTH", "TOOK", "ERROR"] and row[:2] == [node, "true"]
    assert raftkv("user", "add", "wo-listed", "--new-user-password", "pw", "--endpoints", node).returncode == 0
    assert ["wo-listed"] in table_rows(raftkv("user", "list", "-w", "table", "--endpoints", node).stdout)
    assert "wo-listed" in json.loads(raftkv("user", "list", "--json", "--endpoints", node).stdout)["users"]
    assert table_rows(raftkv("role", "list", "-w", "table", "--endpoints", node).stdout)[0] == ["ROLE"]


def test_a_bad_write_out_is_a_usage_error(node: str):  # noqa: F811
    bad = raftkv("get", "k", "-w", "yaml", "--endpoints", node)
    assert bad.returncode == 2 and "invalid choice: 'yaml'" in bad.stderr


def _no_frames(log: Path, what: str) -> str:
    """A progress bar written to a file: its final state on one line, no `\\r` redraws, no ANSI."""
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text, repr(text)
    (line,) = [line for line in text.splitlines() if line.startswith(what)]
    return line


def test_snapshot_save_progress_into_a_file_has_no_frames_and_save_and_inspect_write_out(node: str, pairs, tmp_path: Path):  # noqa: F811
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        saved = raftkv("snapshot", "save", str(tmp_path / "s.snap"), "--endpoints", node, stderr=err)
    assert saved.returncode == 0 and saved.stdout.startswith("saved ")
    assert "kB" in _no_frames(log, "snapshot save")
    saved = json.loads(raftkv("snapshot", "save", str(tmp_path / "t.snap"), "-w", "json", "--endpoints", node).stdout)
    assert saved["file"] == str(tmp_path / "t.snap") and saved["key_count"] >= len(pairs)
    inspected = raftkv("snapshot", "inspect", str(tmp_path / "t.snap"), "-w", "simple").stdout.strip().split(", ")
    assert inspected == [saved["file"], str(saved["index"]), str(saved["term"]), str(saved["key_count"]),
                         str(saved["size"]), saved["sha256"], "ok"]
    header, row = table_rows(raftkv("snapshot", "inspect", str(tmp_path / "t.snap"), "-w", "table").stdout)
    assert header == ["FILE", "INDEX", "TERM", "KEYS", "BYTES", "SHA256", "CHECKSUM"] and row == inspected
    assert json.loads(raftkv("snapshot", "inspect", str(tmp_path / "t.snap")).stdout)["checksum_ok"] is True


def test_import_progress_into_a_file_has_no_frames(node: str, tmp_path: Path):  # noqa: F811
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = 3000
    pq.write_table(pa.table({"key": [b"imp/%05d" % i for i in range(rows)], "value": [b"v"] * rows}),
                   tmp_path / "in.parquet")
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        loaded = raftkv("import", "--parquet", str(tmp_path / "in.parquet"), "--endpoints", node, stderr=err)
    assert loaded.returncode == 0 and json.loads(loaded.stdout)["rows"] == rows
    assert f"{rows}/{rows}" in _no_frames(log, "import")


def test_auth_status_user_get_and_role_get_in_each_write_out_form(node: str):  # noqa: F811
    endpoints = ("--endpoints", node)
    assert raftkv("user", "add", "wo-alice", "--new-user-password", "pw", *endpoints).returncode == 0
    assert raftkv("role", "add", "wo-reader", *endpoints).returncode == 0
    assert raftkv("role", "grant-permission", "wo-reader", "read", "wo/", "--prefix", *endpoints).returncode == 0
    assert raftkv("user", "grant-role", "wo-alice", "wo-reader", *endpoints).returncode == 0
    assert raftkv("user", "get", "wo-alice", *endpoints).stdout == "User: wo-alice\nRoles: wo-reader\n"
    assert table_rows(raftkv("user", "get", "wo-alice", "-w", "table", *endpoints).stdout) == [
        ["USER", "ROLES"], ["wo-alice", "wo-reader"]]
    assert json.loads(raftkv("user", "get", "wo-alice", "--json", *endpoints).stdout) == {
        "name": "wo-alice", "roles": ["wo-reader"]}
    assert raftkv("role", "get", "wo-reader", *endpoints).stdout == "Role wo-reader\nKV Read:\n\t[wo/, wo0)\nKV Write:\n"
    assert table_rows(raftkv("role", "get", "wo-reader", "-w", "table", *endpoints).stdout) == [
        ["PERMISSION", "RANGE"], ["read", "[wo/,", "wo0)"]]
    assert json.loads(raftkv("role", "get", "wo-reader", "-w", "json", *endpoints).stdout) == {
        "name": "wo-reader", "permissions": [{"perm": "read", "key": b64(b"wo/"), "range_end": b64(b"wo0")}]}
    assert raftkv("auth", "status", *endpoints).stdout == "Authentication Status: false\n"
    assert json.loads(raftkv("auth", "status", "-w", "json", *endpoints).stdout) == {"enabled": False}
    assert table_rows(raftkv("auth", "status", "-w", "table", *endpoints).stdout) == [["ENABLED"], ["false"]]


def test_a_failed_snapshot_save_leaves_only_its_error_line_on_stderr(tmp_path: Path):
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        failed = raftkv("snapshot", "save", str(tmp_path / "s.snap"), "--endpoints", unreachable(), "--timeout", "1",
                        stderr=err)
    assert failed.returncode == 1
    (line,) = log.read_text().splitlines()
    assert line.startswith("raftkv snapshot: error: UNAVAILABLE"), line
