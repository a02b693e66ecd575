"""`warmfleet doctor`: the waterfall (fields, monotone steps, the largest loss named), churn
figures, recommendations, --json/--report files, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from support.doctor_captures import capture_lines, write_capture
from warmfleet.api.trace_format import TraceRecord
from warmfleet.bench import doctor_cli
from warmfleet.core.errors import ConfigError
from warmfleet.edge import resolve_traces_dir
from warmfleet.routing.factory import strategy_config
from warmfleet.sim import doctor
from warmfleet.sim.doctor_sweeps import (
    Chosen,
    best_of,
    objective_for,
    parse_objective,
    parse_target,
    sweep_knob,
)
from warmfleet.sim.metrics import RunMetrics
from warmfleet.sim.runner import StrategyRun
from warmfleet.sim.workloads.traces import DEFAULT_TRACES

app = typer.Typer()
doctor_cli.register(app)
app.command("noop")(lambda: None)  # two commands: `doctor` stays a subcommand
WATERFALL = {"ideal", "fleet_ceiling", "best_replay", "captured_replay", "delivered"}


def _doctor(args: list[str]) -> tuple[int, str, dict[str, Any]]:
    result = CliRunner().invoke(app, ["doctor", *args, "--format", "json"])
    doc = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, result.output, doc


def test_doctor_on_a_capture(tmp_path: Path) -> None:
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, capture_lines(300, rate_rps=1.0))
    out = tmp_path / "doctor.json"
    args = [str(trace), "--json", str(out), "--report", str(tmp_path / "r"), "--target",
            "p95_ttft_ms=5"]  # fmt: skip
    code, output, doc = _doctor(args)
    assert code == 0, output
    written = json.loads(out.read_text())
    assert written["waterfall"] == pytest.approx(doc["waterfall"], abs=1e-4)
    fall = doc["waterfall"]
    assert isinstance(fall, dict)
    assert set(fall) == WATERFALL
    assert all(isinstance(fall[step], float) for step in WATERFALL)  # captured, with engines
    assert fall["ideal"] >= fall["fleet_ceiling"]
    assert fall["best_replay"] >= fall["captured_replay"]  # here; by placements not always
    assert fall["captured_replay"] > fall["delivered"]  # the generator reports half the hits
    captured = doc["captured"]  # the capture names instances: its placements replayed
    assert captured["strategy"] == "prefix_hash (captured)"
    assert captured["replay"] == "placements"
    assert captured["hit_rate"] == pytest.approx(fall["captured_replay"])
    # i0/i1 from the start, i2 joining at 120 s (added just before its first request)
    assert captured["placed_requests"] == captured["requests"] == 300
    fresh = doc["strategies"]["prefix_hash (captured)"]["hit_rate"]
    assert captured["fresh_draw"]["hit_rate"] == fresh
    assert "replayed by the captured placements (300 of 300" in (
        tmp_path / "r" / "doctor.md"
    ).read_text(encoding="utf-8")
    loss = doc["largest_loss"]
    assert isinstance(loss, dict)
    drops = {
        (a, b): fall[a] - fall[b] for a, b in zip(doctor.STEPS, doctor.STEPS[1:], strict=False)
    }
    assert (loss["from"], loss["to"]) == max(drops, key=lambda k: drops[k])
    assert loss["closes"] == doctor.CLOSERS[loss["to"]]
    strategies = doc["strategies"]
    assert isinstance(strategies, dict)
    assert {
        "prefix_affinity",
        "sglang_cache_aware",
        "llmd_approx",
        "prefix_hash (captured)",
    } <= set(strategies)
    assert set(strategies["random"]["ttft_ms"]) == {"p50", "p95", "p99"}
    scale_out = doc["scale_out"]
    assert isinstance(scale_out, dict)
    assert scale_out["windows"] == 1
    assert scale_out["requests"] > 0
    assert scale_out["live_hit_rate"] is not None
    assert 0 < doc["unprepared"]["share"] < 1
    kinds = [rec["kind"] for rec in doc["recommendations"]]
    assert kinds[0] == "strategy"
    assert {"instances", "kv_per_instance"} <= set(kinds)
    sizing = next(r for r in doc["recommendations"] if r["kind"] == "instances")
    assert sizing["sweep"]
    assert sizing["target"] == {"p95_ttft_ms": 5.0}
    assert (tmp_path / "r" / "doctor.md").read_text().startswith("# warmfleet doctor")
    assert (tmp_path / "r" / "waterfall.png").read_bytes()[:4] == b"\x89PNG"


def test_doctor_without_header_or_engine_figures(tmp_path: Path) -> None:
    trace = tmp_path / "plain.jsonl"
    write_capture(trace, capture_lines(120, header=False, engine=False))
    code, output, doc = _doctor([str(trace), "--instances", "2", "--preset", "tiny-cpu"])
    assert code == 0, output
    fall = doc["waterfall"]
    assert isinstance(fall, dict)
    assert fall["captured_replay"] is None
    assert doc["captured"] is None
    assert fall["delivered"] is None
    assert fall["ideal"] >= fall["fleet_ceiling"] > 0
    fleet = doc["fleet"]
    assert isinstance(fleet, dict)
    assert (fleet["instances"], fleet["preset"], fleet["captured_strategy"]) == (
        2,
        "tiny-cpu",
        None,
    )
    table = CliRunner().invoke(app, ["doctor", str(trace), "--instances", "2"])
    assert "largest loss:" in table.output
    assert "recommend strategy:" in table.output
    code, output, doc = _doctor([str(trace), "--preset", "tiny-cpu"])
    assert code == 0, output
    assert doc["fleet"]["instances"] == 2  # no header, no flag: the instances seen at the start


def test_a_captured_best_is_swept_and_sized_with_its_own_parameters() -> None:
    """The best replay may be the captured strategy (``NAME (captured)``): its knob sweep and
    sizing runs replay the strategy by name with its parameters, the knob changed."""
    config = strategy_config("prefix_hash", concurrency_threshold=7, prefix_length=2048)
    metrics = RunMetrics([0.1], [0.2], 1, 0, 1, 1.0, 1.0, 0.5, {}, {}, 0, {})
    best = StrategyRun("prefix_hash (captured)", metrics, 0.0, True, True)
    calls: list[tuple[str, object, str]] = []

    def run(name: str, cfg: object = None, label: str = "", *_: object) -> StrategyRun:
        calls.append((name, cfg, label))
        return best

    knob = sweep_knob(Chosen(best, "prefix_hash", config), run, "hit_rate")
    assert knob is not None
    assert knob["default"] == 7
    assert [v["value"] for v in knob["sweep"]] == [2, 5, 7, 10, 20, 50]  # type: ignore[attr-defined]
    assert {name for name, _, _ in calls} == {"prefix_hash"}
    assert all(cfg.prefix_length == 2048 for _, cfg, _ in calls)  # type: ignore[attr-defined]
    assert "prefix_hash (captured) concurrency_threshold=2" in [label for _, _, label in calls]


def _run(name: str, hit_rate: float, p95_ms: float) -> StrategyRun:
    """A replay whose P95 TTFT is ``p95_ms`` (20 TTFTs: the 95th percentile is the largest)."""
    ttft_s = [p95_ms / 2000.0] * 19 + [p95_ms / 1000.0]
    metrics = RunMetrics(ttft_s, ttft_s, 20, 0, 20, 1.0, 1.0, hit_rate, {}, {}, 0, {})
    return StrategyRun(name, metrics, 0.0, True, True)


def test_the_captured_strategy_is_kept_when_it_ties_the_best() -> None:
    """Tied with the best (hit rate within a tenth of a point, P95 within 1 %), the strategy the
    capture ran is recommended (before: whichever came first, a change for nothing); a real
    difference still wins over it."""
    first, captured = _run("prefix_hash", 0.792, 40.1), _run("prefix_affinity", 0.792, 40.3)
    assert best_of([first, captured], "p95_ttft_ms") is first
    assert best_of([first, captured], "p95_ttft_ms", prefer="prefix_affinity") is captured
    assert best_of([first, captured], "hit_rate", prefer="prefix_affinity") is captured
    behind = _run("prefix_affinity", 0.78, 40.3)  # 1.2 points less reuse: not a tie
    assert best_of([first, behind], "p95_ttft_ms", prefer="prefix_affinity") is first
    slower = _run("prefix_affinity", 0.792, 41.0)  # a P95 1.7 % longer: not a tie
    assert best_of([first, slower], "hit_rate", prefer="prefix_affinity") is first


def test_the_best_replay_for_each_objective() -> None:
    """The lowest P95 TTFT, its near-ties (1 %) broken by the hit rate; or the highest hit rate,
    its ties broken by the P95. A hit rate bought with a longer queue is not the best replay."""
    reuse, fast = _run("reuse", 0.30, 3000), _run("fast", 0.28, 2400)
    near, slower = _run("near", 0.281, 2410), _run("slower", 0.29, 2500)
    runs = [reuse, fast, near, slower]
    assert best_of(runs, "p95_ttft_ms") is near
    assert best_of([reuse, fast, slower], "p95_ttft_ms") is fast
    assert best_of(runs, "hit_rate") is reuse
    assert best_of([fast, _run("tie", 0.28, 2300)], "hit_rate").name == "tie"
    assert objective_for(None) == "p95_ttft_ms"
    assert objective_for(parse_target("hit_rate=0.5")) == "hit_rate"
    assert objective_for(parse_target("p95_ttft_ms=900")) == "p95_ttft_ms"
    assert parse_objective("hit_rate") == "hit_rate"
    with pytest.raises(ConfigError, match="--objective"):
        parse_objective("speed")


def test_the_knob_takes_the_objective_s_best_value() -> None:
    """Each value's replay differs: the hit rate and the P95 pick different values."""
    config = strategy_config("prefix_hash")
    by_value = {2: _run("a", 0.20, 900), 5: _run("b", 0.25, 1500), 10: _run("c", 0.22, 1000),
                20: _run("d", 0.21, 1100), 50: _run("e", 0.19, 1200)}  # fmt: skip

    def run(name: str, cfg: object = None, label: str = "", *_: object) -> StrategyRun:
        return by_value[int(getattr(cfg, "concurrency_threshold"))]  # noqa: B009

    best = Chosen(by_value[10], "prefix_hash", config)
    assert getattr(config, "concurrency_threshold") == 10  # noqa: B009
    fast = sweep_knob(best, run, "p95_ttft_ms")
    reuse = sweep_knob(best, run, "hit_rate")
    assert fast is not None
    assert reuse is not None
    assert (fast["value"], reuse["value"]) == (2, 5)
    by_value[2] = _run("as good as the default", 0.22, 1000)
    tied = sweep_knob(best, run, "p95_ttft_ms")
    assert tied is not None
    assert tied["value"] == 10  # a value no better than the default is not recommended


