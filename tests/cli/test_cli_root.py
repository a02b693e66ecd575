"""The ``warmfleet`` command itself: ``--version`` and help."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from warmfleet.cli import app


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"warmfleet {version('warmfleet')}"


def test_no_arguments_shows_the_commands() -> None:
    result = CliRunner().invoke(app, [])
    assert "serve" in result.output
    assert "--version" in result.output
