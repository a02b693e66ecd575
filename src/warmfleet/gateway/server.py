"""Running a gateway: bind, serve with uvloop, reload on SIGHUP, stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warmfleet.core.errors import ConfigError
from warmfleet.gateway.app import GatewayApp, create_app
from warmfleet.gateway.config import load_gateway_config
from warmfleet.gateway.http.memory import HeapTrimmer, PeriodicTrim
from warmfleet.gateway.runtime import Gateway

log = logging.getLogger(__name__)

# A proxied request frees almost everything it allocates by reference counting, but the default
# young-generation threshold (700 net container allocations) is crossed many times a second by
# the objects of the requests *in flight* (~100 containers each), so the collector keeps
# rescanning live requests: ~5 % of the gateway's CPU at c=32. 20,000 is crossed only by a real
# backlog of garbage (a few MB at most).
GC_GEN0_THRESHOLD = 20_000


@dataclass(frozen=True)
class StartedApp:
    app: GatewayApp
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def gateway(self) -> Gateway:
        return self.app.gateway

    async def stop(self) -> None:
        """Stop listening, let requests in progress finish (up to 5 s), stop the runtime."""
        try:
            await self.app.server.stop(grace_s=5.0)
        finally:
            await self.app.gateway.stop()


async def start_app(
    app: GatewayApp, host: str = "127.0.0.1", port: int = 0, *, host_field: str = "spec.listen.host"
) -> StartedApp:
    """Start the runtime, then serve on host:port (0 = a free port). A handler is cancelled
    when its client disconnects (so the upstream request is cancelled too). ``host_field``:
    the setting an unresolvable host is reported under (the caller's document's)."""
    await app.gateway.start()
    try:
        bound_port = await app.server.start(host, port)
    except socket.gaierror as err:  # its message names neither the host nor the setting
        await app.gateway.stop()
        raise ConfigError(f"{host_field}: cannot resolve {host!r}: {err.strerror}") from err
    except BaseException:
        await app.gateway.stop()
        raise
    return StartedApp(app, host, bound_port)


def tune_gc_for_serving(gen0_threshold: int = GC_GEN0_THRESHOLD) -> None:
    """Freeze what startup allocated (config, routers, prometheus: never garbage) so
    full collections skip it, and collect young objects only past ``gen0_threshold``. Called by
    ``serve`` (a gateway process), never by ``start_app`` (tests embed apps in their process)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def tune_memory_for_serving() -> PeriodicTrim | None:
    """glibc only (``memory.py``): freed heap pages go back to the system after a burst of
    large bodies. The returned trim runs on the loop until stopped; None on another C
    library."""
    trimmer = HeapTrimmer.for_this_process()
    if trimmer is None:
        return None
    trim = PeriodicTrim(trimmer)
    trim.start()
    return trim


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop


async def serve(
    config_path: Path,
    ready: Callable[[StartedApp], None] | None = None,
    *,
    tune_gc: bool = True,
) -> None:
    """Serve until SIGINT/SIGTERM; SIGHUP re-reads ``config_path`` (invalid: logged, old kept).
    The signal handlers are in place from the start to the end of the graceful stop: a SIGHUP
    while starting is applied once started, one while stopping reloads (never kills).
    ``tune_gc``: ``tune_gc_for_serving`` (False: Python's defaults, for comparison)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    started: StartedApp | None = None
    trim: PeriodicTrim | None = None
    missed_reload = False

    def on_sighup() -> None:
        nonlocal missed_reload
        if started is None:
            missed_reload = True
        else:
            started.gateway.reload("sighup")

    handlers = {signal.SIGINT: stop.set, signal.SIGTERM: stop.set, signal.SIGHUP: on_sighup}
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    try:
        config = load_gateway_config(config_path)
        app = create_app(config, config_path=config_path)
        listen = config.spec.listen
        started = await start_app(app, listen.host, listen.port)
        try:
            if missed_reload:  # the file may have changed after it was read
                started.gateway.reload("sighup")
            if tune_gc:
                tune_gc_for_serving()
            trim = tune_memory_for_serving()
            log.info("warmfleet gateway listening on %s", started.url)
            if ready is not None:
                ready(started)
            await stop.wait()
        finally:
            if trim is not None:
                trim.stop()
            await started.stop()
    finally:
        for sig in handlers:
            loop.remove_signal_handler(sig)


def run(
    config_path: Path,
    ready: Callable[[StartedApp], None] | None = None,
    *,
    tune_gc: bool = True,
) -> None:
    """Blocking entry point (uvloop when available)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(config_path, ready, tune_gc=tune_gc))
