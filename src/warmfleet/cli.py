"""Command-line composition root: `warmfleet <command>`.

Each subsystem contributes its commands from its own module; this file only wires them.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="warmfleet: keep an LLM fleet warm.")


def main() -> None:
    app()
