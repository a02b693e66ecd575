"""Live-run reports: ``report.json`` in the shape of ``warmfleet sim --json``, markdown, PNGs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.table import Table

from warmfleet.bench.loadgen import LoadResult
from warmfleet.bench.report import write_json

COLUMNS = (
    "run", "TTFT p50 ms", "p90", "p99", "E2E p50 ms", "ITL p50 ms", "req/s", "out tok/s",
    "hit rate", "share min-max", "ok", "errors",
)  # fmt: skip


def comparison_report(meta: Mapping[str, Any], runs: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` (scenario, instances, ...) plus ``strategies: {name: summary}``, like the sim."""
    return {**meta, "strategies": dict(runs)}


def _row(name: str, m: Mapping[str, Any]) -> list[str]:
    ttft, e2e, itl = m["ttft_ms"], m["e2e_ms"], m["itl_ms"]
    share = m["share"]
    errors = sum(m["errors"].values())
    return [
        name,
        f"{ttft['p50']:.1f}",
        f"{ttft['p90']:.1f}",
        f"{ttft['p99']:.1f}",
        f"{e2e['p50']:.1f}",
        f"{itl['p50']:.2f}",
        f"{m['throughput_rps']:.1f}",
        f"{m['output_tokens_per_s']:.0f}",
        f"{100 * m['hit_rate']:.1f}%",
        f"{share['min']:.1f}-{share['max']:.1f}%",
        str(m["requests"]["completed"]),
        str(errors),
    ]


def runs_table(report: Mapping[str, Any], title: str | None = None) -> Table:
    table = Table(title=title or str(report.get("scenario", "")))
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, metrics in report["strategies"].items():
        table.add_row(*_row(name, metrics))
    return table


def markdown(report: Mapping[str, Any], title: str) -> str:
    lines = [f"# {title}", ""]
    meta = {k: v for k, v in report.items() if k != "strategies"}
    lines += [f"- **{key}**: {value}" for key, value in meta.items()]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, metrics in report["strategies"].items():
        lines.append("| " + " | ".join(_row(name, metrics)) + " |")
    lines += ["", "TTFT of non-streamed requests is their end-to-end latency.", ""]
    lines += _error_section(report["strategies"])
    return "\n".join(lines)


def _error_section(runs: Mapping[str, Any]) -> list[str]:
    """Each run's failed requests by class, with the first one's message."""
    rows = [
        f"- {name}: {count} x `{kind}`, e.g. {metrics.get('error_samples', {}).get(kind, '-')}"
        for name, metrics in runs.items()
        for kind, count in metrics.get("errors", {}).items()
    ]
    return ["## Failed requests", "", *rows, ""] if rows else []


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    count = len(ordered) or 1
    return ordered, [(i + 1) / count for i in range(len(ordered))]


def write_plots(
    report: Mapping[str, Any], loads: Mapping[str, LoadResult], out_dir: Path
) -> list[Path]:
    """TTFT CDF per run and per-instance request share."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "ttft_cdf.png", out_dir / "share.png"]
    fig, ax = _figure()
    for name, load in loads.items():
        xs, ys = _cdf([r.ttft_s * 1000 for r in load.results if r.ok and r.ttft_s is not None])
        ax.plot(xs, ys, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF (live): {report.get('scenario', '')}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)

    fig, ax = _figure()
    runs = list(report["strategies"].items())
    width = 0.8 / max(len(runs), 1)
    for offset, (name, metrics) in enumerate(runs):
        per_instance = metrics["share"]["per_instance"]
        xs = [i + offset * width for i in range(len(per_instance))]
        ax.bar(xs, list(per_instance.values()), width=width, label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(per_instance))], list(per_instance))
    instances = report.get("instances")
    if isinstance(instances, int) and instances > 0:
        ax.axhline(100.0 / instances, color="black", linestyle="--", linewidth=1, label="fair")
    ax.set_ylabel("share of requests (%)")
    ax.set_title("Per-instance share (live)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    return paths


def write_report(
    report: Mapping[str, Any],
    loads: Mapping[str, LoadResult],
    out_dir: Path,
    title: str,
) -> list[Path]:
    """``report.json``, ``report.md`` and the PNGs into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(report, out_dir / "report.json")
    (out_dir / "report.md").write_text(markdown(report, title), encoding="utf-8")
    return [out_dir / "report.json", out_dir / "report.md", *write_plots(report, loads, out_dir)]
