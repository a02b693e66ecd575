"""Live-run reports: ``report.json`` in the shape of ``warmfleet sim --json``, markdown, PNGs.

The table and ``report.md`` show figures rounded for people; a figure that was not measured is
``n/a`` (the line under the table says why), never ``None`` or a zero that looks measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmfleet.bench import plots
from warmfleet.bench.loadgen import LoadResult
from warmfleet.bench.report import write_json
from warmfleet.display import (
    Column,
    Grid,
    OutputFormat,
    chatter_console,
    emit,
    fixed,
    num,
    pct,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = (
    Column("run", left=True), Column("TTFT p50 ms"), Column("p90", drop=4), Column("p99"),
    Column("E2E p50 ms", drop=3), Column("ITL p50 ms", drop=5), Column("req/s"),
    Column("out tok/s", drop=6), Column("hit rate"), Column("share min-max", drop=2),
    Column("ok"), Column("errors", drop=1),
)  # fmt: skip
NA = "n/a"
ITL_BURST_MS = 1.0  # an ITL p50 under this is mostly tokens arriving in one network read
# What a reader needs to know to read report.json's meta values that were not set.
_UNSET = {
    "instances": "no engine metrics URLs given",
    "closed_loop_concurrency": "open loop",
    "rate_rps": "the scenario's own arrival times",
    "router_overhead_ms": "not measured in this run",
}


def comparison_report(meta: Mapping[str, Any], runs: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` (scenario, instances, ...) plus ``strategies: {name: summary}``, like the sim."""
    return {**meta, "strategies": dict(runs)}


def _measured(m: Mapping[str, Any], source: str) -> bool:
    return bool(m.get(source, "known") != "unknown")


def _row(name: str, m: Mapping[str, Any], stream: bool) -> list[str]:
    ttft, e2e, itl = m["ttft_ms"], m["e2e_ms"], m["itl_ms"]
    share = m["share"]
    shares = f"{fixed(share['min'], 1)}-{fixed(share['max'], 1)}%"
    return [
        name,
        fixed(ttft["p50"], 1),
        fixed(ttft["p90"], 1),
        fixed(ttft["p99"], 1),
        fixed(e2e["p50"], 1),
        num(itl["p50"]) if stream else NA,
        num(m["throughput_rps"]),
        fixed(m["output_tokens_per_s"], 0),
        pct(m["hit_rate"]) if _measured(m, "hit_rate_source") else NA,
        shares if _measured(m, "share_source") else NA,
        str(m["requests"]["completed"]),
        str(sum(m["errors"].values())),
    ]


def _streamed(report: Mapping[str, Any]) -> bool:
    return report.get("stream") is not False


def runs_table(report: Mapping[str, Any], title: str | None = None) -> Grid:
    grid = Grid(title or str(report.get("scenario", "")), COLUMNS)
    for name, metrics in report["strategies"].items():
        grid.add(*_row(name, metrics, _streamed(report)))
    return grid


def print_runs(
    report: Mapping[str, Any],
    title: str | None = None,
    fmt: OutputFormat = OutputFormat.table,
    wide: bool = False,
) -> None:
    """The runs table (TSV/JSON on request: JSON is the report) and its notes."""
    emit(runs_table(report, title), fmt, wide=wide, document=report)
    console = chatter_console(fmt)
    for line in notes(report):
        console.print(line, style="dim", markup=False)


def notes(report: Mapping[str, Any]) -> list[str]:
    """Lines under the table for figures a reader would misread."""
    runs: Mapping[str, Any] = report["strategies"]
    lines = []
    if not _streamed(report):
        lines.append(
            "Not streamed: TTFT is each request's end-to-end latency and ITL is not measured."
        )
    bursty = [n for n, m in runs.items() if 0 < m["itl_ms"]["p50"] < ITL_BURST_MS]
    if _streamed(report) and bursty:
        example = runs[bursty[0]]["itl_ms"]["p50"]
        lines.append(
            f"ITL is the gap between streamed chunks as the client reads them. A p50 under "
            f"{ITL_BURST_MS:g} ms ({bursty[0]}: {num(example)} ms) means most tokens arrived "
            "several per network read (the gaps inside a read are ~0), not that the engine "
            "made a token that fast: compare E2E and out tok/s instead."
        )
    if any(not _measured(m, "hit_rate_source") for m in runs.values()):
        lines.append(
            "Hit rate n/a: the engines' /metrics were not scraped (--metrics-url) and no "
            "response reported usage.cached_tokens."
        )
    if any(not _measured(m, "share_source") for m in runs.values()):
        lines.append("Share n/a: no response named its instance and no engine was scraped.")
    return lines


def _meta_value(key: str, value: Any) -> str:
    if value is None:
        return f"n/a ({_UNSET.get(key, 'not set')})"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return num(value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def markdown(report: Mapping[str, Any], title: str) -> str:
    lines = [f"# {title}", ""]
    meta = {k: v for k, v in report.items() if k != "strategies"}
    lines += [f"- **{key}**: {_meta_value(key, value)}" for key, value in meta.items()]
    headers = [c.header for c in COLUMNS]
    lines += ["", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for name, metrics in report["strategies"].items():
        lines.append("| " + " | ".join(_row(name, metrics, _streamed(report))) + " |")
    lines += ["", *(f"{line}\n" for line in notes(report))]
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


def figures(report: Mapping[str, Any], loads: Mapping[str, LoadResult]) -> dict[str, Figure]:
    """File name -> figure: TTFT CDF per run, per-instance request share, hit rate per run."""
    runs: Mapping[str, Any] = report["strategies"]
    names = list(runs)
    ttft = {
        name: [r.ttft_s * 1000 for r in load.results if r.ok and r.ttft_s is not None]
        for name, load in loads.items()
    }
    what = "TTFT CDF (live)" if _streamed(report) else "E2E latency CDF (live, not streamed)"
    hit_rates = {
        n: m["hit_rate"] if _measured(m, "hit_rate_source") else None for n, m in runs.items()
    }
    ideals = [m.get("reuse", {}).get("ideal") for m in runs.values()]
    return {
        "ttft_cdf.png": plots.ttft_cdf(ttft, plots.run_title(what, report, names)),
        "share.png": plots.share_plot(
            {n: m["share"]["per_instance"] for n, m in runs.items()},
            plots.run_title("Per-instance request share (live)", report, names),
        ),
        "hit_rate.png": plots.hit_rate_bars(
            hit_rates,
            next((i for i in ideals if i is not None), None),
            plots.run_title("Prefix-cache hit rate (live)", report, names),
        ),
    }


def write_plots(
    report: Mapping[str, Any], loads: Mapping[str, LoadResult], out_dir: Path
) -> list[Path]:
    """The PNGs of ``figures`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plots.save(fig, out_dir / name) for name, fig in figures(report, loads).items()]


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
