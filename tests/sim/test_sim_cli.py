"""`warmfleet sim` end to end through the CLI: table, JSON and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from warmfleet.bench import sim_cli

# the sim commands alone (the root app also wires other subsystems' commands)
app = typer.Typer()
sim_cli.register(app)


def test_sim_cli_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    report_dir = tmp_path / "report"
    args = [
        "sim", "--scenario", "gsp", "--requests", "60", "--preset", "tiny-cpu",
        "--instances", "3", "--strategies", "random,prefix_affinity", "--seed", "2",
        "--rate", "4", "--json", str(out), "--report", str(report_dir),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "prefix_affinity" in result.output
    report = json.loads(out.read_text())
    assert report["scenario"] == "gsp"
    assert report["seed"] == 2
    assert report["instances"] == 3
    assert set(report["strategies"]) == {"random", "prefix_affinity"}
    assert (report_dir / "report.json").read_bytes() == out.read_bytes()
    for name in ("ttft_cdf.png", "hit_rate_over_time.png", "share.png"):
        assert (report_dir / name).read_bytes()[:4] == b"\x89PNG"


def test_sim_cli_rejects_unknown_strategy_and_scenario(tmp_path: Path) -> None:
    runner = CliRunner()
    bad_strategy = runner.invoke(app, ["sim", "--scenario", "gsp", "--strategies", "nope"])
    assert bad_strategy.exit_code != 0
    bad_scenario = runner.invoke(app, ["sim", "--scenario", "nope", "--strategies", "random"])
    assert bad_scenario.exit_code == 2
    assert "unknown scenario" in bad_scenario.output


def test_sim_cli_rejects_rate_with_concurrency() -> None:
    """Closed loop has no offered rate: giving both is an error, not a silently ignored flag."""
    args = ["sim", "--scenario", "gsp", "--rate", "5", "--concurrency", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--rate" in result.output


def test_sim_cli_concurrency_runs_closed_loop_without_warnings(tmp_path: Path) -> None:
    """``--concurrency`` (saturation mode) re-times the scenario as a closed loop; pytest turns
    any warning (e.g. pydantic serialising an unvalidated field) into a failure."""
    out = tmp_path / "out.json"
    args = [
        "sim", "--scenario", "gsp", "--requests", "40", "--preset", "tiny-cpu",
        "--instances", "2", "--strategies", "random", "--concurrency", "3", "--json", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["closed_loop_concurrency"] == 3
    assert report["strategies"]["random"]["requests"]["completed"] == 40
