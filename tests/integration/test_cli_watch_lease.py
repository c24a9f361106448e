"""`raftkv watch` and `raftkv lease grant|revoke|keep-alive|timetolive|list` (and `put --lease`),
run as an operator runs them: the real console script (`raftkv`, else `python -m kv`) in a
subprocess, against a real three-member cluster. Where etcdctl has the same command, etcdctl runs
it too against the same cluster (it speaks to raftkv's etcd API) and the two outputs are compared:
both print what the same server answered.

A watch never ends by itself: it runs as a child process whose stdout lines are read with a
deadline (Stream), then it is interrupted as Ctrl-C does (SIGINT), which ends it with exit 0 and
nothing on stderr. Every subprocess call has a timeout. The module's cluster is shared; each test
uses keys of its own; the member kill and the compaction come last."""
from __future__ import annotations

import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kv.txn import put
from tests.integration.cluster import Cluster, module_cluster, wait_until
from tests.integration.test_cli_revisions import console_script, environment

pytestmark = pytest.mark.integration

ETCDCTL = shutil.which("etcdctl")
needs_etcdctl = pytest.mark.skipif(ETCDCTL is None, reason="needs etcdctl 3.4 on PATH (Debian: etcd-client)")
CALL_TIMEOUT_S = 60
# How long a streaming command may take to print what is awaited: a CLI process takes seconds to
# start on a busy two-core machine.
LINE_TIMEOUT_S = 60
COMPACTED = "etcdserver: mvcc: required revision has been compacted"
NOT_FOUND = "etcdserver: requested lease not found"
# etcdctl -w json's fields of the response header, which raftkv's -w json leaves out.
HEADER_FIELDS = ("cluster_id", "member_id", "revision", "raft_term")

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from module_cluster(tmp_path_factory.mktemp("cluster"))


def raftkv_argv(cluster: Cluster, *argv: str, endpoints: list[str] | None = None) -> list[str]:
    return [*console_script(), *argv, "--endpoints", ",".join(endpoints or cluster.endpoints), "--timeout", "10"]


def etcdctl_argv(cluster: Cluster, *argv: str, endpoints: list[str] | None = None) -> list[str]:
    assert ETCDCTL is not None
    return [ETCDCTL, "--endpoints", ",".join(endpoints or cluster.endpoints), "--command-timeout", "10s", *argv]


def raftkv(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(raftkv_argv(cluster, *argv), capture_output=True, env=environment(), timeout=CALL_TIMEOUT_S)


def etcdctl(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(etcdctl_argv(cluster, *argv), capture_output=True, env=etcdctl_env(),
                          timeout=CALL_TIMEOUT_S)


def etcdctl_env() -> dict[str, str]:
    return {**environment(), "ETCDCTL_API": "3"}


def ok(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, (done.args, done.returncode, done.stdout, done.stderr)
    assert done.stderr == b"", done.stderr
    return done.stdout.decode()


# Starts a command with SIGINT at its default disposition, as a terminal starts the command Ctrl-C
# reaches. A process inherits an ignored SIGINT: pytest started in the background by a
# non-interactive shell (`nohup ... &`, `cmd &` in a script or CI step) has it ignored, and so would
# every command it starts, which Ctrl-C (SIGINT) then never ends. The exec keeps the pid.
_WITH_DEFAULT_SIGINT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])
"""


class Stream:
    """A command that prints until it is stopped (watch, keep-alive): its stdout lines, read by a
    thread, are taken with a deadline; interrupt() is Ctrl-C. Use it in a `with`: it is killed at
    the end whatever happened."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.process = subprocess.Popen([sys.executable, "-c", _WITH_DEFAULT_SIGINT, *argv],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, b""):
            self._lines.put(line)
        self._lines.put(None)  # stdout closed: the process ended

    def line(self, timeout: float = LINE_TIMEOUT_S) -> bytes | None:
        """The next line, without its newline; None when stdout closed or nothing came in time."""
        try:
            found = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if found is None:
            self._lines.put(None)  # it stays closed
            return None
        return found[:-1] if found.endswith(b"\n") else found

    def lines(self, count: int, timeout: float = LINE_TIMEOUT_S) -> list[bytes]:
        """The next `count` lines, all within `timeout`; fails with what came and the stderr."""
        deadline, got = time.monotonic() + timeout, []
        while len(got) < count:
            found = self.line(max(deadline - time.monotonic(), 0.01))
            if found is None:
                raise AssertionError(f"{self.argv} printed {got}, not {count} lines in {timeout} s "
                                     f"(exit {self.process.poll()}; stderr {self.stderr_now()!r})")
            got.append(found)
        return got

    def stderr_now(self) -> bytes:
        if self.process.poll() is None or self.process.stderr is None:
            return b"(still running)"
        return self.process.stderr.read()

    def interrupt(self) -> tuple[int, bytes]:
        """Ctrl-C: SIGINT, then its exit code and stderr. Anything more it printed is an error."""
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=CALL_TIMEOUT_S)
        return code, self.finish()

    def wait(self) -> tuple[int, bytes]:
        """It ends by itself: its exit code and stderr."""
        code = self.process.wait(timeout=CALL_TIMEOUT_S)
        return code, self.finish()

    def finish(self) -> bytes:
        self._reader.join(timeout=CALL_TIMEOUT_S)
        rest = []
        while (found := self.line(0.01)) is not None:
            rest.append(found)
        assert rest == [], f"{self.argv} printed more: {rest}"
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=CALL_TIMEOUT_S)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def raftkv_stream(cluster: Cluster, *argv: str, endpoints: list[str] | None = None) -> Stream:
    return Stream(raftkv_argv(cluster, *argv, endpoints=endpoints), environment())


