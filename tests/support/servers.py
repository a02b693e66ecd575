"""An aiohttp app served on 127.0.0.1 for a test: a free port, its base URL, stopped on exit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def app_serving(
    app: web.Application, **runner: Any
) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """Serve ``app`` on a free port of 127.0.0.1 (``runner``: ``web.AppRunner`` options): yields
    the base URL and the runner (a test may stop it early with ``runner.cleanup()``, e.g. to see
    connections refused)."""
    app_runner = web.AppRunner(app, **runner)
    await app_runner.setup()
    try:
        await web.TCPSite(app_runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{app_runner.addresses[0][1]}", app_runner
    finally:
        await app_runner.cleanup()


@asynccontextmanager
async def serving(routes: Mapping[str, Handler]) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """``app_serving`` of an app that answers GET ``routes`` (path -> handler)."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    async with app_serving(app) as served:
        yield served
