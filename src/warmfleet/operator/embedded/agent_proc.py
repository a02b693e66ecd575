"""One embedded node's agent, run as a child process (so killing it is real).

``python -m warmfleet.operator.embedded.agent_proc --root DIR --budget BYTES --ready-file F``

It is the cache agent (``warmfleet.agent``: ``CacheManager`` and its status API) plus the fleet's
node protocol, the embedded form of the ``warmfleet.dev/assigned-caches`` annotation:
``PUT /v1/fleet/assignments`` (``{"caches": [{"cache", "uri"}]}``: the complete set this node
must hold) and ``GET /v1/fleet/caches`` (one report per assigned cache). Every tick it cheaply
re-verifies published data (a deleted cache is noticed and unpublished), prefetches every
assigned cache that is not ready (holder ``fleet:<cache>``), drops the holders of caches no longer
assigned and evicts everything unreferenced.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from warmfleet.agent.manager import CacheManager
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.status_api import build_app
from warmfleet.agent.store import Store
from warmfleet.cache.config import CapacitySpec, DownloadSpec, NodeCacheSpec, StatusSpec
from warmfleet.cache.state import ArtifactRecord, ArtifactState
from warmfleet.core.errors import WarmfleetError
from warmfleet.operator.embedded.procs import serve_announced

log = logging.getLogger("warmfleet.embedded.agent")
HOLDER = "fleet:"
TICK_S = 0.25


class FleetNode:
    """The assigned set and the per-tick work of one node."""

    def __init__(self, manager: CacheManager, tg: asyncio.TaskGroup) -> None:
        self.manager = manager
        self.assigned: dict[str, str] = {}  # cache -> origin URL
        self._tg = tg
        self._fetching: dict[str, asyncio.Task[None]] = {}

    async def tick(self) -> None:
        await self.manager.verify(full=False)
        records = self.manager.records()
        for cache, uri in self.assigned.items():
            if cache in self._fetching or self._usable(cache, records):
                continue
            task = self._tg.create_task(self._fetch(cache, uri))
            self._fetching[cache] = task
        dropped = False
        for rec in records:
            for holder in rec.refs:
                if holder.startswith(HOLDER) and holder[len(HOLDER) :] not in self.assigned:
                    self.manager.drop_ref(rec.key, holder)
                    dropped = True
        if dropped or any(r.name not in self.assigned for r in records):
            self.manager.gc(evict_all_unreferenced=True)

    async def _fetch(self, cache: str, uri: str) -> None:
        try:
            await self.manager.prefetch(uri, name=cache, holder=HOLDER + cache)
        except WarmfleetError as err:
            log.warning("prefetch of %s failed: %s", cache, err)
        finally:
            self._fetching.pop(cache, None)

    def _usable(self, cache: str, records: list[ArtifactRecord]) -> bool:
        return any(
            r.name == cache
            and r.state == ArtifactState.READY
            and HOLDER + cache in r.refs
            and self.manager.store.is_published(r.key)
            for r in records
        )

    def reports(self) -> dict[str, dict[str, Any]]:
        records = self.manager.records()
        statuses = {s.key: s for s in self.manager.statuses(records)}
        out: dict[str, dict[str, Any]] = {}
        for cache in self.assigned:
            mine = [r for r in records if r.name == cache]
            if not mine:
                out[cache] = {"state": "pending", "bytesDone": 0, "bytesTotal": 0}
                continue
            rec = max(mine, key=lambda r: r.created_s)
            status = statuses.get(rec.key)
            published = self.manager.store.is_published(rec.key)
            out[cache] = {
                "state": rec.state.value,
                "bytesDone": status.bytes_done if status else 0,
                "bytesTotal": rec.size_bytes,
                "healthy": rec.state != ArtifactState.READY or published,
                "message": rec.reason or "",
                "path": str(self.manager.store.object_dir(rec.key)) if published else "",
            }
        return out


def _routes(app: web.Application, node: FleetNode) -> None:
    async def put_assignments(request: web.Request) -> web.Response:
        body = await request.json()
        node.assigned = {str(c["cache"]): str(c["uri"]) for c in body.get("caches", [])}
        return web.json_response({"assigned": sorted(node.assigned)})

    async def get_caches(_request: web.Request) -> web.Response:
        return web.json_response(
            {"pid": os.getpid(), "caches": await asyncio.to_thread(node.reports)}
        )

    app.router.add_put("/v1/fleet/assignments", put_assignments)
    app.router.add_get("/v1/fleet/caches", get_caches)


async def serve(root: Path, budget_bytes: int, ready_file: Path) -> None:
    spec = NodeCacheSpec(
        root=str(root),
        capacity=CapacitySpec(budget=budget_bytes, high_watermark_frac=1.0, low_watermark_frac=1.0),
        download=DownloadSpec(concurrency=4, request_timeout_s=20.0),
        status=StatusSpec(port=0),
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


async def _run(
    manager: CacheManager, tg: asyncio.TaskGroup, stop: asyncio.Event, ready_file: Path
) -> None:
    node = FleetNode(manager, tg)

    def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return tg.create_task(coro)

    app = build_app(manager, spawn)
    _routes(app, node)
    runner = await serve_announced(app, ready_file)
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
        for task in list(node._fetching.values()):
            task.cancel()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--budget", type=int, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(message)s")
    args.root.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(args.root, args.budget, args.ready_file))


if __name__ == "__main__":
    main()