def test_the_recommendation_follows_the_objective(tmp_path: Path) -> None:
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, capture_lines(200, rate_rps=2.0))
    for args, objective in (([], "p95_ttft_ms"), (["--target", "hit_rate=0.99"], "hit_rate"),
                            (["--objective", "hit_rate"], "hit_rate")):  # fmt: skip
        code, output, doc = _doctor([str(trace), "--instances", "3", *args])
        assert code == 0, output
        assert doc["objective"] == objective
        strategies = doc["strategies"]
        best = strategies[doc["best_strategy"]]
        reuse = strategies[doc["best_replay_strategy"]]
        assert reuse["hit_rate"] == doc["waterfall"]["best_replay"]
        assert reuse["hit_rate"] == max(s["hit_rate"] for s in strategies.values())
        lowest_p95 = min(s["ttft_ms"]["p95"] for s in strategies.values())
        if objective == "p95_ttft_ms":
            assert best["ttft_ms"]["p95"] <= lowest_p95 * 1.01
        else:
            assert best["hit_rate"] == reuse["hit_rate"]
        first = doc["recommendations"][0]
        assert (first["strategy"], first["objective"]) == (doc["best_strategy"], objective)
    bad = CliRunner().invoke(app, ["doctor", str(trace), "--objective", "speed"])
    assert bad.exit_code == 2
    assert len(bad.output.strip().splitlines()) == 1
    assert "--objective" in bad.output


