"""`warmfleet sim` end to end through the CLI: table, JSON and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from warmfleet.bench import sim_cli
from warmfleet.edge import TRACES_DIR_ENV, resolve_traces_dir
from warmfleet.sim.workloads.traces import DEFAULT_TRACES

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


def _mooncake_dir(tmp_path: Path) -> Path:
    """A traces directory holding a tiny Mooncake trace under its default file name."""
    rows = [
        {"timestamp": 1000 * (i // 4), "input_length": 1200, "output_length": 8,
         "hash_ids": [i % 3, 100 + i, 200 + i]}
        for i in range(24)
    ]  # fmt: skip
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / DEFAULT_TRACES["mooncake"]).write_text(
        "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
    )
    return traces


def test_sim_cli_finds_traces_by_option_then_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI edge resolves the traces directory: ``--traces-dir``, else
    ``$WARMFLEET_TRACES_DIR``, else ../shared/traces from the current directory."""
    traces = _mooncake_dir(tmp_path)
    base = ["sim", "--scenario", "mooncake", "--preset", "tiny-cpu", "--instances", "2",
            "--strategies", "random"]  # fmt: skip
    runner = CliRunner()
    out = tmp_path / "a.json"
    given = runner.invoke(app, [*base, "--traces-dir", str(traces), "--json", str(out)])
    assert given.exit_code == 0, given.output
    assert given.output.startswith(f"workload: trace {traces / DEFAULT_TRACES['mooncake']}")
    assert json.loads(out.read_text())["requests"] == 24
    monkeypatch.setenv(TRACES_DIR_ENV, str(traces))
    from_env = runner.invoke(app, base)
    assert from_env.exit_code == 0, from_env.output
    monkeypatch.delenv(TRACES_DIR_ENV)
    monkeypatch.chdir(tmp_path)  # ../shared/traces does not exist from here
    absent = runner.invoke(app, [*base, "--requests", "30", "--json", str(out)])
    assert absent.exit_code == 0, absent.output  # the default file is absent: the equivalent
    assert absent.output.startswith("workload: synthetic equivalent of ")
    assert json.loads(out.read_text())["workload"].startswith("synthetic equivalent of ")
    missing = runner.invoke(app, [*base, "--trace", "nowhere.jsonl"])
    assert missing.exit_code == 2  # a file named by --trace must exist
    assert missing.output.startswith("error: trace: nowhere.jsonl")
    assert "cannot read" in missing.output
    assert len(missing.output.strip().splitlines()) == 1  # one line, not wrapped
    assert resolve_traces_dir() == Path("../shared/traces")


def test_sim_cli_table_fits_100_columns_wide_and_machine_formats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Piped with COLUMNS=100 the table fits and names what it left out; --wide shows every
    column; --format tsv and json parse (JSON is the report; other lines go to stderr)."""
    monkeypatch.setenv("COLUMNS", "100")
    base = [
        "sim", "--scenario", "gsp", "--requests", "30", "--preset", "tiny-cpu", "--instances", "2",
        "--strategies", "random,least_outstanding_requests", "--rate", "4",
    ]  # fmt: skip
    runner = CliRunner()
    table = runner.invoke(app, base)
    assert table.exit_code == 0, table.output
    assert max(len(line) for line in table.output.splitlines()) <= 100
    assert "least_outstanding_requests" in table.output
    assert "hidden:" in table.output
    wide = runner.invoke(app, [*base, "--wide"])
    for header in ("fleet ceil", "spills", "wall s", "out tok/s"):
        assert header in wide.output
    as_json = runner.invoke(app, [*base, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert set(report["strategies"]) == {"random", "least_outstanding_requests"}
    tsv = runner.invoke(app, [*base, "--format", "tsv"])
    lines = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert lines[0][:2] == ["strategy", "TTFT p50 ms"]
    assert lines[0][-1] == "wall s"
    assert [row[0] for row in lines[1:]] == ["random", "least_outstanding_requests"]