def etcdctl_stream(cluster: Cluster, *argv: str, endpoints: list[str] | None = None) -> Stream:
    return Stream(etcdctl_argv(cluster, *argv, endpoints=endpoints), etcdctl_env())


def wait_for_watch(watch: Stream, write: Callable[[str], object], key: bytes) -> None:
    """Until a watch from now (no --rev) is surely in place: `write` puts `key` until the watch
    prints a change, then once more with the value "last"; when that shows (its key and value
    lines), every later change will. etcdctl's simple form, --prev-kv or not."""
    def change_seen() -> bool:
        write("go")
        return watch.line(timeout=3) == b"PUT"
    wait_until("the watch to print a change made after it started", change_seen, timeout=LINE_TIMEOUT_S)
    write("last")
    seen = watch.lines(2)
    while seen[-2:] != [key, b"last"]:
        seen += watch.lines(1)


def events_of(lines: list[bytes]) -> list[dict[str, Any]]:
    """The events of -w json lines (etcdctl's WatchResponses), in order."""
    return [event for line in lines for event in json.loads(line)["Events"]]


def without_header(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in HEADER_FIELDS}


# ---- watch -----------------------------------------------------------------------------------

def test_watch_prints_the_changes_made_meanwhile_and_ctrl_c_ends_it_with_0(cluster: Cluster):
    client = cluster.client()
    with raftkv_stream(cluster, "watch", "--prefix", "cw/") as watch:
        wait_for_watch(watch, lambda value: client.put("cw/ready", value), b"cw/ready")  # it watches from now
        first = client.revision() + 1

        ok(raftkv(cluster, "put", "cw/a", "one"))
        ok(raftkv(cluster, "put", "cw/a", "two words"))
        ok(raftkv(cluster, "put", "cx/outside", "not watched"))
        assert ok(raftkv(cluster, "delete", "cw/a")) == "deleted\n"
        client.txn(success=[put("cw/b", "bee"), put("cw/c", "")])  # two events of one revision
        expected = [b"PUT", b"cw/a", b"one", b"PUT", b"cw/a", b"two words", b"DELETE", b"cw/a", b"",
                    b"PUT", b"cw/b", b"bee", b"PUT", b"cw/c", b""]
        assert watch.lines(len(expected)) == expected
        assert watch.interrupt() == (0, b"")  # Ctrl-C: exit 0, quietly, nothing more printed

    if ETCDCTL is not None:  # etcdctl prints the same lines for the same changes
        with etcdctl_stream(cluster, "watch", "--prefix", "cw/", "--rev", str(first)) as etcd_watch:
            assert etcd_watch.lines(len(expected)) == expected


