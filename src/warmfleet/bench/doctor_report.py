"""`warmfleet doctor`'s output: its tables (``display``), its text lines, and ``--report DIR``
(doctor.json, doctor.md, waterfall.png), all from the result's JSON document."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmfleet.bench import plots
from warmfleet.bench.report import write_json
from warmfleet.display import Column, Grid, fixed, num, pct, size
from warmfleet.sim.doctor import STEPS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STEP_TITLES = {
    "ideal": "ideal (infinite cache)",
    "fleet_ceiling": "fleet ceiling (one LRU of the fleet's KV)",
    "best_replay": "highest-reuse strategy in replay",
    "captured_replay": "captured strategy in replay",
    "delivered": "delivered live (engine-reported)",
}

OBJECTIVE_TITLES = {"p95_ttft_ms": "the lowest P95 TTFT", "hit_rate": "the highest hit rate"}

TICKS = {
    "ideal": "ideal\n(infinite cache)",
    "fleet_ceiling": "fleet ceiling\n(one LRU of all KV)",
    "best_replay": "highest-reuse\nstrategy in replay",
    "captured_replay": "captured strategy\nin replay",
    "delivered": "delivered live\n(engine-reported)",
}


def _trace_name(doc: Mapping[str, Any]) -> str:
    return str(doc["trace"]).removeprefix("trace ").rsplit("/", 1)[-1]


def _fleet(doc: Mapping[str, Any]) -> str:
    """``preset x instances``, and the gateway replicas when there are several."""
    fleet = doc["fleet"]
    text = f"{fleet['preset']} x {fleet['instances']}"
    replicas = fleet["gateway_replicas"]
    if replicas == 1:
        return text
    delay = fleet["sync_delay_ms"]
    sync = "no sync" if delay is None else f"sync {delay:g} ms"
    return f"{text}, {replicas} gateway replicas ({sync})"


def _title(doc: Mapping[str, Any]) -> str:
    return f"KV reuse waterfall | {_fleet(doc)}"


def _waterfall_grid(doc: Mapping[str, Any]) -> Grid:
    grid = Grid(_title(doc), (Column("step", left=True), Column("KV reuse"), Column("loss")))
    before: float | None = None
    for step in STEPS:
        value = doc["waterfall"][step]
        loss = "" if value is None or before is None else pct(before - value)
        grid.add(STEP_TITLES[step], "n/a" if value is None else pct(value), loss)
        before = value if value is not None else before
    return grid


def _strategies_grid(doc: Mapping[str, Any]) -> Grid:
    scale_out = doc["scale_out"].get("replay_hit_rate", {})
    columns = (
        Column("strategy", left=True), Column("hit rate"), Column("TTFT p50 ms"),
        Column("p95"), Column("p99"), Column("scale-out hit", drop=1),
    )  # fmt: skip
    grid = Grid("replay on the captured fleet, every strategy", columns)
    for name, fig in doc["strategies"].items():
        ttft = fig["ttft_ms"]
        out = scale_out.get(name)
        grid.add(
            name, pct(fig["hit_rate"]), fixed(ttft["p50"], 0), fixed(ttft["p95"], 0),
            fixed(ttft["p99"], 0), "n/a" if out is None else pct(out),
        )  # fmt: skip
    return grid


def doctor_tables(doc: Mapping[str, Any]) -> list[Grid]:
    return [_waterfall_grid(doc), _strategies_grid(doc)]


def _recommendation(rec: Mapping[str, Any]) -> str:
    kind = rec["kind"]
    if kind == "strategy":
        keep = "keep the captured " if rec.get("captured") else ""
        return (
            f"strategy: {keep}{rec['strategy']} ({OBJECTIVE_TITLES[rec['objective']]} in replay"
            f"{', or tied with it' if keep else ''}: hit rate {pct(rec['hit_rate'])}, TTFT P95 "
            f"{fixed(rec['ttft_ms']['p95'], 0)} ms)"
        )
    if kind == "parameter" and rec["value"] == rec["default"]:
        tried = ", ".join(f"{v['value']:g}" for v in rec["sweep"])
        return (
            f"parameter: {rec['strategy']} {rec['parameter']}: keep the default "
            f"{rec['default']:g} (none of {tried} did better in replay)"
        )
    if kind == "parameter":
        return (
            f"parameter: {rec['strategy']} {rec['parameter']}={rec['value']:g} (default "
            f"{rec['default']:g}; replay: hit rate {pct(rec['hit_rate'])}, TTFT P95 "
            f"{fixed(rec['ttft_ms']['p95'], 0)} ms)"
        )
    goal = ", ".join(f"{k}={v:g}" for k, v in rec["target"].items())
    if kind == "target" and rec["reached_now"]:
        return f"target {goal}: reached already by the recommended strategy"
    if kind == "target":
        return f"target {goal}: {rec['reason']}"
    last = rec["sweep"][-1]
    what = "instances" if kind == "instances" else "KV per instance"
    amount = rec["instances"] if kind == "instances" else f"{rec['kv_capacity_tokens']} tokens"
    verdict = "reaches it" if rec["reached"] else "does not reach it yet (largest tried)"
    return (
        f"target {goal}: {what} {amount} {verdict} (replay: hit rate {pct(last['hit_rate'])}, "
        f"TTFT P95 {fixed(last['ttft_ms']['p95'], 0)} ms)"
    )


def _captured_line(captured: Mapping[str, Any]) -> str:
    """How the waterfall's captured step replayed (by the captured placements or not)."""
    fresh = pct(captured["fresh_draw"]["hit_rate"])
    if captured["replay"] == "placements":
        return (
            f"captured strategy {captured['strategy']}: replayed by the captured placements "
            f"({captured['placed_requests']} of {captured['requests']} requests placed as live): "
            f"hit rate {pct(captured['hit_rate'])}; a fresh draw of its choices: {fresh}"
        )
    return (
        f"captured strategy {captured['strategy']}: replayed by a fresh draw of its choices "
        f"(the trace names no instance): hit rate {fresh}"
    )


