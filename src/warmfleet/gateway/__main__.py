"""`python -m warmfleet.gateway --config gateway.yaml`: the gateway alone, without the other
subcommands' imports (same behaviour as `warmfleet serve`)."""

from __future__ import annotations

import typer

from warmfleet.gateway.cli import serve_command

if __name__ == "__main__":
    typer.run(serve_command)
