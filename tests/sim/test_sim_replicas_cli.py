"""`warmfleet sim --gateway-replicas ... --sync-delay-ms ...`: the replicas x delay table and
its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from warmfleet.bench import sim_cli

app = typer.Typer()
sim_cli.register(app)

BASE = [
    "sim", "--scenario", "multi-round-qa", "--preset", "tiny-cpu", "--instances", "3",
    "--requests", "40", "--strategies", "prefix_affinity",
]  # fmt: skip


def test_the_sweep_writes_every_cell_with_its_difference_from_one_replica(tmp_path: Path) -> None:
    out = tmp_path / "replicas.json"
    args = [*BASE, "--gateway-replicas", "1,2,4", "--sync-delay-ms", "0,10,none"]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "no sync" in result.output
    assert "10 ms" in result.output
    assert all(len(line) <= 100 for line in result.output.splitlines())
    report = json.loads(out.read_text())
    assert report["scenario"] == "multi-round-qa"
    assert report["requests"] == 40
    assert report["gateway_replicas"] == [1, 2, 4]
    assert report["sync_delays_ms"] == [0.0, 10.0, None]
    cells = report["strategies"]["prefix_affinity"]
    assert [(c["gateway_replicas"], c["sync_delay_ms"]) for c in cells] == [
        (n, d) for n in (1, 2, 4) for d in (0.0, 10.0, None)
    ]
    one = cells[0]["hit_rate"]
    for cell in cells:
        assert cell["conserved"] is True
        assert cell["synced"] is (cell["sync_delay_ms"] is not None)
        assert cell["metrics"]["requests"]["completed"] == 40
        assert cell["hit_rate_vs_one_points"] == pytest.approx(
            100 * (cell["hit_rate"] - one), abs=0.01
        )
    assert {c["hit_rate"] for c in cells if c["gateway_replicas"] == 1} == {one}
    unsynced = [c["hit_rate"] for c in cells if c["gateway_replicas"] == 4 and not c["synced"]]
    assert unsynced[0] < one


def test_one_replica_count_and_delay_is_a_one_cell_table(tmp_path: Path) -> None:
    out = tmp_path / "cell.json"
    args = [*BASE, "--gateway-replicas", "2", "--sync-delay-ms", "1", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cells = json.loads(out.read_text())["strategies"]["prefix_affinity"]
    assert [(c["gateway_replicas"], c["sync_delay_ms"]) for c in cells] == [(2, 1.0)]
    assert cells[0]["hit_rate_vs_one_points"] is None  # no one-replica run to compare with


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--gateway-replicas", "0", "--gateway-replicas"),
        ("--gateway-replicas", "two", "--gateway-replicas"),
        ("--sync-delay-ms", "-1", "--sync-delay-ms"),
        ("--sync-delay-ms", "soon", "--sync-delay-ms"),
    ],
)
def test_bad_replica_options_are_named(option: str, value: str, message: str) -> None:
    result = CliRunner().invoke(app, [*BASE, option, value])
    assert result.exit_code == 2
    assert message in result.output


def test_plots_are_for_one_gateway(tmp_path: Path) -> None:
    args = [*BASE, "--gateway-replicas", "2", "--report", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--report" in result.output
