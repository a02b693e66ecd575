"""Simulator comparison output: deterministic JSON, PNG plots (``bench.plots``), its table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmfleet.bench import plots
from warmfleet.display import Column, Grid, fixed, pct
from warmfleet.sim.runner import Comparison, configs_report

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FLOAT_DIGITS = 4


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        rounded = round(value, FLOAT_DIGITS)
        return 0.0 if rounded == 0 else rounded  # no "-0.0"
    if isinstance(value, Mapping):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def report_json_bytes(report: Mapping[str, Any]) -> bytes:
    """Sorted keys, rounded floats, no timestamps: same seed, same bytes."""
    return (json.dumps(_rounded(report), sort_keys=True, indent=2) + "\n").encode("utf-8")


def write_json(report: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(report_json_bytes(report))


SIM_COLUMNS = (
    Column("strategy", left=True), Column("TTFT p50 ms"), Column("p90", drop=4),
    Column("p99"), Column("E2E p50 ms", drop=3), Column("req/s"), Column("out tok/s", drop=5),
    Column("hit rate"), Column("avail", drop=6), Column("capt", drop=6), Column("ideal", drop=2),
    Column("fleet ceil", drop=6), Column("share min-max", drop=1), Column("spills", drop=2),
)  # fmt: skip


def kv_events_title(delay_ms: float | None) -> str:
    """A table title's mention of the engines' KV events (none: nothing)."""
    return "" if delay_ms is None else f" | KV events {delay_ms:g} ms"


def comparison_table(comparison: Comparison, wall_s: Mapping[str, float] | None = None) -> Grid:
    report = comparison.report()
    title = (
        f"{report['scenario']} | {report['preset']} x {report['instances']} | "
        f"{report['requests']} requests | working set = {report['working_set_ratio']:.2f} x one "
        f"instance's KV ({report['fleet_working_set_ratio']:.2f} x fleet)"
    )
    title += kv_events_title(comparison.scenario.kv_events_delay_ms)
    title += "".join(
        f" | {name}: {line}" for name, line in configs_report(comparison.configs).items()
    )
    columns = SIM_COLUMNS + ((Column("wall s", drop=7),) if wall_s is not None else ())
    grid = Grid(title, columns)
    for run in comparison.runs:
        m = run.metrics.as_report()
        ttft: dict[str, float] = m["ttft_ms"]  # type: ignore[assignment]
        e2e: dict[str, float] = m["e2e_ms"]  # type: ignore[assignment]
        reuse: dict[str, float] = m["reuse"]  # type: ignore[assignment]
        share: dict[str, float] = m["share"]  # type: ignore[assignment]
        row = [
            run.name,
            fixed(ttft["p50"], 0),
            fixed(ttft["p90"], 0),
            fixed(ttft["p99"], 0),
            fixed(e2e["p50"], 0),
            fixed(run.metrics.throughput_rps, 2),
            fixed(run.metrics.output_tokens_per_s, 0),
            pct(run.metrics.hit_rate),
            pct(reuse["available"]),
            pct(reuse["captured"]),
            pct(reuse["ideal"]),
            pct(reuse["fleet_ceiling"]),
            f"{fixed(share['min'], 1)}-{fixed(share['max'], 1)}%",
            str(run.metrics.spills),
        ]
        if wall_s is not None:
            row.append(fixed(wall_s.get(run.name, run.wall_s), 1))
        grid.add(*row)
    return grid


def figures(comparison: Comparison) -> dict[str, Figure]:
    """File name -> figure: TTFT CDF per strategy, hit rate over time, per-instance share."""
    report = comparison.report()
    names = [run.name for run in comparison.runs]
    runs = comparison.runs
    return {
        "ttft_cdf.png": plots.ttft_cdf(
            {run.name: [t * 1000 for t in run.metrics.ttft_s] for run in runs},
            plots.run_title("TTFT CDF (simulated)", report, names),
        ),
        "hit_rate_over_time.png": plots.hit_rate_over_time(
            {run.name: run.metrics.timeline for run in runs},
            plots.run_title("Hit rate over time (simulated)", report, names),
        ),
        "share.png": plots.share_plot(
            {run.name: run.metrics.share_pct for run in runs},
            plots.run_title("Per-instance request share (simulated)", report, names),
        ),
    }


def write_plots(comparison: Comparison, out_dir: Path) -> list[Path]:
    """The PNGs of ``figures`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plots.save(fig, out_dir / name) for name, fig in figures(comparison).items()]