def test_watch_from_a_past_revision_with_prev_kv_as_etcdctl_prints_it(cluster: Cluster):
    client = cluster.client()
    client.put("hw/a", "1")
    first = client.revision()
    client.put("hw/a", "2")
    client.put("hw/b", "two words")
    client.delete("hw/a")
    client.put("hw/ab", "in range")
    simple = [b"PUT", b"hw/a", b"1",
              b"PUT", b"hw/a", b"1", b"hw/a", b"2",
              b"PUT", b"hw/b", b"two words",
              b"DELETE", b"hw/a", b"2", b"hw/a", b"",
              b"PUT", b"hw/ab", b"in range"]
    argv = ("watch", "hw/", "--prefix", "--rev", str(first), "--prev-kv")
    with raftkv_stream(cluster, *argv) as watch:
        assert watch.lines(len(simple)) == simple
        assert watch.interrupt() == (0, b"")
    # One key; a range [KEY, RANGE_END); without --prev-kv.
    with raftkv_stream(cluster, "watch", "hw/b", "--rev", str(first)) as one, \
            raftkv_stream(cluster, "watch", "hw/a", "hw/b", "--rev", str(first)) as between:
        assert one.lines(3) == [b"PUT", b"hw/b", b"two words"]
        assert between.lines(12) == [b"PUT", b"hw/a", b"1", b"PUT", b"hw/a", b"2", b"DELETE", b"hw/a", b"",
                                     b"PUT", b"hw/ab", b"in range"]
        assert one.interrupt() == (0, b"") and between.interrupt() == (0, b"")

    # -w json: a WatchResponse a line per event, its header's revision the event's.
    with raftkv_stream(cluster, *argv, "-w", "json") as watch:
        lines = watch.lines(5)
        assert watch.interrupt() == (0, b"")
    responses = [json.loads(line) for line in lines]
    assert [list(response) for response in responses] == [["Header", "Events", "CompactRevision", "Canceled",
                                                            "Created"]] * 5
    assert all((r["CompactRevision"], r["Canceled"], r["Created"]) == (0, False, False) for r in responses)
    assert [r["Header"] for r in responses] == [{"revision": first + i} for i in range(5)]
    events = events_of(lines)
    assert events[3] == {"type": 1, "kv": {"key": "aHcvYQ==", "mod_revision": first + 3},
                         "prev_kv": {"key": "aHcvYQ==", "create_revision": first, "mod_revision": first + 1,
                                     "version": 2, "value": "Mg=="}}

    if ETCDCTL is not None:  # the same from etcdctl, lines and events
        with etcdctl_stream(cluster, *argv) as etcd_watch:
            assert etcd_watch.lines(len(simple)) == simple
        with etcdctl_stream(cluster, *argv, "-w", "json") as etcd_watch:
            etcd_events: list[dict[str, Any]] = []
            while len(etcd_events) < 5:
                etcd_events += events_of(etcd_watch.lines(1))
        assert etcd_events == events


def test_watch_refuses_a_range_end_with_prefix(cluster: Cluster):
    refused = raftkv(cluster, "watch", "a", "b", "--prefix")
    assert refused.returncode == 2 and b"`range_end` and `--prefix` are mutually exclusive" in refused.stderr
    assert refused.stdout == b""


@pytest.mark.parametrize("command", [["watch"], ["lease"], ["lease", "grant"], ["lease", "revoke"],
                                     ["lease", "keep-alive"], ["lease", "timetolive"], ["lease", "list"]],
                         ids=" ".join)
def test_watch_and_lease_have_help(command: list[str], capsys: pytest.CaptureFixture[str]):
    from kv.tools import cli
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and out.startswith(f"usage: raftkv {' '.join(command)}"), out
    if command == ["watch"]:
        assert "Not in raftkv watch: etcdctl's interactive mode (watch -i)" in out


# ---- leases ----------------------------------------------------------------------------------

GRANTED = re.compile(r"^lease ([0-9a-f]{16}) granted with TTL\((\d+)s\)\n$")
REMAINING = re.compile(r"remaining\((\d+)s\)")


def grant(cluster: Cluster, ttl: int) -> str:
    found = GRANTED.match(ok(raftkv(cluster, "lease", "grant", str(ttl))))
    assert found is not None and int(found.group(2)) == ttl
    return found.group(1)


def remaining(line: str) -> str:
    """etcdctl's timetolive line with the seconds left taken out (a second may pass between two)."""
    return REMAINING.sub("remaining(Ns)", line)


