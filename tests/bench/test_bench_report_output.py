"""What the live and simulated reports show people: plots (ticks that do not overprint, legends
clear of the data, the fair line at 1/instances shown, titles saying what ran), report.md
(rounded, no None, footnotes only where they apply) and tables that fit 100 columns."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from matplotlib.figure import Figure
from rich.console import Console

from warmfleet.bench import plots
from warmfleet.bench.loadgen import LoadResult, RequestResult
from warmfleet.bench.loadgen_metrics import summarize
from warmfleet.bench.loadgen_report import comparison_report, figures, markdown, runs_table
from warmfleet.bench.report import comparison_table
from warmfleet.bench.report import figures as sim_figures
from warmfleet.display import OutputFormat, emit
from warmfleet.sim.runner import run_comparison
from warmfleet.sim.scenario import builtin_scenario

STRATEGIES = ("random", "least_outstanding_requests", "prefix_hash", "prefix_affinity")
INSTANCES = [f"instance-{i}" for i in range(6)]


def _load(seed: int, *, stream: bool) -> LoadResult:
    """Requests with TTFTs from 17 to 700 ms (the live demo's spread, where the log axis used to
    label its minor ticks over one another), spread over six instances by response header."""
    rng = random.Random(seed)
    results = []
    for i in range(120):
        ttft_s = 0.017 * (700 / 17) ** rng.random()
        results.append(
            RequestResult(
                request_id=i, start_s=i * 0.05, e2e_s=ttft_s + 0.2, ttft_s=ttft_s,
                itl_s=[0.00003, 0.00003, 0.02] if stream else [], status=200, output_tokens=8,
                prompt_tokens=100, cached_tokens=rng.choice([0, 60, 90]),
                instance=INSTANCES[rng.randrange(len(INSTANCES))],
            )
        )  # fmt: skip
    return LoadResult(results, submitted=120, not_sent=0, wall_s=6.0)


def _live(*, stream: bool = True, metrics_urls: int | None = 3) -> tuple[dict[str, Any], Any]:
    loads = {name: _load(i, stream=stream) for i, name in enumerate(STRATEGIES)}
    runs = {
        name: summarize(load, instances=INSTANCES, reuse_bounds={"ideal": 0.8})
        for name, load in loads.items()
    }
    meta = {"scenario": "aws-long-context-live", "requests": 120, "instances": metrics_urls,
            "closed_loop_concurrency": 8, "rate_rps": None, "stream": stream,
            "router_overhead_ms": None, "working_set_ratio": 2.98765432}  # fmt: skip
    return comparison_report(meta, runs), loads


def _draw(fig: Figure) -> Any:
    fig.canvas.draw()
    return fig.canvas.get_renderer()  # type: ignore[attr-defined]


def _tick_labels_apart(fig: Figure) -> None:
    """At least two labels on each axis, and no two drawn labels (those beside the axes: the
    others are outside the view) overlap."""
    renderer = _draw(fig)
    for ax in fig.axes:
        frame = ax.get_window_extent(renderer)
        for axis in (ax.xaxis, ax.yaxis):
            spans = (
                (frame.x0 - 1, frame.x1 + 1) if axis is ax.xaxis else (frame.y0 - 1, frame.y1 + 1)
            )
            boxes = [
                box
                for label in axis.get_ticklabels(which="both")
                if label.get_visible() and label.get_text()
                for box in [label.get_window_extent(renderer)]
                if spans[0] <= _centre(box, axis is ax.xaxis) <= spans[1]
            ]
            assert len(boxes) >= 2, f"too few labels on {axis.axis_name}"
            for i, a in enumerate(boxes):
                assert not any(a.overlaps(b) for b in boxes[i + 1 :]), "tick labels overprint"


def _centre(box: Any, horizontal: bool) -> float:
    return float((box.x0 + box.x1) / 2 if horizontal else (box.y0 + box.y1) / 2)


def _legend_clear_of_data(fig: Figure) -> None:
    renderer = _draw(fig)
    in_axes = [ax.get_legend() for ax in fig.axes]
    legends = [*fig.legends, *(legend for legend in in_axes if legend is not None)]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "legend on the data"


def _fair_line(fig: Figure) -> float:
    (line,) = [ln for ln in fig.axes[0].get_lines() if str(ln.get_label()).startswith("fair")]
    ydata: Any = line.get_ydata()
    ys = {float(y) for y in ydata}
    assert len(ys) == 1
    return ys.pop()


def test_live_plots_are_readable_and_say_what_ran() -> None:
    report, loads = _live()
    figs = figures(report, loads)
    assert set(figs) == {"ttft_cdf.png", "share.png", "hit_rate.png"}
    for name, fig in figs.items():
        title = fig.get_suptitle()
        assert "aws-long-context-live" in title, name
        assert "120 requests" in title
        assert all(s in title for s in STRATEGIES)
        _tick_labels_apart(fig)
        _legend_clear_of_data(fig)
    # the share plot shows six instances although only three metrics URLs were given
    share = figs["share.png"]
    assert len(share.axes[0].get_xticklabels()) == 6
    assert _fair_line(share) == 100.0 / 6
    bars = figs["hit_rate.png"].axes[0].patches
    assert len(bars) == len(STRATEGIES)
    assert [t.get_text() for t in figs["hit_rate.png"].axes[0].get_xticklabels()] == list(
        STRATEGIES
    )


@pytest.mark.parametrize(
    ("low_ms", "high_ms"),
    [(0.5, 4.0), (17, 700), (55, 140), (120, 180), (300, 450), (9, 110), (0.3, 30_000), (1, 1e6)],
)
def test_ttft_axis_labels_never_overprint(low_ms: float, high_ms: float) -> None:
    rng = random.Random(1)
    values = [low_ms, high_ms, *(rng.uniform(low_ms, high_ms) for _ in range(50))]
    fig = plots.ttft_cdf({"a": values, "b": [high_ms / 2]}, "TTFT CDF: test")
    _tick_labels_apart(fig)


def test_sim_plots_fair_line_ticks_and_titles() -> None:
    spec = builtin_scenario("gsp", 5, "tiny-cpu", 1).model_copy(update={"requests": 60})
    comparison = run_comparison(spec, ["random", "prefix_affinity"])
    figs = sim_figures(comparison)
    for fig in figs.values():
        assert "gsp, 60 requests, 5 instances" in fig.get_suptitle()
        _tick_labels_apart(fig)
        _legend_clear_of_data(fig)
    assert _fair_line(figs["share.png"]) == 100.0 / 5


def test_report_md_is_rounded_without_none_and_explains_itl() -> None:
    report, _ = _live()
    text = markdown(report, "live demo")
    assert "None" not in text
    assert "2.99" in text
    assert "2.98765432" not in text
    assert "**router_overhead_ms**: n/a (not measured in this run)" in text
    assert "**rate_rps**: n/a" in text
    assert "non-streamed" not in text
    assert "Not streamed" not in text
    assert "ITL is the gap between streamed chunks" in text
    assert "| 0.03 |" in text  # ITL p50 (0.03 ms) rounded, not 0.030000000000000002
    plain, _ = _live(stream=False)
    text = markdown(plain, "bench")
    assert "Not streamed: TTFT is each request's end-to-end latency" in text
    assert "ITL is the gap" not in text
    assert "None" not in text


def _render(grid: Any, width: int, *, wide: bool = False) -> str:
    out = io.StringIO()
    emit(grid, OutputFormat.table, wide=wide, console=Console(file=out, width=width))
    return out.getvalue()


def test_live_and_sim_tables_fit_100_columns_and_wide_shows_all() -> None:
    report, _ = _live()
    spec = builtin_scenario("gsp", 3, "tiny-cpu", 1).model_copy(update={"requests": 30})
    sim = comparison_table(run_comparison(spec, list(STRATEGIES)), {"random": 1.0})
    for grid in (runs_table(report), sim):
        text = _render(grid, 100)
        assert max(len(line) for line in text.splitlines()) <= 100
        assert "…" not in text
        assert "least_outstanding_requests" in text
        wide = _render(grid, 100, wide=True)
        assert all(column.header in wide for column in grid.columns)
