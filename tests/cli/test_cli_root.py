"""The ``warmfleet`` command itself: ``--version`` and help."""

from __future__ import annotations

import itertools
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


def _descriptions(args: list[str]) -> list[list[str]]:
    """The description column of ``warmfleet ARGS --help``'s command list: each command's lines."""
    done = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "100"}, terminal_width=100)
    assert done.exit_code == 0, done.output
    panel = done.output[done.output.index("Commands") :]
    rows: list[list[str]] = []
    for line in panel.splitlines()[1:-1]:
        name, _, text = line.strip("│").strip(" ").partition("  ")
        if not line.startswith("│ " + " " * 4):  # a new command (its name in the first column)
            rows.append([text.strip()])
        elif rows and name.strip():
            rows[-1].append(line.strip("│ "))
    return rows


def test_command_lists_rewrap_each_description_as_one_paragraph() -> None:
    """A docstring's line breaks do not show in the list (``doctor``'s once cut after "ideal"):
    a description's line ends early only when the next word would not fit."""
    for args in ([], ["cache"], ["fleet"]):
        rows = _descriptions(args)
        assert len(rows) >= 3, args
        width = max(len(line) for row in rows for line in row)
        for row in rows:
            for line, after in itertools.pairwise(row):
                assert len(line) + 1 + len(after.split()[0]) > width, row
