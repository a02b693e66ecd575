"""Command-line composition root: `warmfleet <command>`.

Each subsystem contributes its commands from its own module; this file only wires them.
"""

from __future__ import annotations

from importlib.metadata import version

import typer

from warmfleet.agent.cli import cache_app
from warmfleet.bench import conformance, loadgen_cli, sim_cli
from warmfleet.emulator import cli as emulator_cli
from warmfleet.gateway import cli as gateway_cli
from warmfleet.local import cli as local_cli
from warmfleet.operator import cli as fleet_cli

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="warmfleet: keep an LLM fleet warm."
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"warmfleet {version('warmfleet')}")
        raise typer.Exit


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """warmfleet: keep an LLM fleet warm."""


sim_cli.register(app)
conformance.register(app)
loadgen_cli.register(app)
gateway_cli.register(app)
fleet_cli.register(app)
local_cli.register(app)  # top-level `warmfleet up` and `warmfleet status`
emulator_cli.register(app)
app.add_typer(cache_app, name="cache")


def main() -> None:
    app()
