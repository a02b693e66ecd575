"""Running a gateway: bind, serve with uvloop, reload on SIGHUP, stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from warmfleet.gateway.app import GATEWAY_KEY, create_app
from warmfleet.gateway.config import load_gateway_config
from warmfleet.gateway.runtime import Gateway

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartedApp:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def gateway(self) -> Gateway:
        return self.runner.app[GATEWAY_KEY]

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_app(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> StartedApp:
    """Serve ``app`` on host:port (0 = a free port). Handlers are cancelled when their client
    disconnects (so the upstream request is cancelled too); no access log on the hot path."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    bound_port = int(runner.addresses[0][1])
    return StartedApp(runner, host, bound_port)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop


async def serve(config_path: Path, ready: Callable[[StartedApp], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM; SIGHUP re-reads ``config_path`` (invalid: logged, old kept)."""
    config = load_gateway_config(config_path)
    app = create_app(config, config_path=config_path)
    listen = config.spec.listen
    started = await start_app(app, listen.host, listen.port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: started.gateway.reload("sighup"))
    log.info("warmfleet gateway listening on %s", started.url)
    if ready is not None:
        ready(started)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await started.stop()


def run(config_path: Path, ready: Callable[[StartedApp], None] | None = None) -> None:
    """Blocking entry point (uvloop when available)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(config_path, ready))