def test_lease_grant_put_timetolive_keep_alive_list_revoke(cluster: Cluster):
    client = cluster.client()
    lease = grant(cluster, 60)
    lease_id = int(lease, 16)
    assert client.lease_time_to_live(lease_id)["granted_ttl"] == 60

    # put --lease, in hex: the key carries the lease; a leased put tells the store's revision.
    said = ok(raftkv(cluster, "put", "cl/a", "v", "--lease", lease))
    assert said == f"OK revision={client.revision()}\n"
    assert json.loads(ok(raftkv(cluster, "get", "cl/a", "-w", "json")))["lease"] == lease_id
    as_json = json.loads(ok(raftkv(cluster, "put", "cl/b", "w", "--lease", lease, "-w", "json")))
    assert as_json == {"key": "Y2wvYg==", "revision": client.revision()}
    if ETCDCTL is not None:
        assert ok(etcdctl(cluster, "put", "cl/c", "x", "--lease", lease)) == "OK\n"
    else:
        client.put("cl/c", "x", lease=lease_id)

    line = ok(raftkv(cluster, "lease", "timetolive", lease))
    assert re.fullmatch(rf"lease {lease} granted with TTL\(60s\), remaining\((\d+)s\)\n", line), line
    assert 0 < int(REMAINING.search(line).group(1)) <= 60  # type: ignore[union-attr]
    with_keys = ok(raftkv(cluster, "lease", "timetolive", lease, "--keys"))
    assert remaining(with_keys) == \
        f"lease {lease} granted with TTL(60s), remaining(Ns), attached keys([cl/a cl/b cl/c])\n"
    ttl_json = json.loads(ok(raftkv(cluster, "lease", "timetolive", lease, "--keys", "-w", "json")))
    assert ttl_json == {"id": lease_id, "ttl": ttl_json["ttl"], "granted-ttl": 60,
                        "keys": ["Y2wvYQ==", "Y2wvYg==", "Y2wvYw=="]}  # base64 of cl/a, cl/b, cl/c
    assert ok(raftkv(cluster, "lease", "keep-alive", "--once", lease)) == f"lease {lease} keepalived with TTL(60)\n"
    assert json.loads(ok(raftkv(cluster, "lease", "keep-alive", "--once", lease, "--json"))) == {
        "ID": lease_id, "TTL": 60}

    listed = ok(raftkv(cluster, "lease", "list")).splitlines()
    assert listed[0] == f"found {len(listed) - 1} leases" and lease in listed[1:]
    assert {"id": lease_id} in json.loads(ok(raftkv(cluster, "lease", "list", "-w", "json")))["leases"]

    if ETCDCTL is not None:  # etcdctl prints the same for the same commands (the header aside, in JSON)
        assert remaining(ok(etcdctl(cluster, "lease", "timetolive", lease, "--keys"))) == remaining(with_keys)
        etcd_json = without_header(json.loads(ok(etcdctl(cluster, "lease", "timetolive", lease, "--keys", "-w",
                                                         "json"))))
        assert {**etcd_json, "ttl": 0} == {**ttl_json, "ttl": 0}
        assert ok(etcdctl(cluster, "lease", "keep-alive", "--once", lease)) == \
            ok(raftkv(cluster, "lease", "keep-alive", "--once", lease))
        etcd_list = ok(etcdctl(cluster, "lease", "list")).splitlines()
        assert etcd_list[0] == f"found {len(etcd_list) - 1} leases" and lease in etcd_list[1:]
        granted = without_header(json.loads(ok(etcdctl(cluster, "lease", "grant", "30", "-w", "json"))))
        mine = json.loads(ok(raftkv(cluster, "lease", "grant", "30", "-w", "json")))
        assert list(mine) == list(granted) == ["ID", "TTL", "Error"] and mine["TTL"] == granted["TTL"] == 30
        for other in (granted["ID"], mine["ID"]):
            client.lease_revoke(other)

    # revoke: its keys go, in one revision; then it is gone for every command.
    before = client.revision()
    assert ok(raftkv(cluster, "lease", "revoke", lease)) == f"lease {lease} revoked\n"
    assert client.scan(prefix="cl/") == [] and client.revision() == before + 1
    gone = f"lease {lease} already expired\n"
    assert ok(raftkv(cluster, "lease", "timetolive", lease, "--keys")) == gone
    assert json.loads(ok(raftkv(cluster, "lease", "timetolive", lease, "-w", "json"))) == {
        "id": lease_id, "ttl": -1, "granted-ttl": 0, "keys": None}
    for argv in (("lease", "revoke", lease), ("lease", "keep-alive", "--once", lease),
                 ("put", "cl/d", "v", "--lease", lease)):
        refused = raftkv(cluster, *argv)
        assert (refused.returncode, refused.stdout) == (1, b""), refused
        told = refused.stderr.decode()
        assert told.startswith(f"raftkv {argv[0]}: error: ") and NOT_FOUND in told and told.count("\n") == 1, told
    if ETCDCTL is not None:
        assert ok(etcdctl(cluster, "lease", "timetolive", lease, "--keys")) == gone
        assert NOT_FOUND in etcdctl(cluster, "lease", "revoke", lease).stderr.decode()

    # Ids are hex, as etcdctl reads them.
    for argv in (("lease", "revoke", "0x12"), ("lease", "timetolive", "zz"), ("put", "k", "v", "--lease", "g")):
        bad = raftkv(cluster, *argv)
        assert bad.returncode == 2 and b"expecting ID in hex" in bad.stderr, bad


