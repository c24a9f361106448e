"""Medians over rounds, raftkv/etcd ratios, the issue's goals, as a table and as JSON; the table and
the JSON say which API drove raftkv (`--api`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kv.tools.bench.measure import median
from kv.tools.bench.settings import OPTIONAL_WORKLOADS, WORKLOADS, Sizes
from kv.tools.bench.systems import ETCD_API, NATIVE_API
from kv.tools.bench.workloads import Metric

RAFTKV = "raftkv"
ETCD = "etcd"


@dataclass(frozen=True, slots=True)
class Goal:
    """One of the issue's goals: a bound on the raftkv/etcd ratio or on raftkv's own figure."""

    text: str
    min_ratio: float | None = None
    max_ratio: float | None = None
    min_value: float | None = None
    max_value: float | None = None

    def met(self, raftkv: float | None, ratio: float | None) -> bool | None:
        """True/False when decidable from what was measured, None otherwise."""
        checks: list[bool] = []
        if self.min_ratio is not None or self.max_ratio is not None:
            if ratio is None:
                return None
            checks += [self.min_ratio is None or ratio >= self.min_ratio,
                       self.max_ratio is None or ratio <= self.max_ratio]
        if self.min_value is not None or self.max_value is not None:
            if raftkv is None:
                return None
            checks += [self.min_value is None or raftkv >= self.min_value,
                       self.max_value is None or raftkv <= self.max_value]
        return all(checks)


GOALS: dict[tuple[str, str], Goal] = {
    ("W1", "ops/s"): Goal(">= 1.0x etcd", min_ratio=1.0),
    ("W1", "p99 ms"): Goal("<= etcd", max_ratio=1.0),
    ("W2", "ops/s"): Goal(">= 1.5x etcd", min_ratio=1.5),
    ("W3", "ops/s"): Goal(">= 1.0x etcd", min_ratio=1.0),
    ("W4", "ops/s"): Goal(">= 1.0x etcd", min_ratio=1.0),
    ("W6", "keys/s"): Goal(">= 50,000", min_value=50_000),
    ("W7", "p50 s"): Goal("<= 1.5 s", max_value=1.5),
    ("W8", "save s"): Goal("< 1 s", max_value=1.0),
    ("W8", "restore s"): Goal("< 1 s", max_value=1.0),
    ("W9", "max MB"): Goal("<= etcd", max_ratio=1.0),
    ("W10", "rows/s"): Goal(">= 50,000", min_value=50_000),
    ("W11", "seconds"): Goal("< 10 s", max_value=10.0),
    ("W14", "p99 ms"): Goal("<= etcd", max_ratio=1.0),  # issue 31: delivery p99 no worse than etcd's
    # issue 44: lists at least as fast as etcd's (the paged one at the default page size).
    **{("W17", f"{variant} ops/s"): Goal(">= 1.0x etcd", min_ratio=1.0)
       for variant in ("full", "keys-only", f"paged {Sizes().list_page}")},
}
# Through etcd's API (`--api etcd`), issue 27's: at least 1.0x etcd on W1..W4, through the same client.
ETCD_API_GOALS: dict[tuple[str, str], Goal] = {**GOALS, ("W2", "ops/s"): Goal(">= 1.0x etcd", min_ratio=1.0)}


def goals(api: str) -> dict[tuple[str, str], Goal]:
    return ETCD_API_GOALS if api == ETCD_API else GOALS


def raftkv_label(api: str) -> str:
    """The raftkv column's heading: "raftkv", or "raftkv (etcd API)" when etcd's API drove it."""
    return "raftkv (etcd API)" if api == ETCD_API else RAFTKV


def api_line(api: str) -> str:
    """What drove each system, for the lines under the table."""
    if api == ETCD_API:
        return ("api: etcd - raftkv driven through etcd's v3 API by EtcdTarget, the client etcd is driven with "
                "(unary Put/Range/Txn)")
    return "api: native - raftkv driven by kv.Client; etcd by EtcdTarget"


@dataclass
class RoundResult:
    round: int
    system: str
    metrics: list[Metric] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SummaryRow:
    workload: str
    metric: str
    raftkv: float | None
    etcd: float | None
    ratio: float | None
    goal: str
    met: bool | None
    note: str


def summarize(rounds: Sequence[RoundResult], api: str = NATIVE_API) -> list[SummaryRow]:
    """One row per (workload, metric) measured, with each system's median over the rounds, and the
    goals of the API that drove raftkv."""
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    notes: dict[tuple[str, str], str] = {}
    for result in rounds:
        for metric in result.metrics:
            slot = (metric.workload, metric.name)
            per_system = values.setdefault(slot, {})
            if metric.value is not None:
                per_system.setdefault(result.system, []).append(metric.value)
            if metric.note and (result.system == RAFTKV or slot not in notes):
                notes[slot] = metric.note
    rows = []
    for slot in sorted(values, key=lambda s: ((WORKLOADS + OPTIONAL_WORKLOADS).index(s[0]), _metric_order(values, s))):
        raftkv = _median_or_none(values[slot].get(RAFTKV))
        etcd = _median_or_none(values[slot].get(ETCD))
        ratio = raftkv / etcd if raftkv is not None and etcd else None
        goal = goals(api).get(slot)
        rows.append(SummaryRow(slot[0], slot[1], raftkv, etcd, ratio, goal.text if goal else "",
                               goal.met(raftkv, ratio) if goal else None, notes.get(slot, "")))
    return rows


def _metric_order(values: dict[tuple[str, str], Any], slot: tuple[str, str]) -> int:
    """Keep metrics in the order the workload reported them."""
    return [s for s in values if s[0] == slot[0]].index(slot)


def _median_or_none(samples: list[float] | None) -> float | None:
    return median(samples) if samples else None


def _figure(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_table(rows: Sequence[SummaryRow], with_etcd: bool, api: str = NATIVE_API) -> str:
    header = ["W", "metric", raftkv_label(api)] + (["etcd", "raftkv/etcd"] if with_etcd else []) + ["goal", ""]
    lines = []
    for row in rows:
        cells = [row.workload, row.metric, _figure(row.raftkv)]
        if with_etcd:
            cells += [_figure(row.etcd), f"{row.ratio:.2f}x" if row.ratio is not None else "-"]
        cells += [row.goal, {True: "ok", False: "MISS", None: ""}[row.met]]
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    render = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *lines]]
    return "\n".join([render[0], "  ".join("-" * w for w in widths), *render[1:]])


def format_markdown(rows: Sequence[SummaryRow], with_etcd: bool, api: str = NATIVE_API) -> str:
    """The table as Markdown, for the README's Performance section."""
    header = ["W", "metric", raftkv_label(api)] + (["etcd", "raftkv/etcd"] if with_etcd else []) + ["goal", "met"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = [row.workload, row.metric, _figure(row.raftkv)]
        if with_etcd:
            cells += [_figure(row.etcd), f"{row.ratio:.2f}x" if row.ratio is not None else "-"]
        cells += [row.goal, {True: "yes", False: "**no**", None: ""}[row.met]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_json(machine: dict[str, Any], command: str, settings: dict[str, Any], rounds: Sequence[RoundResult],
            rows: Sequence[SummaryRow], api: str = NATIVE_API) -> dict[str, Any]:
    return {
        "machine": machine,
        "command": command,
        "api": api,  # what drove raftkv: "native" (kv.Client) or "etcd" (EtcdTarget, etcd's API)
        "settings": settings,
        "summary": [asdict(row) for row in rows],
        "rounds": [{"round": r.round, "system": r.system, "error": r.error,
                    "metrics": [asdict(m) for m in r.metrics]} for r in rounds],
    }
