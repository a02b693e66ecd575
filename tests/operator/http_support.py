"""A local HTTP server on 127.0.0.1 for the operator tests (gateway /metrics, an API stub)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(routes: Mapping[str, Handler]) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """GET ``routes`` on a free port: yields the base URL and the runner (a test may stop it
    early with ``runner.cleanup()``, e.g. to see connections refused)."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", runner
    finally:
        await runner.cleanup()