def test_largest_loss_skips_steps_not_measured() -> None:
    fall = {"ideal": 0.5, "fleet_ceiling": 0.45, "best_replay": 0.4, "captured_replay": None,
            "delivered": 0.1}  # fmt: skip
    loss = doctor.largest_loss(fall)
    assert loss is not None
    assert (loss.from_step, loss.to_step) == ("best_replay", "delivered")
    assert loss.loss == pytest.approx(0.3)
    assert doctor.largest_loss({"ideal": 0.2, "fleet_ceiling": 0.2}) is None


def _record(at_ms: float, instance: str | None, cached: int | None = None) -> TraceRecord:
    return TraceRecord(timestamp=at_ms, input_length=100, output_length=1, instance=instance,
                       engine_cached_tokens=cached)  # fmt: skip


def test_churn_windows_and_unprepared_share() -> None:
    records = [
        _record(0, "a"), _record(10_000, "b"), _record(100_000, "c", 50),
        _record(130_000, "c", 0), _record(170_000, "c"), _record(171_000, "a", 100),
    ]  # fmt: skip
    churn = doctor.churn_of(records)
    assert churn.joins == {"c": 100.0}
    assert churn.reason is None
    assert churn.windows() == [(100.0, 160.0)]
    assert doctor.unprepared_share(records, churn) == 2 / 6
    assert doctor.live_hit_rate_in(records, churn.windows()) == 50 / 200
    assert doctor.delivered(records) == 150 / 300
    plain = [_record(0, None), _record(1000, None)]
    assert doctor.churn_of(plain).reason is not None
    assert doctor.unprepared_share(plain, doctor.churn_of(plain)) is None
    assert doctor.delivered(plain) is None


