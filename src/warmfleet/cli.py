"""Command-line composition root: `warmfleet <command>`.

Each subsystem contributes its commands from its own module; this file only wires them, and
turns every command's expected failures (``warmfleet.core.failures``) into one line on stderr
and exit 2; ``warmfleet --debug <command>`` keeps their traceback.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import typer

from warmfleet.agent.cli import cache_app
from warmfleet.bench import conformance, doctor_cli, loadgen_cli, sim_cli, whatif_cli
from warmfleet.core.failures import DEBUG_META_KEY, EXPECTED_EXIT, expected_failure
from warmfleet.display import CommandGroup
from warmfleet.emulator import cli as emulator_cli
from warmfleet.gateway import cli as gateway_cli
from warmfleet.local import cli as local_cli
from warmfleet.operator import cli as fleet_cli


class LoudGroup(CommandGroup):
    """The root group: an expected failure of any command (a port in use, a missing file, a bad
    config, an unreachable URL, a refused permission) is one line on stderr and exit 2, unless
    ``--debug`` was given; any other exception is a bug and keeps its traceback."""

    def invoke(self, ctx: Any) -> Any:  # click's Context (typer >= 0.2x ships its own click)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as err:  # Ctrl-C: one line, and the shell's 128 + SIGINT
            if ctx.meta.get(DEBUG_META_KEY):
                raise
            typer.echo(f"{_failed_command(err, ctx)}: interrupted", err=True)
            raise typer.Exit(130) from None
        except Exception as err:
            line = expected_failure(err)
            if line is None or ctx.meta.get(DEBUG_META_KEY):
                raise
            typer.echo(f"{_failed_command(err, ctx)}: {line}", err=True)
            raise typer.Exit(EXPECTED_EXIT) from err


def _failed_command(err: BaseException, root: Any) -> str:
    """``warmfleet <command> [<subcommand>]`` that raised ``err``: the deepest command context
    in its traceback (the ``invoke`` frames of click, or typer's copy of it, hold one each)."""
    path = ""
    tb = err.__traceback__
    while tb is not None:
        frame_ctx = tb.tb_frame.f_locals.get("ctx")
        command_path = getattr(frame_ctx, "command_path", None)
        if isinstance(command_path, str) and hasattr(frame_ctx, "invoked_subcommand"):
            path = command_path
        tb = tb.tb_next
    names = path.split()[1:] or [root.invoked_subcommand or ""]
    return " ".join(["warmfleet", *filter(None, names)])


app = typer.Typer(
    cls=LoudGroup,
    no_args_is_help=True,
    add_completion=False,
    help="warmfleet: keep an LLM fleet warm.",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"warmfleet {version('warmfleet')}")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback of expected failures too (they are one line)."
    ),
    _show_version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """warmfleet: keep an LLM fleet warm."""
    ctx.meta[DEBUG_META_KEY] = debug


sim_cli.register(app)
doctor_cli.register(app)
conformance.register(app)
loadgen_cli.register(app)
gateway_cli.register(app)
app.command("sync-key")(gateway_cli.sync_key_command)
fleet_cli.register(app)
whatif_cli.register(fleet_cli.fleet_app)  # `warmfleet fleet whatif`: bench shows progress
local_cli.register(app)  # top-level `warmfleet up` and `warmfleet status`
emulator_cli.register(app)
app.add_typer(cache_app, name="cache")


def main() -> None:
    app()
