"""The fleet's node protocol, transport-free: the caches assigned to this node, what a tick
does about them, and the per-cache reports.

The operator assigns the complete set of caches a node must hold (on Kubernetes, the Node's
``warmfleet.dev/assigned-caches`` annotation; embedded, ``PUT /v1/fleet/assignments``). Every
tick cheaply re-verifies published data (a deleted cache is noticed and unpublished), prefetches
every assigned cache that is not usable (holder ``fleet:<cache>``), stops the downloads of caches
no longer assigned, drops their holders and evicts everything unreferenced. A cache whose
prefetch failed before admission (no record: a refused listing, an unreachable origin) is
reported ``failed`` with the reason as its message; the failure is logged once per reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warmfleet.agent.manager import CacheManager
from warmfleet.agent.prefetch_failures import tracked_prefetch
from warmfleet.cache.state import ArtifactRecord, ArtifactState

log = logging.getLogger("warmfleet.agent.fleet")
HOLDER = "fleet:"


@dataclass(frozen=True)
class Assignment:
    uri: str
    revision: str | None = None


class FleetNode:
    """The assigned set and the per-tick work of one node."""

    def __init__(self, manager: CacheManager, tg: asyncio.TaskGroup) -> None:
        self.manager = manager
        self.assigned: dict[str, Assignment] = {}  # cache name -> its source
        self._tg = tg
        self._fetching: dict[str, asyncio.Task[None]] = {}
        self.on_fetched: Callable[[], None] | None = None  # called when a fetch ends

    async def tick(self) -> None:
        await self.manager.verify(full=False)
        for cache, task in list(self._fetching.items()):
            if cache not in self.assigned:  # taken off this node: stop downloading it
                task.cancel()
        records = self.manager.records()
        self.manager.failures.retain(HOLDER, self.assigned)
        for cache, source in self.assigned.items():
            if cache in self._fetching or self.usable(cache, records) is not None:
                continue
            task = self._tg.create_task(self._fetch(cache, source))
            self._fetching[cache] = task
        dropped = False
        for rec in records:
            for holder in rec.refs:
                if holder.startswith(HOLDER) and holder[len(HOLDER) :] not in self.assigned:
                    self.manager.drop_ref(rec.key, holder)
                    dropped = True
        if dropped or any(r.name not in self.assigned for r in records):
            self.manager.gc(evict_all_unreferenced=True)

    def cancel(self) -> None:
        for task in list(self._fetching.values()):
            task.cancel()

    async def _fetch(self, cache: str, source: Assignment) -> None:
        try:  # a failure is recorded (reported ``failed``) and logged once per reason
            await tracked_prefetch(
                self.manager, log, uri=source.uri, revision=source.revision, name=cache,
                holder=HOLDER + cache,
            )  # fmt: skip
        finally:
            self._fetching.pop(cache, None)
            if self.on_fetched is not None:
                self.on_fetched()

    def usable(self, cache: str, records: list[ArtifactRecord]) -> ArtifactRecord | None:
        """The ready, published, held version of ``cache`` (``None`` if there is none)."""
        for r in records:
            if (
                r.name == cache
                and r.state == ArtifactState.READY
                and HOLDER + cache in r.refs
                and self.manager.store.is_published(r.key)
            ):
                return r
        return None

    def reports(self, records: list[ArtifactRecord] | None = None) -> dict[str, dict[str, Any]]:
        """Each assigned cache's report, from ``records`` (None: the manager's now)."""
        if records is None:
            records = self.manager.records()
        statuses = {s.key: s for s in self.manager.statuses(records)}
        out: dict[str, dict[str, Any]] = {}
        for cache in self.assigned:
            mine = [r for r in records if r.name == cache]
            failure = self.manager.failures.get(HOLDER + cache)
            if not mine and failure is not None:  # refused before admission: no record
                out[cache] = {"state": "failed", "bytesDone": 0, "bytesTotal": 0,
                              "healthy": True, "message": failure.reason, "path": ""}  # fmt: skip
                continue
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
