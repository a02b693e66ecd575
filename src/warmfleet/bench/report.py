"""Simulator comparison output: deterministic JSON, PNG plots (matplotlib Agg), a rich table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from warmfleet.sim.runner import Comparison

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


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def comparison_table(comparison: Comparison, wall_s: Mapping[str, float] | None = None) -> Table:
    report = comparison.report()
    title = (
        f"{report['scenario']} | {report['preset']} x {report['instances']} | "
        f"{report['requests']} requests | working set = {report['working_set_ratio']:.2f} x one "
        f"instance's KV ({report['fleet_working_set_ratio']:.2f} x fleet)"
    )
    table = Table(title=title)
    columns = (
        "strategy", "TTFT p50 ms", "p90", "p99", "E2E p50 ms", "req/s", "out tok/s", "hit rate",
        "avail", "capt", "ideal", "fleet ceil", "share min-max", "spills",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    if wall_s is not None:
        table.add_column("wall s", justify="right")
    for run in comparison.runs:
        m = run.metrics.as_report()
        ttft: dict[str, float] = m["ttft_ms"]  # type: ignore[assignment]
        e2e: dict[str, float] = m["e2e_ms"]  # type: ignore[assignment]
        reuse: dict[str, float] = m["reuse"]  # type: ignore[assignment]
        share: dict[str, float] = m["share"]  # type: ignore[assignment]
        row = [
            run.name,
            f"{ttft['p50']:.0f}",
            f"{ttft['p90']:.0f}",
            f"{ttft['p99']:.0f}",
            f"{e2e['p50']:.0f}",
            f"{run.metrics.throughput_rps:.2f}",
            f"{run.metrics.output_tokens_per_s:.0f}",
            _pct(run.metrics.hit_rate),
            _pct(reuse["available"]),
            _pct(reuse["captured"]),
            _pct(reuse["ideal"]),
            _pct(reuse["fleet_ceiling"]),
            f"{share['min']:.1f}-{share['max']:.1f}%",
            str(run.metrics.spills),
        ]
        if wall_s is not None:
            row.append(f"{wall_s.get(run.name, run.wall_s):.1f}")
        table.add_row(*row)
    return table


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    count = len(ordered) or 1
    return ordered, [(i + 1) / count for i in range(len(ordered))]


def _figure() -> tuple[Figure, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (slow import)
    from matplotlib.figure import Figure  # noqa: PLC0415

    """A figure on its own Agg canvas (no pyplot global state)."""
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def write_plots(comparison: Comparison, out_dir: Path) -> list[Path]:
    """TTFT CDF per strategy, hit rate over time, per-instance request share."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "ttft_cdf.png", out_dir / "hit_rate_over_time.png", out_dir / "share.png"]
    title = f"{comparison.scenario.name}, {comparison.scenario.instances} instances"

    fig, ax = _figure()
    for run in comparison.runs:
        xs, ys = _cdf([t * 1000 for t in run.metrics.ttft_s])
        ax.plot(xs, ys, label=run.name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF: {title}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)

    fig, ax = _figure()
    for run in comparison.runs:
        ax.plot(
            [t for t, _ in run.metrics.timeline],
            [h for _, h in run.metrics.timeline],
            label=run.name,
        )
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("engine-delivered KV hit rate (tokens)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Hit rate over time: {title}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)

    fig, ax = _figure()
    runs = comparison.runs
    width = 0.8 / max(len(runs), 1)
    for offset, run in enumerate(runs):
        ids = list(run.metrics.share_pct)
        xs = [i + offset * width for i in range(len(ids))]
        ax.bar(xs, list(run.metrics.share_pct.values()), width=width, label=run.name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ids))], ids)
    if runs:
        fair = 100.0 / comparison.scenario.instances
        ax.axhline(fair, color="black", linestyle="--", linewidth=1, label="fair share")
    ax.set_ylabel("share of requests (%)")
    ax.set_title(f"Per-instance share: {title}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    return paths