def test_lease_keep_alive_renews_until_ctrl_c_or_until_the_lease_is_gone(cluster: Cluster):
    # Renewed every third of its TTL; a CLI process may take seconds to start on a busy machine.
    lease = grant(cluster, 8)
    renewal = f"lease {lease} keepalived with TTL(8)".encode()
    with raftkv_stream(cluster, "lease", "keep-alive", lease) as keep_alive:
        assert keep_alive.lines(3) == [renewal] * 3
        assert keep_alive.interrupt() == (0, b"")
    with raftkv_stream(cluster, "lease", "keep-alive", lease) as keep_alive, \
            raftkv_stream(cluster, "lease", "keep-alive", lease, "-w", "json") as in_json:
        assert keep_alive.lines(1) == [renewal]
        assert json.loads(in_json.lines(1)[0]) == {"ID": int(lease, 16), "TTL": 8}
        time.sleep(10)  # kept alive past its TTL
        assert "remaining" in ok(raftkv(cluster, "lease", "timetolive", lease))
        etcd_keep_alive = etcdctl_stream(cluster, "lease", "keep-alive", lease) if ETCDCTL is not None else None
        try:
            if etcd_keep_alive is not None:
                assert etcd_keep_alive.lines(1) == [renewal]  # etcdctl's line, the same
            ok(raftkv(cluster, "lease", "revoke", lease))
            # The lease is gone: the next renewal finds it so, says so (simple form) and ends with 0.
            gone = f"lease {lease} expired or revoked.".encode()
            while (found := keep_alive.line()) == renewal:
                pass
            assert found == gone
            assert keep_alive.wait() == (0, b"")
            while (found := in_json.line()) is not None:
                assert json.loads(found) == {"ID": int(lease, 16), "TTL": 8}
            assert in_json.wait() == (0, b"")
            if etcd_keep_alive is not None:
                while (found := etcd_keep_alive.line()) == renewal:
                    pass
                assert found == gone  # etcdctl's last line, the same
                assert etcd_keep_alive.process.wait(timeout=CALL_TIMEOUT_S) == 0
        finally:
            if etcd_keep_alive is not None:
                etcd_keep_alive.__exit__()


# ---- last: a member killed under a watch, then a compaction ----------------------------------

def test_a_watch_goes_on_through_another_member_when_its_member_dies(cluster: Cluster):
    client = cluster.client()
    leader = cluster.wait_for_leader()
    others = [node.address for node_id, node in cluster.nodes.items() if node_id != leader]
    first = client.revision() + 1
    # The watch reads from the first endpoint, the leader: it is killed under it.
    with raftkv_stream(cluster, "watch", "--prefix", "fo/", "--rev", str(first),
                       endpoints=[cluster.nodes[leader].address, *others]) as watch:
        for i in range(3):
            client.put(f"fo/{i}", str(i))
        assert watch.lines(9) == [line for i in range(3) for line in (b"PUT", f"fo/{i}".encode(), str(i).encode())]
        cluster.kill(leader)
        for i in range(3, 6):
            client.put(f"fo/{i}", str(i))
        # Exactly the later changes, in order: none missed, none twice.
        assert watch.lines(9) == [line for i in range(3, 6)
                                  for line in (b"PUT", f"fo/{i}".encode(), str(i).encode())]
        assert watch.interrupt() == (0, b"")
    cluster.start_node(leader)
    cluster.wait_for_leader(timeout=60)  # every member, the restarted one too, agrees on a leader


def test_a_watch_from_a_compacted_revision_fails_with_etcds_message(cluster: Cluster):
    client = cluster.client()
    client.put("cp/a", "1")
    top = client.revision()
    client.compact(top)
    with raftkv_stream(cluster, "watch", "cp/a", "--rev", "1") as watch:
        code, stderr = watch.wait()
    assert code == 1 and stderr.decode().startswith("raftkv watch: error: ") and COMPACTED in stderr.decode(), stderr