def _sync_line(doc: Mapping[str, Any]) -> str | None:
    """The replicas' sync traffic at the trace's rate (None: one gateway, or no sync)."""
    fleet, sync = doc["fleet"], doc["replica_sync"]
    if fleet["gateway_replicas"] == 1 or fleet["sync_delay_ms"] is None:
        return None
    each, horizon = sync["replica_bytes_per_s"], sync["log_horizon_s"]
    rate = "n/a (the trace has no duration)" if each is None else f"{size(round(each))}/s"
    held = "" if horizon is None else f", {num(horizon)} s of this trace"
    return (
        f"replica sync: {rate} into and out of each of the {fleet['gateway_replicas']} "
        f"replicas at the trace's rate ({num(sync['routed_note_bytes']['mean'])} B a routing "
        f"note of its {doc['block_tokens']}-unit blocks, 2 notes a request); logBytes "
        f"({size(sync['log_bytes'])}) keeps {num(sync['log_requests'])} requests' notes for a "
        f"restarted replica{held}{_reuse_part(sync)}"
    )


def _reuse_part(sync: Mapping[str, Any]) -> str:
    """How much of the replay's cache hits the log covers, and what would cover 99 %."""
    covered, p99_s = sync["log_covers_hit_tokens"], sync["hit_reuse_gap_s"]["p99"]
    if covered is None or p99_s is None:
        return ""
    need = sync["log_bytes_for_p99"]
    verdict = (
        "enough"
        if need is None or need <= sync["log_bytes"]
        else f"set logBytes to at least {size(need)}"
    )
    return (
        f"; it covers {pct(covered)} of the replay's hit tokens (99 % reuse a prefix routed "
        f"within {num(p99_s)} s: {verdict})"
    )


