"""The long-running node agent: keeps the configured artifacts cached and serves status; with
``spec.kubernetes``, it also serves the caches its Node is assigned (``kube_node``).

Every ``reconcile_interval_s`` it prefetches each configured artifact with the holder
``config:<name>`` (a changed source resolves to a new key; once that version is ready the holder
moves to it and the old version becomes evictable), drops holders of artifacts removed from
the config and runs watermark GC. A prefetch that fails is recorded
(``agent.prefetch_failures``: shown by the status API even without a record) and logged once
per reason, not at every pass. On start it resets downloads nobody holds and re-verifies the
published cache cheaply (sizes + markers).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from warmfleet.agent.fleet_node import FleetNode
from warmfleet.agent.kube_node import KubeNodeSync
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.prefetch_failures import tracked_prefetch
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.status_api import build_app
from warmfleet.agent.store import Store
from warmfleet.cache.config import ImageArtifactSpec, NodeCacheConfig
from warmfleet.core.errors import WarmfleetError

log = logging.getLogger("warmfleet.agent")
CONFIG_HOLDER = "config:"
QUIET_PATHS = frozenset({"/healthz", "/metrics"})  # polled: logged at DEBUG only


class AccessLog(AbstractAccessLogger):
    """One line per request the status API served (INFO; probes and scrapes at DEBUG)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        level = logging.DEBUG if request.path in QUIET_PATHS else logging.INFO
        self.logger.log(
            level, "served %s %s -> %d in %.1f ms", request.method, request.path_qs,
            response.status, time * 1000,
        )  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class NodeAgent:
    def __init__(self, config: NodeCacheConfig) -> None:
        self.config = config
        self.spec = config.spec
        self.stop_event = asyncio.Event()
        self.port = 0
        self.reconciles = 0
        self.kube: KubeNodeSync | None = None  # with ``spec.kubernetes``, once running

    async def run(self) -> None:
        store = Store(Path(self.spec.root))
        async with SourceSet(self.spec.sources, self.spec.download) as sources:
            manager = CacheManager(store, self.spec, sources)
            manager.recover()
            bad = [r for r in await manager.verify(full=False) if not r.ok]
            for res in bad:
                log.warning("unpublished %s at start: %s", res.key[:16], res.reason)
            await self._serve(manager)

    async def _serve(self, manager: CacheManager) -> None:
        tasks: set[asyncio.Task[Any]] = set()
        async with asyncio.TaskGroup() as tg:

            def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
                task = tg.create_task(self._guard(coro))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                return task

            runner = web.AppRunner(
                build_app(manager, spawn),
                access_log_class=AccessLog,
                access_log=logging.getLogger("warmfleet.agent.http"),
            )
            await runner.setup()
            site = web.TCPSite(runner, self.spec.status.host, self.spec.status.port)
            await site.start()
            server = site._server
            self.port = server.sockets[0].getsockname()[1] if server else 0  # type: ignore[attr-defined]
            self._write_discovery(manager.store.root)
            log.info("serving the cache %s; status API on port %d", manager.store.root, self.port)
            spawn(self._reconcile_loop(manager))
            fleet: FleetNode | None = None
            if self.spec.kubernetes is not None:
                fleet = FleetNode(manager, tg)
                self.kube = KubeNodeSync(fleet, self.spec.kubernetes)
                spawn(self.kube.run())
            try:
                await self.stop_event.wait()
            finally:
                if fleet is not None:
                    fleet.cancel()
                for task in list(tasks):
                    task.cancel()
                await runner.cleanup()

    def _write_discovery(self, root: Path) -> None:
        doc = {"pid": os.getpid(), "host": self.spec.status.host, "port": self.port}
        tmp = root / "agent.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(root / "agent.json")

    async def _guard(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Background work never takes the agent down; failures land in the index/status."""
        try:
            await coro
        except WarmfleetError as err:
            log.warning("background task failed: %s", err)
        except Exception:  # an OSError, a bug: logged, the agent keeps serving
            log.exception("background task failed")

    async def _reconcile_loop(self, manager: CacheManager) -> None:
        while not self.stop_event.is_set():
            try:
                await self.reconcile_once(manager)
            except Exception:  # a bug or a disk error: the next pass tries again
                log.exception("node agent: a reconcile pass failed")
            try:
                await asyncio.wait_for(self.stop_event.wait(), self.spec.reconcile_interval_s)
            except TimeoutError:
                continue

    async def reconcile_once(self, manager: CacheManager) -> None:
        wanted = {a.name for a in self.spec.artifacts}
        for art in self.spec.artifacts:
            if isinstance(art, ImageArtifactSpec):
                uri, revision = f"oci://{art.ref}", None
            else:
                uri, revision = art.uri, art.revision
            rec = await tracked_prefetch(
                manager,
                log,
                uri=uri,
                revision=revision,
                name=art.name,
                holder=CONFIG_HOLDER + art.name,
                pin=art.pin,
            )
            if rec is None:  # failed: recorded for the status API, logged once per reason
                continue
            for old in manager.records():  # a config pin follows the current version
                if art.pin and old.name == art.name and old.key != rec.key and old.pinned:
                    manager.set_pinned(old.key, False)
        manager.failures.retain(CONFIG_HOLDER, wanted)
        for rec in manager.records():
            for holder in rec.refs:
                if holder.startswith(CONFIG_HOLDER) and holder[len(CONFIG_HOLDER) :] not in wanted:
                    manager.drop_ref(rec.key, holder)
        manager.gc()
        self.reconciles += 1
