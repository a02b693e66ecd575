"""Rows of `make bench-peers` (pure): router minus direct in the same run, and the acceptance
checks of issue 3 (items 1 and 2) evaluated on those rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmfleet.display import NA, Column, Grid, fixed, pct

OURS = ("warmfleet", "prefix_affinity")
# prefix_affinity with replica sync on: two replicas, the load on one (peers_routers)
OURS_SYNC = ("warmfleet", "prefix_affinity+sync")
# prefix_affinity with traffic capture on (peers_routers)
OURS_CAPTURE = ("warmfleet", "prefix_affinity+capture")
# prefix_affinity with flow control on and no overload (peers_routers)
OURS_FLOW = ("warmfleet", "prefix_affinity+flow")
VLLM_RR = ("vllm-router", "round_robin")
NOISY_FRAC = 0.15  # a row is noisy when unrelated processes used > 15 % of the machine's CPU


@dataclass(frozen=True)
class RowInput:
    router: str
    policy: str
    load_point: str
    scenario: str
    concurrency: int
    stream: bool
    summary: Mapping[str, Any]  # loadgen summary (sim report field names)
    router_cpu_s: float | None
    sent: int
    foreign_cpu_frac: float | None  # CPU share used by processes outside the benchmark
    fleet_cpu_s: float | None = None
    client_cpu_s: float | None = None  # the load generator's own CPU (this process)
    busy_frac: float | None = None  # share of the machine's CPU busy during the row


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _baseline(summaries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return {
        "e2e_p50": _mean([_p(s, "e2e_ms", "p50") for s in summaries]),
        "e2e_p99": _mean([_p(s, "e2e_ms", "p99") for s in summaries]),
        "ttft_p50": _mean([_p(s, "ttft_ms", "p50") for s in summaries]),
        "rps": _mean([float(s["throughput_rps"]) for s in summaries]),
    }


def direct_baseline(inputs: Sequence[RowInput], index: int) -> dict[str, float] | None:
    """Direct's E2E p50/p99, TTFT p50 and req/s for row ``index``: the mean of the direct runs
    of the same load point just before and just after it (direct brackets every router, so
    drift of the machine's load cancels); all direct runs of that point for a direct row."""
    item = inputs[index]
    same = [(i, x) for i, x in enumerate(inputs) if x.load_point == item.load_point]
    directs = [(i, x) for i, x in same if x.router == "direct"]
    if not directs:
        return None
    if item.router == "direct":
        return _baseline([x.summary for _, x in directs])
    before = [x for i, x in directs if i < index][-1:]
    after = [x for i, x in directs if i > index][:1]
    return _baseline([x.summary for x in (*before, *after)])


def _p(summary: Mapping[str, Any], field: str, pct: str) -> float:
    return float(summary[field][pct])


def build_rows(inputs: Sequence[RowInput], instances: int) -> list[dict[str, Any]]:
    """One row per router x policy x load point (``inputs`` in run order); "added" = this row
    minus direct's at the same load point (see ``direct_baseline``)."""
    rows = []
    for index, item in enumerate(inputs):
        s = item.summary
        base = direct_baseline(inputs, index)
        busiest = float(s["share"]["max"]) / 100.0
        row: dict[str, Any] = {
            "router": item.router,
            "policy": item.policy,
            "load_point": item.load_point,
            "scenario": item.scenario,
            "concurrency": item.concurrency,
            "stream": item.stream,
            "added_p50_ms": None,
            "added_p99_ms": None,
            "ttft_added_p50_ms": None,
            "router_cpu_ms_per_request": _per_request_ms(item.router_cpu_s, item.sent),
            "throughput_vs_direct": None,
            "throughput_rps": s["throughput_rps"],
            "hit_rate": s["hit_rate"],
            "busiest_share": busiest,
            "fair_share": 1.0 / instances,
            "ttft_ms": {"p50": _p(s, "ttft_ms", "p50"), "p90": _p(s, "ttft_ms", "p90")},
            "e2e_ms": {"p50": _p(s, "e2e_ms", "p50"), "p99": _p(s, "e2e_ms", "p99")},
            "completed": s["requests"]["completed"],
            "decisions_by_reason": dict(s.get("decisions_by_reason", {})),
            "errors": sum(s["errors"].values()),
            "foreign_cpu_frac": item.foreign_cpu_frac,
            "noisy": item.foreign_cpu_frac is not None and item.foreign_cpu_frac > NOISY_FRAC,
            "fleet_cpu_ms_per_request": _per_request_ms(item.fleet_cpu_s, item.sent),
            "client_cpu_ms_per_request": _per_request_ms(item.client_cpu_s, item.sent),
            "machine_busy_frac": item.busy_frac,
        }
        if base is not None:
            row["added_p50_ms"] = _p(s, "e2e_ms", "p50") - base["e2e_p50"]
            row["added_p99_ms"] = _p(s, "e2e_ms", "p99") - base["e2e_p99"]
            row["ttft_added_p50_ms"] = _p(s, "ttft_ms", "p50") - base["ttft_p50"]
            if base["rps"] > 0:
                row["throughput_vs_direct"] = s["throughput_rps"] / base["rps"]
        rows.append(row)
    return rows


def _per_request_ms(cpu_s: float | None, sent: int) -> float | None:
    return 1000.0 * cpu_s / sent if cpu_s is not None and sent else None


# Figures a row of several rounds reports as the median of its rounds (their per-round values
# are kept under ``rounds``); the rest are taken from the first round.
_ROUND_FIELDS = (
    "added_p50_ms", "ttft_added_p50_ms", "router_cpu_ms_per_request", "throughput_vs_direct",
    "added_p99_ms", "throughput_rps", "hit_rate", "busiest_share", "fleet_cpu_ms_per_request",
    "foreign_cpu_frac", "client_cpu_ms_per_request", "machine_busy_frac",
)  # fmt: skip
_ROUND_NESTED = ("ttft_ms", "e2e_ms")


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _row_key(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str, int]]:
    """(router, policy, load point, occurrence): direct runs several times per round."""
    seen: dict[tuple[str, str, str], int] = {}
    keys = []
    for row in rows:
        base = (row["router"], row["policy"], row["load_point"])
        seen[base] = seen.get(base, -1) + 1
        keys.append((*base, seen[base]))
    return keys