def doctor_lines(doc: Mapping[str, Any]) -> list[str]:
    """The findings under the tables: the largest loss, churn, the recommendations."""
    loss = doc["largest_loss"]
    lines = [
        "largest loss: none (no step loses reuse)"
        if loss is None
        else f"largest loss: {pct(loss['loss'])} from {loss['from']} to {loss['to']}; "
        f"closes it: {loss['closes']}"
    ]
    rejected = max((s.get("rejected", 0) for s in doc["strategies"].values()), default=0)
    if rejected:
        lines.append(
            f"warning: {rejected} of {doc['requests']} requests cannot fit the replayed engines "
            "(prompt + output over max_model_len or the KV capacity): the replays' figures "
            "leave them out, the waterfall's bounds do not"
        )
    captured = doc.get("captured")
    if captured is not None:
        lines.append(_captured_line(captured))
    scale_out, unprepared = doc["scale_out"], doc["unprepared"]
    if scale_out["reason"] is not None:
        lines.append(f"hit rate during scale-out windows: n/a ({scale_out['reason']})")
    else:
        live = scale_out["live_hit_rate"]
        lines.append(
            f"scale-out windows: {scale_out['windows']} ({scale_out['requests']} requests), "
            f"live hit rate {'n/a' if live is None else pct(live)}"
        )
    share = unprepared["share"]
    lines.append(
        f"requests on an instance in its first {unprepared['window_s']:g} s: "
        + (f"n/a ({unprepared['reason']})" if share is None else pct(share))
    )
    sync = _sync_line(doc)
    if sync is not None:
        lines.append(sync)
    lines.extend(f"recommend {_recommendation(rec)}" for rec in doc["recommendations"])
    return lines


def waterfall_figure(doc: Mapping[str, Any]) -> Figure:
    """One bar per waterfall step ("n/a" when not measured), the largest loss in red."""
    fig, ax = plots.figure()
    values = [doc["waterfall"][step] for step in STEPS]
    loss = doc["largest_loss"]
    colors = ["C0"] * len(STEPS)
    if loss is not None:
        colors[STEPS.index(loss["to"])] = "C3"
    names = [TICKS[s] for s in STEPS]
    bars = ax.bar(names, [100.0 * (v or 0.0) for v in values], color=colors)
    labels = ["n/a" if v is None else f"{100 * v:.1f} %" for v in values]
    ax.bar_label(bars, labels=labels, padding=2)
    ax.set_ylim(0, 105)
    ax.set_ylabel("KV reuse (% of prompt tokens)")
    ax.tick_params(axis="x", labelsize="small")
    fig.suptitle(
        f"KV reuse waterfall (warmfleet doctor, simulated replay): {_trace_name(doc)}\n"
        f"{doc['requests']} requests, {_fleet(doc)}, recommended {doc['best_strategy']} "
        f"({OBJECTIVE_TITLES[doc['objective']]})"
    )
    return fig


def _markdown(doc: Mapping[str, Any]) -> str:
    fleet = doc["fleet"]
    lines = [f"# warmfleet doctor: {_trace_name(doc)}", ""]
    sessions = doc["sessions"]
    keyed = f"; {sessions} sessions, each request keyed with its own" if sessions else ""
    lines += [
        f"{doc['requests']} requests replayed on {_fleet(doc)} "
        f"({fleet['kv_capacity_tokens']} KV tokens per instance, {doc['block_tokens']}-token "
        f"blocks); captured strategy: {fleet['captured_strategy'] or 'n/a'}{keyed}.",
        "",
    ]
    lines += ["| step | KV reuse |", "|---|---|"]
    for step in STEPS:
        value = doc["waterfall"][step]
        lines.append(f"| {STEP_TITLES[step]} | {'n/a' if value is None else pct(value)} |")
    lines += ["", "![waterfall](waterfall.png)", ""]
    lines += ["| strategy | hit rate | TTFT p50 ms | p95 | p99 |", "|---|---|---|---|---|"]
    for name, fig in doc["strategies"].items():
        t = fig["ttft_ms"]
        lines.append(
            f"| {name} | {pct(fig['hit_rate'])} | {fixed(t['p50'], 0)} | {fixed(t['p95'], 0)} "
            f"| {fixed(t['p99'], 0)} |"
        )
    lines += ["", *(f"- {line}" for line in doctor_lines(doc)), ""]
    return "\n".join(lines)


def write_doctor_report(doc: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """doctor.json, doctor.md and waterfall.png into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "doctor.json", out_dir / "doctor.md"
    write_json(doc, json_path)
    md_path.write_text(_markdown(doc), encoding="utf-8")
    png = plots.save(waterfall_figure(doc), out_dir / "waterfall.png")
    return [json_path, md_path, png]