def test_parse_target() -> None:
    assert parse_target("hit_rate=0.6").value == 0.6
    assert parse_target("p95_ttft_ms=800").metric == "p95_ttft_ms"
    for bad in ("hit_rate=2", "p95=1", "hit_rate=x"):
        with pytest.raises(ConfigError, match="--target"):
            parse_target(bad)


def test_doctor_errors_are_one_line(tmp_path: Path) -> None:
    missing = CliRunner().invoke(app, ["doctor", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2
    assert len(missing.output.strip().splitlines()) == 1
    assert "nope.jsonl" in missing.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\nnot json\n')
    result = CliRunner().invoke(app, ["doctor", str(bad)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert f"{bad}:2:" in result.output
    target = CliRunner().invoke(app, ["doctor", str(bad), "--target", "speed=1"])
    assert target.exit_code == 2
    assert "--target" in target.output


def _doctor_with_target(trace: Path) -> dict[str, Any]:
    code, output, doc = _doctor([str(trace), "--target", "hit_rate=0.99"])
    assert code == 0, output
    return doc


# How long doctor takes (under 60 s for 10,000 requests) is measured by `make bench-doctor`
# (bench/doctor_speed.py), not here: timings on a shared machine are noise.
@pytest.mark.slow
def test_doctor_runs_10000_requests(tmp_path: Path) -> None:
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, capture_lines(10_000))
    doc = _doctor_with_target(trace)
    assert doc["requests"] == 10_000


@pytest.mark.slow
def test_doctor_on_the_mooncake_trace() -> None:
    trace = resolve_traces_dir() / DEFAULT_TRACES["mooncake"]
    if not trace.is_file():
        pytest.skip(f"{trace} absent (the shared traces directory)")
    doc = _doctor_with_target(trace)
    fall = doc["waterfall"]
    assert isinstance(fall, dict)
    assert fall["ideal"] >= fall["fleet_ceiling"] >= fall["best_replay"] > 0
    assert doc["best_strategy"] == doc["best_replay_strategy"]  # the target's metric: hit rate
    # By default the lowest P95 TTFT: on this trace not the highest hit rate (docs/doctor.md), so
    # a pick that ignored the objective fails here (the generated captures tie the two)
    code, output, fast = _doctor([str(trace)])
    assert code == 0, output
    p95 = {name: s["ttft_ms"]["p95"] for name, s in fast["strategies"].items()}
    assert fast["best_strategy"] != fast["best_replay_strategy"]
    assert p95[fast["best_strategy"]] <= min(p95.values()) * 1.01


def test_requests_the_replayed_engines_reject_are_reported(tmp_path: Path) -> None:
    """They were left out of the replays' figures silently (a replay then read above ideal)."""
    trace = tmp_path / "long.jsonl"
    rows = [
        {"timestamp": t * 100, "input_length": n, "output_length": 4, "hash_ids": [t % 3, t]}
        for t, n in enumerate([600] * 20 + [40_000])
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = [str(trace), "--instances", "2", "--preset", "tiny-cpu"]
    code, output, doc = _doctor(args)
    assert code == 0, output
    assert {s["rejected"] for s in doc["strategies"].values()} == {1}
    table = CliRunner().invoke(app, ["doctor", *args])
    assert "warning: 1 of 21 requests cannot fit the replayed engines" in table.output
