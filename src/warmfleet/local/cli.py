"""``warmfleet up fleet.yaml`` and ``warmfleet status``.

Their expected failures (a bad fleet file, a port in use, a child that cannot start) reach the
root command, which prints them as one line and exits 2.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from warmfleet.bench.progress import Activity
from warmfleet.core.errors import ConfigError, NotFoundError
from warmfleet.display import FormatOpt, OutputFormat, WideOpt, output_console
from warmfleet.local.config import LocalFleet, load_fleet
from warmfleet.local.events import FleetLog
from warmfleet.local.fleet import EmbeddedFleet
from warmfleet.local.state import STATE_FILE, not_running_reason, read_state, render
from warmfleet.local.state_view import check_state

log = logging.getLogger("warmfleet.embedded")
DEFAULT_WORKDIR = Path(".warmfleet/fleet")


async def _watch_file(fleet: EmbeddedFleet, path: Path, stop: asyncio.Event) -> None:
    """Re-read the endpoints of ``fleet.yaml`` when it changes (a new revision rolls over, an
    endpoint no longer listed is deleted)."""
    mtime = path.stat().st_mtime_ns
    while not stop.is_set():
        await asyncio.sleep(1.0)
        try:
            now = path.stat().st_mtime_ns
            if now == mtime:
                continue
            mtime = now
            config = load_fleet(path)
        except (OSError, ConfigError) as err:
            log.warning("fleet file not applied, the running config stays: %s", err)
            continue
        fleet.apply_endpoints(config.spec.endpoints)
        fleet.event("fleet_file_reloaded", endpoints=[e.name for e in config.spec.endpoints])


async def run_up(config: LocalFleet, path: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    started = False

    def on_signal() -> None:
        stop.set()
        if not started and main is not None:  # still starting: interrupt the start itself
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    with Activity() as activity:
        try:
            async with (
                EmbeddedFleet(config, FleetLog(activity)) as fleet,
                asyncio.TaskGroup() as tg,
            ):
                started = True
                assert fleet.gateway is not None
                url, workdir = fleet.gateway.url, fleet.workdir
                print(f"warmfleet up: gateway {url}, state {workdir}", flush=True)
                if path is not None:
                    tg.create_task(_watch_file(fleet, path, stop))
                await fleet.run(stop)
                stop.set()
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
            # stopped by a signal while starting: __aenter__ stopped what was started


def up(
    fleet_file: Annotated[
        Path, typer.Argument(help="kind: LocalFleet document", readable=False)
    ],  # read by load_fleet: a refused read is its one line, not click's box
    workdir: Annotated[
        Path | None, typer.Option(help="override spec.workdir", readable=False)
    ] = None,
) -> None:
    """Run the whole fleet on this machine: origin, node agents, engines, gateway, reconciler.

    What happens is printed as it happens (caches filling with their progress, nodes
    ready, replicas started and ready, the gateway switched, old caches deleted): a live display
    on a terminal, plain lines when piped.

    Edit the endpoints in FLEET_FILE while it runs (e.g. a new model revision) to roll over."""
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = load_fleet(fleet_file)
    except ConfigError as err:
        raise ConfigError(f"invalid fleet file: {err}") from err
    if workdir is not None:
        spec = config.spec.model_copy(update={"workdir": str(workdir)})
        config = config.model_copy(update={"spec": spec})
    asyncio.run(run_up(config, fleet_file))


def status(
    fleet_file: Annotated[
        Path | None, typer.Argument(help="the fleet file given to `up`", readable=False)
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="the fleet's workdir", readable=False)
    ] = None,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Show the running fleet's endpoints, caches, nodes and replicas.

    Exit 1 (one line on stderr) when the fleet is not running: no state, stopped, its process
    gone or its gateway not listening; exit 2 when its state is not what `up` writes."""
    if workdir is None:
        workdir = Path(load_fleet(fleet_file).spec.workdir) if fleet_file else DEFAULT_WORKDIR
    try:
        doc = read_state(workdir)
    except NotFoundError as err:
        _not_running(str(err))
    reason = not_running_reason(doc)
    if reason is not None:
        _not_running(f"{reason} (last state in {workdir / STATE_FILE})")
    check_state(doc, workdir / STATE_FILE)
    render(doc, output_console(), fmt, wide)


def _not_running(why: str) -> NoReturn:
    typer.echo(f"warmfleet status: the fleet is not running: {why}", err=True)
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("status")(status)
