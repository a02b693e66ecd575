"""`warmfleet serve --config gateway.yaml`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from warmfleet.core.errors import ConfigError


def serve_command(
    config: Path = typer.Option(..., "--config", "-c", help="Gateway document (kind: Gateway)."),  # noqa: B008
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
) -> None:
    """Run the OpenAI-compatible gateway. SIGHUP reloads the config file."""
    from warmfleet.gateway.server import StartedApp, run  # noqa: PLC0415

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def ready(started: StartedApp) -> None:
        print(f"warmfleet gateway listening on {started.url}", flush=True)

    try:
        run(config, ready)
    except ConfigError as err:
        print(f"invalid config:\n{err}", file=sys.stderr)
        raise typer.Exit(2) from err


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
