"""`raftkv bench` (python -m kv.tools.bench) keeps working: a --quick run end to end against a real
three-node cluster, through either API (`--api native|etcd`), its JSON, its cleanup on Ctrl-C; and
the report arithmetic. No timed assertions: the figures of a quick run mean nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kv.tools.bench.cli import _workloads
from kv.tools.bench.cpu import CpuRoles, process_cpu_s
from kv.tools.bench.etcd import etcd_version
from kv.tools.bench.measure import percentile
from kv.tools.bench.membership_workload import longest_gap
from kv.tools.bench.report import RoundResult, format_table, summarize
from kv.tools.bench.runner import ORDER, PLANS, round_order
from kv.tools.bench.settings import QUICK, WORKLOADS
from kv.tools.bench.watch_workload import check_deliveries, stream_plan
from kv.tools.bench.watchers import merged_percentile, order_hash, prefix_end, quantile_points
from kv.tools.bench.workloads import Metric, key
from kv.tools.cluster_up import SOURCE_ROOT, child_env

BENCH = [sys.executable, "-m", "kv.tools.bench", "--quick"]
RUN_TIMEOUT_S = 120


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (how the bench's members name their data dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def run_bench(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "bench.json"
    work = tmp_path / "work"
    result = subprocess.run([*BENCH, "--json", str(out), "--work-dir", str(work), *extra], cwd=SOURCE_ROOT,
                            env=child_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, f"bench failed:\n{result.stdout}\n{result.stderr}"
    assert processes_mentioning(str(work)) == [], "the bench left processes running"
    return result, json.loads(out.read_text())


def test_quick_run_measures_every_workload_and_cleans_up(tmp_path: Path) -> None:
    result, report = run_bench(tmp_path)
    assert [r["error"] for r in report["rounds"]] == [None]
    measured = {(row["workload"], row["metric"]): row["raftkv"] for row in report["summary"]}
    assert {w for w, _ in measured} == set(WORKLOADS)
    for slot in [("W1", "ops/s"), ("W2", "ops/s"), ("W3", "ops/s"), ("W4", "ops/s"), ("W5", "lease ops/s"),
                 ("W5", "stale ops/s"), ("W6", "keys/s"), ("W7", "p50 s"), ("W8", "save s"), ("W8", "restore s"),
                 ("W9", "max MB")]:
        assert measured[slot] is not None and measured[slot] > 0, slot
    for workload in ("W1", "W2"):  # every process works for every put: each spends CPU on it
        for who in ("leader", "follower", "client"):
            assert measured[(workload, f"{who} CPU ms/op")] > 0, (workload, who)
    assert report["settings"]["bulk_keys"] == 2_000
    assert report["machine"]["fdatasync_ms"]["p50"] > 0
    assert "W1" in result.stdout and "ops/s" in result.stdout  # the table
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir()), "data left behind"


@pytest.mark.skipif(etcd_version() is None, reason="etcd-server is not installed")
def test_quick_comparison_with_etcd(tmp_path: Path) -> None:
    _, report = run_bench(tmp_path, "--compare", "etcd", "--workloads", "W1,W3,W17")
    assert sorted(r["system"] for r in report["rounds"]) == ["etcd", "raftkv"]
    assert all(r["error"] is None for r in report["rounds"])
    w1 = next(row for row in report["summary"] if (row["workload"], row["metric"]) == ("W1", "ops/s"))
    assert w1["etcd"] > 0 and w1["ratio"] == pytest.approx(w1["raftkv"] / w1["etcd"])
    # W17 on etcd: every list of every variant listed every key (the round would have failed
    # otherwise), its pages followed etcd's `more`.
    rows = {(row["workload"], row["metric"]): row for row in report["summary"]}
    for variant in ("full", "keys-only", "paged 50"):
        for metric in ("ops/s", "p99 ms", "leader CPU ms/op", "peak MB", "leader peak MB"):
            assert rows[("W17", f"{variant} {metric}")]["etcd"] > 0, (variant, metric)
    assert rows[("W17", "full ops/s")]["ratio"] == pytest.approx(
        rows[("W17", "full ops/s")]["raftkv"] / rows[("W17", "full ops/s")]["etcd"])
    assert rows[("W17", "full ops/s")]["goal"] == ">= 1.0x etcd"  # issue 44's
    assert rows[("W17", "keys-only ops/s")]["raftkv"] > 0  # the native scan's keys_only


def figures(report: dict, system: str = "raftkv") -> dict[tuple[str, str], float | None]:
    return {(row["workload"], row["metric"]): row[system] for row in report["summary"]}


@pytest.mark.parametrize("api", ["native", "etcd"])
def test_quick_run_through_either_api(tmp_path: Path, api: str) -> None:
    result, report = run_bench(tmp_path, "--api", api, "--workloads", "W1,W3,W5,W6,W12,W13,W17")
    assert report["api"] == api
    assert [r["error"] for r in report["rounds"]] == [None]
    measured = figures(report)
    for workload in ("W1", "W3", "W12", "W13"):
        for metric in ("ops/s", "p50 ms", "p99 ms", "leader CPU ms/op"):
            assert measured[(workload, metric)] is not None and measured[(workload, metric)] > 0, (workload, metric)
    assert ("W13", "failed compares") not in measured  # each client owns its key: no compare fails
    assert measured[("W5", "stale ops/s")] > 0
    # W17: every list listed every key (the round would have failed otherwise), in every variant
    # through either API.
    for variant in ("full", "keys-only", "paged 50"):
        for metric in ("ops/s", "p99 ms", "leader CPU ms/op", "peak MB", "leader peak MB"):
            assert measured[("W17", f"{variant} {metric}")] > 0, (variant, metric)
    w17 = [metric for workload, metric in measured if workload == "W17"]
    assert [m.split(" ")[0] for m in w17] == ["full"] * 8 + ["keys-only"] * 8 + ["paged"] * 8, w17
    # etcd's API has no lease reads; its bulk loads are Txns of at most 128 puts.
    assert (("W5", "lease ops/s") in measured) == (api == "native")
    w6 = next(row for row in report["summary"] if (row["workload"], row["metric"]) == ("W6", "keys/s"))
    assert w6["raftkv"] > 0 and w6["note"].endswith("batches of 128" if api == "etcd" else "batches of 500")
    heading = "raftkv (etcd API)" if api == "etcd" else "raftkv "
    assert heading in result.stdout.splitlines()[0] and f"api: {api}" in result.stdout


@pytest.mark.skipif(etcd_version() is None, reason="etcd-server is not installed")
def test_quick_comparison_through_etcds_api(tmp_path: Path) -> None:
    """raftkv and etcd through the same EtcdTarget: every figure for both, and their ratio."""
    result, report = run_bench(tmp_path, "--api", "etcd", "--compare", "etcd", "--workloads", "W1,W2,W3,W4,W12,W13")
    assert report["api"] == "etcd" and "--api etcd" in report["command"]
    assert sorted(r["system"] for r in report["rounds"]) == ["etcd", "raftkv"]
    assert all(r["error"] is None for r in report["rounds"])
    rows = {(row["workload"], row["metric"]): row for row in report["summary"]}
    for workload in ("W1", "W2", "W3", "W4", "W12", "W13"):
        for metric in ("ops/s", "p50 ms", "p99 ms"):
            row = rows[(workload, metric)]
            assert row["raftkv"] > 0 and row["etcd"] > 0, (workload, metric)
            assert row["ratio"] == pytest.approx(row["raftkv"] / row["etcd"])
    assert rows[("W2", "ops/s")]["goal"] == ">= 1.0x etcd"  # issue 27's bar through etcd's API
    assert "raftkv (etcd API)" in result.stdout and "raftkv/etcd" in result.stdout


def test_native_only_workloads_are_refused_under_etcds_api(tmp_path: Path) -> None:
    assert _workloads(None, "etcd") == ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W9", "W12", "W13")
    assert _workloads(None, "native") == WORKLOADS
    assert _workloads("W8,W12", "native") == ("W8", "W12")
    for named in ("W8", "W10", "W11"):
        with pytest.raises(ValueError, match=f"{named} cannot run under --api etcd"):
            _workloads(f"W1,{named}", "etcd")
    work = tmp_path / "work"
    refused = subprocess.run([*BENCH, "--api", "etcd", "--workloads", "W1,W8", "--work-dir", str(work)],
                             cwd=SOURCE_ROOT, env=child_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert refused.returncode == 2 and "W8 cannot run under --api etcd" in refused.stderr
    assert "snapshot" in refused.stderr and not work.exists()  # refused before anything started


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    work = tmp_path / "work"
    bench = subprocess.Popen([*BENCH, "--json", str(tmp_path / "b.json"), "--work-dir", str(work),
                              "--workloads", "W7", "--failover-trials", "50"],
                             cwd=SOURCE_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        # The bench's own command line names the work dir too; wait for its three members.
        while len(set(processes_mentioning(str(work))) - {bench.pid}) < 3:  # no event to await: poll
            assert bench.poll() is None, bench.communicate()[0]
            assert time.monotonic() < deadline, "the bench never started its cluster"
            time.sleep(0.05)
        bench.send_signal(signal.SIGINT)
        output = bench.communicate(timeout=60)[0].decode()
    finally:
        if bench.poll() is None:
            bench.terminate()
            bench.wait(30)
        leaked = processes_mentioning(str(work))
        for pid in leaked:  # started by this test; do not leave them to the next one
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 130, output
    assert leaked == []


def test_summary_takes_medians_and_ratios() -> None:
    rounds = [RoundResult(i + 1, system, [Metric("W1", "ops/s", value, True)])
              for i, (system, value) in enumerate([("raftkv", 100.0), ("etcd", 50.0), ("raftkv", 300.0),
                                                   ("etcd", 100.0), ("raftkv", 200.0), ("etcd", 80.0)])]
    (row,) = summarize(rounds)
    assert (row.raftkv, row.etcd) == (200.0, 80.0)
    assert row.ratio == pytest.approx(2.5) and row.met is True  # goal: >= 1.0x etcd
    table = format_table([row], with_etcd=True)
    assert "2.50x" in table and "ok" in table


def test_rounds_alternate_and_helpers() -> None:
    assert [round_order(["raftkv", "etcd"], i) for i in range(3)] == [
        ["raftkv", "etcd"], ["etcd", "raftkv"], ["raftkv", "etcd"]]
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert len(key("W1", 15, 123456)) == 16 and key("W1", 1, 2) != key("W1", 2, 1)


def test_profile_summary_counts_self_and_inclusive(tmp_path: Path) -> None:
    from kv.tools.bench.profile import summarize_collapsed

    stacks = tmp_path / "leader.txt"
    stacks.write_text("main (a.py:1);apply (b.py:2) 3\nmain (a.py:1);send (c.py:3) 1\n")
    summary = summarize_collapsed(stacks)
    assert "4 samples" in summary
    assert " 75.0  apply (b.py:2)" in summary and "100.0  main (a.py:1)" in summary


def test_cpu_per_operation_by_role() -> None:
    roles = CpuRoles("n2", {"n1": 1, "n2": 2, "n3": 3})
    before = {"n1": 1.0, "n2": 2.0, "n3": 3.0, "client": 0.5}
    after = {"n1": 1.2, "n2": 2.6, "n3": 3.4, "client": 0.6}
    per_op = roles.ms_per_op(before, after, ops=1000)
    assert per_op == pytest.approx({"leader": 0.6, "follower": 0.3, "client": 0.1})
    assert roles.ms_per_op(before, after, ops=0) == {}


def test_process_cpu_counts_this_process_work() -> None:
    start = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of CPU
        pass
    assert process_cpu_s(os.getpid()) >= start + 0.03  # /proc counts in 10 ms ticks


W14_FIGURES = ("puts/s", "events/s", "p50 ms", "p99 ms", "max ms", "put p50 ms", "put p99 ms", "leader CPU s",
               "follower CPU s", "members CPU us/event", "watchers CPU s", "writer CPU s", "watches not exact")
W15_FIGURES = ("keep-alives/s", "leader CPU us/keep-alive", "follower CPU us/keep-alive", "client CPU us/keep-alive",
               "p50 ms", "p99 ms", "grants/s", "leases expired")


def test_quick_watchers_and_leases(tmp_path: Path) -> None:
    """W14 (20 watches on 4 streams, 50 puts) and W15 (100 leases kept alive) on raftkv: every
    figure is there, every watch got every put exactly once in order, no lease expired."""
    assert (QUICK.watchers, round(QUICK.watch_rate * QUICK.watch_duration_s), QUICK.leases) == (20, 50, 100)
    result, report = run_bench(tmp_path, "--workloads", "W14,W15")
    assert [r["error"] for r in report["rounds"]] == [None]  # the delivery check passed
    measured = figures(report)
    for name in W14_FIGURES:
        assert measured[("W14", name)] is not None, name
    for name in ("puts/s", "events/s", "p50 ms", "p99 ms", "max ms", "put p50 ms"):
        assert measured[("W14", name)] > 0, name
    assert measured[("W14", "watches not exact")] == 0
    assert measured[("W14", "p50 ms")] <= measured[("W14", "p99 ms")] <= measured[("W14", "max ms")]
    events = next(m for r in report["rounds"] for m in r["metrics"] if (m["workload"], m["name"]) == ("W14", "events/s"))
    assert events["note"].startswith("1,000 events")  # 50 puts x 20 watches, each delivered once
    for name in W15_FIGURES:
        assert measured[("W15", name)] is not None, name
    assert measured[("W15", "keep-alives/s")] > 0 and measured[("W15", "grants/s")] > 0
    assert measured[("W15", "leases expired")] == 0
    assert "W14" in result.stdout and "W15" in result.stdout


@pytest.mark.skipif(etcd_version() is None, reason="etcd-server is not installed")
def test_quick_watchers_and_leases_against_etcd(tmp_path: Path) -> None:
    _, report = run_bench(tmp_path, "--compare", "etcd", "--workloads", "W14,W15")
    assert sorted(r["system"] for r in report["rounds"]) == ["etcd", "raftkv"]
    assert all(r["error"] is None for r in report["rounds"])
    rows = {(row["workload"], row["metric"]): row for row in report["summary"]}
    for slot in [("W14", "events/s"), ("W14", "p50 ms"), ("W14", "p99 ms"), ("W15", "keep-alives/s")]:
        row = rows[slot]
        assert row["raftkv"] > 0 and row["etcd"] > 0, slot
        assert row["ratio"] == pytest.approx(row["raftkv"] / row["etcd"])
    assert rows[("W14", "p99 ms")]["goal"] == "<= etcd"  # issue 31: p99 no worse than etcd's
    for system in ("raftkv", "etcd"):
        assert rows[("W14", "watches not exact")][system] == 0 and rows[("W15", "leases expired")][system] == 0


def test_watch_and_lease_workloads_are_named_only() -> None:
    assert "W14" not in _workloads(None, "native") and "W15" not in _workloads(None, "etcd")
    assert _workloads("w14,W15", "etcd") == ("W14", "W15")  # through etcd's API whatever --api says


def test_list_workload_is_named_only_on_both_systems() -> None:
    assert "W17" not in _workloads(None, "native") and "W17" not in _workloads(None, "etcd")
    assert _workloads("w17", "etcd") == ("W17",) and _workloads("W17", "native") == ("W17",)
    assert PLANS["raftkv"]["W17"] is PLANS["etcd"]["W17"]  # the same lists on both
    assert (QUICK.list_keys, QUICK.list_page) == (200, 50)  # the quick runs' W17 checks name "paged 50"


def test_watch_checks_catch_a_missing_repeated_or_reordered_event() -> None:
    expected = [3, 0, 1, 2]  # the puts in the order of their revisions
    good = order_hash(expected)
    assert order_hash([3, 1, 0, 2]) != good and order_hash([3, 0, 1]) != good and order_hash([3, 0, 1, 2, 2]) != good

    def result(*watches: tuple[int, int, str | None]) -> dict:
        return {"watches": [["127.0.0.1:1", i, count, h, error] for i, (count, h, error) in enumerate(watches)],
                "stream_errors": []}

    assert check_deliveries("raftkv", [result((4, good, None), (4, good, None))], 4, good) == (0, None)
    wrong, message = check_deliveries("raftkv", [result((4, good, None), (3, order_hash([3, 0, 1]), None)),
                                                 result((4, order_hash([3, 1, 0, 2]), None))], 4, good)
    assert wrong == 2 and message is not None
    assert "2 of 3 watches" in message and "11 of 12 events" in message and "out of order" in message
    wrong, message = check_deliveries("etcd", [result((4, good, "event #2: b'w14/1' at revision 5 after revision 7"))],
                                      4, good)
    assert wrong == 1 and message is not None and "after revision 7" in message


def test_watch_helpers() -> None:
    assert stream_plan(["n1", "n2", "n3"], 1000, 50) == [(("n1", "n2", "n3")[s % 3], 20) for s in range(50)]
    plan = stream_plan(["n1", "n2", "n3"], 20, 3)
    assert [n for _, n in plan] == [7, 7, 6] and [m for m, _ in plan] == ["n1", "n2", "n3"]
    assert stream_plan(["n1"], 2, 5) == [("n1", 1), ("n1", 1)]  # never a stream without a watch
    assert prefix_end(b"w14/") == b"w140"
    values = list(range(1, 1001))
    points = quantile_points(values, points=100)
    assert points[0] == 1 and points[-1] == 1000 and len(points) == 101
    # Two sketches of different sizes merge as one sample would: within a point's share of the ranks.
    merged = merged_percentile([(1000, points), (100, quantile_points(list(range(2001, 2101)), points=100))], 99)
    exact = percentile([float(v) for v in values + list(range(2001, 2101))], 99)
    assert abs(merged - exact) <= 11
    assert merged_percentile([(1000, points)], 50) == pytest.approx(500, abs=10)
    assert merged_percentile([], 50) == 0.0


W16_FIGURES = ("seconds add to voter", "add->caught up s", "caught up->promoted s", "store keys", "store MB",
               "transfer stall ms", "transfer stall max ms", "put p50 ms", "MoveLeader ms", "MoveLeader max ms")


def test_quick_membership_change(tmp_path: Path) -> None:
    """W16 on raftkv: a learner n4 added, started with --join, promoted, then removed (the workload
    itself waits for the voters to be n1..n3 again), and two leadership transfers under a writer."""
    result, report = run_bench(tmp_path, "--workloads", "W16", "--membership-keys", "500", "--transfers", "2")
    assert [r["error"] for r in report["rounds"]] == [None]
    measured = figures(report)
    for name in W16_FIGURES:
        assert measured[("W16", name)] is not None and measured[("W16", name)] > 0, name
    assert measured[("W16", "store keys")] == 500  # loaded by W16 itself: the store was empty
    assert measured[("W16", "add->caught up s")] <= measured[("W16", "seconds add to voter")]
    assert measured[("W16", "transfer stall ms")] <= measured[("W16", "transfer stall max ms")]
    assert "W16" in result.stdout


def test_membership_workload_is_raftkv_only_named_and_last() -> None:
    assert "W16" in PLANS["raftkv"] and "W16" not in PLANS["etcd"]  # --compare etcd: no etcd side
    assert ORDER[-1] == "W16"
    assert "W16" not in _workloads(None, "native") and "W16" not in _workloads(None, "etcd")
    assert _workloads("w16", "etcd") == ("W16",)


def test_longest_gap_around_a_transfer() -> None:
    acked = [0.0, 0.01, 0.02, 0.30, 0.31, 0.50, 0.90]
    assert longest_gap(acked, 0.05, 0.06) == pytest.approx(0.28)  # the gap the transfer fell in
    assert longest_gap(acked, 0.305, 0.306) == pytest.approx(0.01)
    assert longest_gap(acked, 0.0, 1.0) == pytest.approx(0.40)  # every gap overlaps: the longest
    assert longest_gap(acked, 0.45, 0.55) == pytest.approx(0.40)  # two gaps overlap it: the longer
    assert longest_gap([0.1], 0.0, 1.0) == 0.0