def median_rows(rounds: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per row of the first round: each figure the median of that row's rounds
    (rounds may run routers in another order; rows are matched by router, policy, load point
    and occurrence). ``rounds`` keeps the per-round values and ``noisy`` is set if any round
    was."""
    if not rounds:
        return []
    indexed = [dict(zip(_row_key(r), r, strict=True)) for r in rounds]
    out = []
    for key, first in indexed[0].items():
        same = [by_key[key] for by_key in indexed if key in by_key]
        row = dict(first)
        for name in _ROUND_FIELDS:
            values = [r[name] for r in same if r.get(name) is not None]
            row[name] = _median(values) if values else None
        for name in _ROUND_NESTED:
            row[name] = {pct: _median([r[name][pct] for r in same]) for pct in first[name]}
        row["noisy"] = any(r["noisy"] for r in same)
        row["errors"] = sum(r["errors"] for r in same)
        row["completed"] = sum(r["completed"] for r in same)
        row["rounds"] = {
            **{name: [r.get(name) for r in same] for name in _ROUND_FIELDS},
            **{name: [r[name] for r in same] for name in _ROUND_NESTED},
        }
        out.append(row)
    return out


Ref = tuple[str, str, str, str, str | None]  # router, policy, load point, field, sub-field
PA_Q16: tuple[str, str, str] = (*OURS, "quality_c16")
SGL_Q16 = ("sglang-router", "cache_aware", "quality_c16")
RND_Q16 = ("warmfleet", "random", "quality_c16")
BARE = ("aiohttp-passthrough", "round_robin")  # the reference proxy (bench.passthrough)

# (check, measured value, limit: a constant or (reference value, factor), comparison; "le+":
# at most the reference plus the constant given as the factor)
CHECKS: tuple[tuple[str, Ref, float | tuple[Ref, float], str], ...] = (
    ("1. router CPU ms/request at c=32 <= 0.30",
     (*OURS, "c32_8k", "router_cpu_ms_per_request", None), 0.30, "le"),
    ("1. router CPU at c=32 <= 1.36 x aiohttp pass-through, same run (0.30 vs 0.22)",
     (*OURS, "c32_8k", "router_cpu_ms_per_request", None),
     ((*BARE, "c32_8k", "router_cpu_ms_per_request", None), 0.30 / 0.22), "le"),
    ("1. added p50 ms at c=1 <= 0.4", (*OURS, "c1_8k", "added_p50_ms", None), 0.4, "le"),
    ("1. added p50 ms at c=32 <= vllm-router round_robin",
     (*OURS, "c32_8k", "added_p50_ms", None),
     (("vllm-router", "round_robin", "c32_8k", "added_p50_ms", None), 1.0), "le"),
    ("1. streamed TTFT added ms at c=32 <= 3",
     (*OURS, "stream_c32_8k", "ttft_added_p50_ms", None), 3.0, "le"),
    ("1. throughput vs direct at c=64 >= 0.6",
     (*OURS, "c64_8k", "throughput_vs_direct", None), 0.6, "ge"),
    ("2. P90 TTFT ms < sglang cache_aware",
     (*PA_Q16, "ttft_ms", "p90"), ((*SGL_Q16, "ttft_ms", "p90"), 1.0), "lt"),
    ("2. busiest share < sglang cache_aware",
     (*PA_Q16, "busiest_share", None), ((*SGL_Q16, "busiest_share", None), 1.0), "lt"),
    ("2. busiest share at c=1 <= 1.5 x fair",
     (*OURS, "quality_c1", "busiest_share", None),
     ((*OURS, "quality_c1", "fair_share", None), 1.5), "le"),
    ("2. hit rate >= 2 x random",
     (*PA_Q16, "hit_rate", None), ((*RND_Q16, "hit_rate", None), 2.0), "ge"),
    ("2. P50 TTFT ms <= 0.5 x random",
     (*PA_Q16, "ttft_ms", "p50"), ((*RND_Q16, "ttft_ms", "p50"), 0.5), "le"),
    # issue 22: relative to vllm-router round_robin, with replica sync on (router CPU counts
    # both replicas: the routing one and the peer applying its notes)
    ("22. sync: router CPU ms/request at c=32 <= vllm-router round_robin",
     (*OURS_SYNC, "c32_8k", "router_cpu_ms_per_request", None),
     ((*VLLM_RR, "c32_8k", "router_cpu_ms_per_request", None), 1.0), "le"),
    ("22. sync: added p50 ms at c=1 <= vllm-router round_robin",
     (*OURS_SYNC, "c1_8k", "added_p50_ms", None),
     ((*VLLM_RR, "c1_8k", "added_p50_ms", None), 1.0), "le"),
    ("22. sync: added p50 ms at c=32 <= vllm-router round_robin",
     (*OURS_SYNC, "c32_8k", "added_p50_ms", None),
     ((*VLLM_RR, "c32_8k", "added_p50_ms", None), 1.0), "le"),
    ("22. sync: streamed TTFT added ms at c=32 <= vllm-router round_robin",
     (*OURS_SYNC, "stream_c32_8k", "ttft_added_p50_ms", None),
     ((*VLLM_RR, "stream_c32_8k", "ttft_added_p50_ms", None), 1.0), "le"),
    ("22. sync: throughput vs direct at c=64 >= 0.6",
     (*OURS_SYNC, "c64_8k", "throughput_vs_direct", None), 0.6, "ge"),
    ("26. capture: router CPU ms/request at c=32 <= prefix_affinity + 0.03",
     (*OURS_CAPTURE, "c32_8k", "router_cpu_ms_per_request", None),
     ((*OURS, "c32_8k", "router_cpu_ms_per_request", None), 0.03), "le+"),
    ("23. flow: router CPU ms/request at c=32 <= prefix_affinity + 0.03",
     (*OURS_FLOW, "c32_8k", "router_cpu_ms_per_request", None),
     ((*OURS, "c32_8k", "router_cpu_ms_per_request", None), 0.03), "le+"),
)  # fmt: skip


def find_row(
    rows: Sequence[Mapping[str, Any]], router: str, policy: str, point: str
) -> Mapping[str, Any] | None:
    """The row of ``router`` x ``policy`` at load point ``point`` (None: not measured)."""
    for row in rows:
        if (row["router"], row["policy"], row["load_point"]) == (router, policy, point):
            return row
    return None


def _spread(rows: Sequence[Mapping[str, Any]], ref: Ref) -> list[float] | None:
    """[min, max] of ``ref``'s value over the rounds (None: one round, or not measured)."""
    router, policy, point, field, sub = ref
    row = find_row(rows, router, policy, point)
    if row is None:
        return None
    per_round = (row.get("rounds") or {}).get(field) or []
    values = [v if sub is None else v.get(sub) for v in per_round if v is not None]
    values = [float(v) for v in values if v is not None]
    return [min(values), max(values)] if len(values) > 1 else None


def _value(rows: Sequence[Mapping[str, Any]], ref: Ref) -> float | None:
    router, policy, point, field, sub = ref
    row = find_row(rows, router, policy, point)
    value = None if row is None else row.get(field)
    if value is not None and sub is not None:
        value = value.get(sub)
    return None if value is None else float(value)


def verdict(value: float | None, limit: float | None, op: str) -> bool | None:
    """``value`` against ``limit``, both rounded to 9 decimals: a figure computed as, say,
    90 CPU ticks over 3,000 requests is 0.30000000000000004 in floating point, which is 0.30
    and must not fail "<= 0.30"."""
    if value is None or limit is None:
        return None
    value, limit = round(value, 9), round(limit, 9)
    return {"le": value <= limit, "ge": value >= limit, "lt": value < limit}[op]


def acceptance(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 3 acceptance items 1 (overhead) and 2 (quality) on measured rows; ``pass`` is
    None when a row needed for the check was not measured."""
    out = []
    for name, ref, limit_spec, op in CHECKS:
        value = _value(rows, ref)
        if isinstance(limit_spec, tuple):
            reference = _value(rows, limit_spec[0])
            if reference is None:
                limit = None
            elif op == "le+":
                limit, op = reference + limit_spec[1], "le"
            else:
                limit = reference * limit_spec[1]
        else:
            limit = limit_spec
        out.append({
            "check": name, "value": value, "spread": _spread(rows, ref), "limit": limit,
            "pass": verdict(value, limit, op),
        })  # fmt: skip
    return out


def fmt_cell(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return fixed(value, digits)
    return NA if value is None else str(value)


PEER_COLUMNS = (
    Column("router", left=True), Column("policy", left=True), Column("load point", left=True),
    Column("+p50 ms"), Column("+p99 ms", drop=4), Column("+TTFT p50 ms", drop=2),
    Column("CPU ms/req"), Column("fleet CPU", drop=6), Column("client CPU", drop=6),
    Column("tput vs direct", drop=1), Column("req/s", drop=5), Column("hit rate", drop=3),
    Column("busiest", drop=3), Column("TTFT p50", drop=4), Column("TTFT p90", drop=3),
    Column("errors", drop=2), Column("busy", drop=5), Column("foreign CPU", drop=1),
)  # fmt: skip


def rows_table(rows: Sequence[Mapping[str, Any]]) -> Grid:
    grid = Grid("warmfleet vs peer routers (same run, same emulated fleet)", PEER_COLUMNS)
    for r in rows:
        grid.add(
            r["router"], r["policy"], r["load_point"], fmt_cell(r["added_p50_ms"]),
            fmt_cell(r["added_p99_ms"]), fmt_cell(r["ttft_added_p50_ms"]),
            fmt_cell(r["router_cpu_ms_per_request"], 3),
            fmt_cell(r["fleet_cpu_ms_per_request"], 2),
            fmt_cell(r["client_cpu_ms_per_request"], 2), fmt_cell(r["throughput_vs_direct"]),
            fmt_cell(r["throughput_rps"], 0), fmt_cell(r["hit_rate"], 3),
            fmt_cell(r["busiest_share"]), fmt_cell(r["ttft_ms"]["p50"], 1),
            fmt_cell(r["ttft_ms"]["p90"], 1), str(r["errors"]),
            pct(r["machine_busy_frac"], 0), _noisy(r["foreign_cpu_frac"]),
        )  # fmt: skip
    return grid


def _noisy(frac: float | None) -> str:
    text = pct(frac, 0)
    return f"[red]{text}[/red]" if frac is not None and frac > NOISY_FRAC else text


def verdict_cell(passed: bool | None) -> str:
    return {True: "[green]pass[/green]", False: "[red]FAIL[/red]", None: "n/a"}[passed]


def acceptance_table(checks: Sequence[Mapping[str, Any]]) -> Grid:
    columns = (
        Column("check", left=True, wrap=True), Column("median"), Column("rounds min-max"),
        Column("limit"), Column("result", left=True),
    )  # fmt: skip
    grid = Grid("acceptance (issues 3 and 22), medians of rounds in this run", columns)
    for c in checks:
        spread = c.get("spread")
        low_high = "-" if not spread else f"{fmt_cell(spread[0], 3)}-{fmt_cell(spread[1], 3)}"
        cells = (fmt_cell(c["value"], 3), low_high, fmt_cell(c["limit"], 3))
        grid.add(c["check"], *cells, verdict_cell(c["pass"]))
    return grid
