"""The reference point of issue 3's overhead criterion: a bare aiohttp + uvloop pass-through
proxy, round robin over its upstreams, no routing logic, no limits, no metrics.

`make bench-peers` runs it beside the routers so every router's CPU per request can be read
against it in the same run (the issue's limit is 0.30 ms where this proxy measured 0.22 ms; the
machine's speed drifts, the ratio much less). ``tests/gateway/overhead_probe.py`` uses it too.

    python -m warmfleet.bench.passthrough --port 8100 http://127.0.0.1:8001 http://127.0.0.1:8002

Prints its URL on stdout once listening; ``GET /health`` answers 200.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any

import aiohttp
import typer
import uvloop
from aiohttp import web

_ROUTES = ("/v1/chat/completions", "/v1/completions")


def build_app(upstreams: Sequence[str], session: aiohttp.ClientSession) -> web.Application:
    """Forward each POST body to the next upstream; relay the answer (streamed if chunked)."""
    order = itertools.cycle(upstreams)

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.post(next(order) + request.path, data=body, headers=headers) as up:
            out_headers = {"Content-Type": up.headers.get("Content-Type", "application/json")}
            if up.content_length is not None:
                return web.Response(body=await up.read(), status=up.status, headers=out_headers)
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    for path in _ROUTES:
        app.router.add_post(path, relay)
    app.router.add_get("/health", health)
    return app


async def serve(host: str, port: int, upstreams: Sequence[str], timeout_s: float) -> None:
    """Serve until cancelled."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        runner = web.AppRunner(
            build_app(upstreams, session), access_log=None, handler_cancellation=True
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, backlog=1024)
            await site.start()
            print(f"http://{host}:{runner.addresses[0][1]}", flush=True)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


ServeFn = Callable[[str, int, Sequence[str], float], Coroutine[Any, Any, None]]


def run_proxy_cli(serve_fn: ServeFn) -> None:
    """The command line of a reference proxy: ``[--host H] [--port P] [--timeout-s T] URL...``."""

    def proxy_command(
        upstreams: Annotated[
            list[str], typer.Argument(help="base URLs, e.g. http://127.0.0.1:8001")
        ],
        host: Annotated[str, typer.Option(help="listen address")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="listen port (0: a free one)")] = 0,
        timeout_s: Annotated[float, typer.Option(help="per upstream answer")] = 60.0,
    ) -> None:
        """Relay POSTs round robin over UPSTREAMS; prints its URL once listening."""
        try:
            uvloop.run(serve_fn(host, port, [u.rstrip("/") for u in upstreams], timeout_s))
        except OSError as err:  # e.g. the port is taken (the message says so: bench retries)
            print(f"cannot serve on {host}:{port}: {err}", file=sys.stderr)
            raise typer.Exit(1) from err

    typer.run(proxy_command)


def main() -> None:
    run_proxy_cli(serve)


if __name__ == "__main__":
    main()
