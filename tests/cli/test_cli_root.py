"""The ``warmfleet`` command itself: ``--version`` and help."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from warmfleet.cli import app
from warmfleet.sim.scenario import BUILTIN_WORKLOADS


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"warmfleet {version('warmfleet')}"


def test_no_arguments_shows_the_commands() -> None:
    result = CliRunner().invoke(app, [])
    assert "serve" in result.output
    assert "--version" in result.output


def test_sim_help_lists_every_built_in_scenario() -> None:
    result = CliRunner().invoke(app, ["sim", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # rich wraps the option's help
    for name in BUILTIN_WORKLOADS:
        assert name in text, name
