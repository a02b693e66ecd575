"""The switchback part of `make bench-peers` (pure): each router's figures from its slices,
paired with direct's slice of the same cycle, with bootstrap 95 % intervals, and issue 22's
request-path lines checked on them (``peers_switchback`` runs the slices)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from warmfleet.bench.peers_report import find_row, fmt_cell, verdict, verdict_cell
from warmfleet.display import Column, Grid, fixed

DIRECT = "direct"
RESAMPLES = 2000
CI_LEVEL = 0.95


@dataclass(frozen=True)
class SliceResult:
    """One router's slice of one cycle: the latencies kept (ms; TTFT when streamed), requests
    sent, those that failed, and its processes' CPU seconds during the slice (None: direct)."""

    cycle: int
    latencies_ms: tuple[float, ...]
    sent: int
    errors: int
    cpu_s: float | None


def bootstrap_ci(
    items: Sequence[Any], statistic: Callable[[Sequence[Any]], float], rng: random.Random
) -> tuple[float, float]:
    """Percentile bootstrap interval (``CI_LEVEL``) of ``statistic`` over ``items``."""
    if len(items) < 2:
        value = statistic(items)
        return value, value
    stats = sorted(statistic(rng.choices(items, k=len(items))) for _ in range(RESAMPLES))
    tail = (1.0 - CI_LEVEL) / 2.0
    return stats[int(tail * RESAMPLES)], stats[int((1.0 - tail) * RESAMPLES) - 1]


def slice_p50(result: SliceResult) -> float:
    return median(result.latencies_ms) if result.latencies_ms else math.nan


def paired_added(router: Sequence[SliceResult], direct: Sequence[SliceResult]) -> list[float]:
    """Per cycle, the router slice's p50 minus direct's p50 in the same cycle (cycles where
    either kept no request are left out)."""
    direct_by_cycle = {s.cycle: slice_p50(s) for s in direct}
    out = []
    for s in router:
        diff = slice_p50(s) - direct_by_cycle.get(s.cycle, math.nan)
        if not math.isnan(diff):
            out.append(diff)
    return out


def _cpu_per_request_ms(slices: Sequence[SliceResult]) -> float:
    sent = sum(s.sent for s in slices)
    return 1000.0 * sum(s.cpu_s or 0.0 for s in slices) / sent if sent else math.nan


def switch_row(
    label: tuple[str, str],
    point: Mapping[str, Any],
    slices: Sequence[SliceResult],
    direct: Sequence[SliceResult],
    rng: random.Random,
) -> dict[str, Any]:
    """One router x point: its p50, added p50 (median of paired cycles) and CPU a request
    (its CPU over its requests), each with a bootstrap interval over cycles."""
    kept = [x for s in slices for x in s.latencies_ms]
    row: dict[str, Any] = {
        "router": label[0], "policy": label[1], "load_point": point["name"],
        "concurrency": point["concurrency"], "stream": point["stream"],
        "cycles": len(slices), "requests": sum(s.sent for s in slices),
        "errors": sum(s.errors for s in slices),
        "p50_ms": median(kept) if kept else None,
        "added_p50_ms": None, "added_ci_ms": None,
        "router_cpu_ms_per_request": None, "router_cpu_ci_ms": None,
    }  # fmt: skip
    if label[0] != DIRECT:
        diffs = paired_added(slices, direct)
        if diffs:
            row["added_p50_ms"] = median(diffs)
            row["added_ci_ms"] = list(bootstrap_ci(diffs, median, rng))
        if all(s.cpu_s is not None for s in slices) and slices:
            row["router_cpu_ms_per_request"] = _cpu_per_request_ms(slices)
            row["router_cpu_ci_ms"] = list(bootstrap_ci(slices, _cpu_per_request_ms, rng))
    return row


SYNC = ("warmfleet", "prefix_affinity+sync")
VLLM_RR = ("vllm-router", "round_robin")
# issue 22's request-path lines, each prefix_affinity + sync <= vllm-router round_robin:
# (check, point, value field, its interval's field)
SWITCH_CHECKS = (
    ("22. router CPU ms/request at c=32", "c32_8k", "router_cpu_ms_per_request",
     "router_cpu_ci_ms"),
    ("22. added p50 ms at c=1", "c1_8k", "added_p50_ms", "added_ci_ms"),
    ("22. added p50 ms at c=32", "c32_8k", "added_p50_ms", "added_ci_ms"),
    ("22. streamed TTFT added ms at c=32", "stream_c32_8k", "added_p50_ms", "added_ci_ms"),
)  # fmt: skip


def switch_acceptance(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each line: ours (sync) against vllm-router's value in the same slices' run; ``apart``
    says whether the two intervals do not overlap (False: the verdict is within the noise)."""
    out = []
    for name, point, field, ci_field in SWITCH_CHECKS:
        ours, peer = find_row(rows, *SYNC, point), find_row(rows, *VLLM_RR, point)
        value = None if ours is None else ours.get(field)
        limit = None if peer is None else peer.get(field)
        ci = None if ours is None else ours.get(ci_field)
        limit_ci = None if peer is None else peer.get(ci_field)
        apart = None
        if ci is not None and limit_ci is not None:
            apart = ci[1] < limit_ci[0] or limit_ci[1] < ci[0]
        out.append({
            "check": name, "value": value, "ci": ci, "limit": limit, "limit_ci": limit_ci,
            "pass": verdict(value, limit, "le"), "apart": apart,
        })  # fmt: skip
    return out


def _interval(ci: Sequence[float] | None, digits: int = 3) -> str:
    return "-" if not ci else f"{fixed(ci[0], digits)}-{fixed(ci[1], digits)}"


def switch_table(rows: Sequence[Mapping[str, Any]]) -> Grid:
    columns = (
        Column("router", left=True), Column("policy", left=True), Column("load point", left=True),
        Column("p50 ms"), Column("+p50 ms"), Column("+p50 95 %", drop=2),
        Column("CPU ms/req"), Column("CPU 95 %", drop=1), Column("requests", drop=3),
        Column("errors", drop=4),
    )  # fmt: skip
    grid = Grid("switchback: routers side by side, slices rotating (paired with direct)", columns)
    for r in rows:
        grid.add(
            r["router"], r["policy"], r["load_point"], fmt_cell(r["p50_ms"], 2),
            fmt_cell(r["added_p50_ms"], 2), _interval(r["added_ci_ms"], 2),
            fmt_cell(r["router_cpu_ms_per_request"], 3), _interval(r["router_cpu_ci_ms"]),
            str(r["requests"]), str(r["errors"]),
        )  # fmt: skip
    return grid


def switch_acceptance_table(checks: Sequence[Mapping[str, Any]]) -> Grid:
    columns = (
        Column("check", left=True, wrap=True), Column("ours"),
        Column("ours 95 %"), Column("vllm-router"), Column("vllm-router 95 %"),
        Column("result", left=True),
    )  # fmt: skip
    title = "issue 22, switchback: prefix_affinity + sync <= vllm-router round_robin"
    grid = Grid(title, columns)
    for c in checks:
        result = verdict_cell(c["pass"])
        if c["apart"] is False:
            result += " (intervals overlap)"
        grid.add(
            c["check"], fmt_cell(c["value"], 3), _interval(c["ci"]), fmt_cell(c["limit"], 3),
            _interval(c["limit_ci"]), result,
        )  # fmt: skip
    return grid
