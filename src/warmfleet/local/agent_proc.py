"""One embedded node's agent, run as a child process (so killing it is real).

``python -m warmfleet.local.agent_proc --root DIR --budget BYTES --ready-file F``

It is the cache agent (``warmfleet.agent``: ``CacheManager`` and its status API) plus the fleet's
node protocol (``warmfleet.agent.fleet_node``) over HTTP, the embedded form of the
``warmfleet.dev/assigned-caches`` annotation: ``PUT /v1/fleet/assignments``
(``{"caches": [{"cache", "uri"}]}``: the complete set this node must hold) and
``GET /v1/fleet/caches`` (one report per assigned cache). Its mutating routes need the token
the fleet gives it in ``$WARMFLEET_EMBEDDED_AGENT_TOKEN`` (``procs.AGENT_TOKEN_ENV``; the
user's ``$WARMFLEET_AGENT_TOKEN`` plays no part).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from aiohttp import web

from warmfleet.agent.fleet_node import Assignment, FleetNode
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.peer_node import Peers
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.status_api import build_app
from warmfleet.agent.store import Store
from warmfleet.cache.config import CapacitySpec, DownloadSpec, NodeCacheSpec, StatusSpec
from warmfleet.core.errors import BadRequestError, WarmfleetError
from warmfleet.core.jsonio import loads_body
from warmfleet.local.procs import AGENT_TOKEN_ENV, serve_announced

log = logging.getLogger("warmfleet.embedded.agent")
TICK_S = 0.25


def _routes(app: web.Application, node: FleetNode, peers: Peers) -> None:
    async def put_assignments(request: web.Request) -> web.Response:
        body = loads_body(await request.read())  # bad JSON: a BadRequestError (400)
        try:
            caches = body.get("caches", []) if isinstance(body, dict) else None
            if not isinstance(caches, list):
                raise TypeError("'caches' must be a list")
            assigned = {str(c["cache"]): Assignment(str(c["uri"])) for c in caches}
            peers.configure(body.get("peers"))
        except (KeyError, TypeError, ValueError) as err:  # nothing assigned: a 400, not a 500
            raise BadRequestError(
                f"assignments: not {{caches: [{{cache, uri}}]}}: {err!r}"
            ) from err
        node.assigned = assigned
        return web.json_response({"assigned": sorted(node.assigned)})

    async def get_caches(_request: web.Request) -> web.Response:
        reports = await asyncio.to_thread(node.reports)
        return web.json_response({"pid": os.getpid(), "caches": reports, "peers": peers.figures})

    app.router.add_put("/v1/fleet/assignments", put_assignments)
    app.router.add_get("/v1/fleet/caches", get_caches)


async def serve(root: Path, budget_bytes: int, ready_file: Path) -> None:
    spec = NodeCacheSpec(
        root=str(root),
        capacity=CapacitySpec(budget=budget_bytes, high_watermark_frac=1.0, low_watermark_frac=1.0),
        download=DownloadSpec(concurrency=4, request_timeout_s=20.0),
        status=StatusSpec(port=0, token_env=AGENT_TOKEN_ENV),  # the fleet's token
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with SourceSet(spec.sources, spec.download) as sources:
        manager = CacheManager(Store(root), spec, sources)
        manager.recover()
        await manager.verify(full=False)
        async with asyncio.TaskGroup() as tg:
            await _run(manager, tg, stop, ready_file)


async def _logged(coro: Coroutine[Any, Any, Any]) -> None:
    """Background work never ends the agent (its task group would cancel everything)."""
    try:
        await coro
    except WarmfleetError as err:
        log.warning("background task failed: %s", err)
    except Exception:
        log.exception("background task failed")


async def _run(
    manager: CacheManager, tg: asyncio.TaskGroup, stop: asyncio.Event, ready_file: Path
) -> None:
    node = FleetNode(manager, tg)

    def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return tg.create_task(_logged(coro))  # a failed ``POST /v1/prefetch`` stays in it

    app = build_app(manager, spawn)
    peers = Peers(manager)
    peers.server.add_routes(app)
    _routes(app, node, peers)
    runner = await serve_announced(app, ready_file)
    # Renews the versions this node serves at the tracker; at the stop, leaves it.
    keeper = tg.create_task(_logged(peers.keep_offered(stop)))
    try:
        while not stop.is_set():
            try:
                await node.tick()
            except WarmfleetError as err:
                log.warning("tick failed: %s", err)
            try:
                await asyncio.wait_for(stop.wait(), TICK_S)
            except TimeoutError:
                continue
    finally:
        stop.set()  # whatever ended the loop: the keeper leaves the tracker and ends
        node.cancel()
        await runner.cleanup()
        await asyncio.wait([keeper])  # its reports sent (each within its timeout) ...
        await peers.aclose()  # ... before their HTTP session closes


def agent_command(
    root: Annotated[Path, typer.Option(help="the node's cache root (created if missing)")],
    budget: Annotated[int, typer.Option(help="cache budget in bytes")],
    ready_file: Annotated[Path, typer.Option(help="written with {pid, url} once serving")],
) -> None:
    """Run one node's cache agent and fleet node protocol until SIGINT or SIGTERM."""
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(message)s")
    root.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(root, budget, ready_file))


def main() -> None:
    typer.run(agent_command)


if __name__ == "__main__":
    main()
