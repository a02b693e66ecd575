"""The report figures of ``warmfleet sim``, ``bench`` and ``demo`` (matplotlib on an Agg canvas,
no pyplot state): a TTFT CDF on a log axis with plain tick labels, per-instance request share
with the fair line at 1/(instances shown), hit rates. Legends sit under the axes, clear of
the data; every figure's title (its suptitle) says what was run (``run_title``).

matplotlib is imported inside the functions: it is slow to import and only reports need it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmfleet.display import num

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110
LOG_SUBS = (1.0, 2.0, 5.0)  # major ticks of the log axis: 1, 2, 5 x 10^n, labelled plainly
ALL_SUBS = tuple(float(i) for i in range(1, 10))
MAX_LOG_TICKS = 10


def run_title(what: str, report: Mapping[str, Any], runs: Sequence[str]) -> str:
    """``what``, then the scenario, request count, instances and the strategies compared."""
    parts = [str(report.get("scenario") or "?")]
    if report.get("requests"):
        parts.append(f"{report['requests']} requests")
    if report.get("instances"):
        parts.append(f"{report['instances']} instances")
    return f"{what}: {', '.join(parts)}\n{', '.join(runs)}"


def figure() -> tuple[Figure, Axes]:
    """A figure on its own Agg canvas, laid out so a legend outside the axes stays inside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (slow import)
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def legend_outside(fig: Figure) -> None:
    """The legend under the axes (clear of the data and of the title), three entries a row."""
    count = len(fig.axes[0].get_legend_handles_labels()[0]) if fig.axes else 0
    if count == 0:
        return  # nothing labelled to show (e.g. no request succeeded)
    fig.legend(loc="outside lower center", ncols=min(max(count, 1), 3), fontsize="small")


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def _plain(value: float, _pos: object = None) -> str:
    return f"{value:,.0f}" if value >= 1 else num(value, 1)


def log_ms_axis(ax: Axes, low_ms: float, high_ms: float) -> None:
    """An x axis of milliseconds for data from ``low_ms`` to ``high_ms``: log scale with major
    ticks at 1, 2, 5 x 10^n (1 x 10^n over many decades, every integer x 10^n over less than one)
    and plain labels (``200``, ``1,000``), minor ticks unlabelled, so no two labels overprint;
    a linear axis when the data span less than a factor of 4."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415

    decades = math.log10(high_ms / low_ms) if low_ms > 0 and high_ms > low_ms else 0.0
    if decades < math.log10(4):
        ax.set_xlabel("ms")
        return
    subs = (1.0,) if decades > 2.5 else LOG_SUBS if decades >= 0.7 else ALL_SUBS
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=MAX_LOG_TICKS))
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("ms, log scale")


def cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    count = len(ordered) or 1
    return ordered, [(i + 1) / count for i in range(len(ordered))]


def ttft_cdf(ttft_ms: Mapping[str, Sequence[float]], title: str) -> Figure:
    """One CDF line per run (runs without a measured TTFT are left out)."""
    fig, ax = figure()
    measured = [v for values in ttft_ms.values() for v in values if v > 0]
    for name, values in ttft_ms.items():
        xs, ys = cdf([v for v in values if v > 0])
        if xs:
            ax.plot(xs, ys, label=name)
    log_ms_axis(ax, min(measured, default=0.0), max(measured, default=0.0))
    ax.set_xlabel(f"time to first token ({ax.get_xlabel()})")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    fig.suptitle(title)
    ax.grid(alpha=0.3, which="major")
    legend_outside(fig)
    return fig


def share_plot(per_instance: Mapping[str, Mapping[str, float]], title: str) -> Figure:
    """Grouped bars of each run's request share (%) per instance; the fair line is 100 / the
    number of instances shown (every instance any run reports)."""
    fig, ax = figure()
    ids = sorted({i for shares in per_instance.values() for i in shares})
    width = 0.8 / max(len(per_instance), 1)
    for offset, (name, shares) in enumerate(per_instance.items()):
        xs = [i + offset * width for i in range(len(ids))]
        ax.bar(xs, [shares.get(i, 0.0) for i in ids], width=width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ids))], ids)
    if sum(len(i) for i in ids) > 48:
        ax.tick_params(axis="x", labelrotation=30)
    if ids:
        fair = 100.0 / len(ids)
        ax.axhline(fair, color="black", linestyle="--", linewidth=1, label=f"fair ({fair:.1f} %)")
    ax.set_xlabel("instance")
    ax.set_ylabel("share of requests (%)")
    fig.suptitle(title)
    legend_outside(fig)
    return fig


def hit_rate_bars(hit_rates: Mapping[str, float | None], ideal: float | None, title: str) -> Figure:
    """One bar per run (prefix-cache hit rate in %, labelled; "n/a" when not measured) and the
    ideal (one infinite cache fed the same stream) as a dashed line."""
    fig, ax = figure()
    names = list(hit_rates)
    values = [100.0 * (v or 0.0) for v in hit_rates.values()]
    bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(names))])
    labels = ["n/a" if v is None else f"{100 * v:.1f} %" for v in hit_rates.values()]
    ax.bar_label(bars, labels=labels, padding=2)
    if ideal is not None:
        y = 100.0 * ideal
        ax.axhline(y, color="black", linestyle="--", linewidth=1, label=f"ideal ({y:.1f} %)")
        legend_outside(fig)
    ax.set_ylim(0, 105)
    ax.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    if sum(len(n) for n in names) > 60:
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle(title)
    return fig


def hit_rate_over_time(
    timelines: Mapping[str, Sequence[tuple[float, float]]], title: str
) -> Figure:
    fig, ax = figure()
    for name, timeline in timelines.items():
        ax.plot([t for t, _ in timeline], [h for _, h in timeline], label=name)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("engine-delivered KV hit rate (tokens)")
    ax.set_ylim(0, 1)
    fig.suptitle(title)
    ax.grid(alpha=0.3)
    legend_outside(fig)
    return fig
