"""The node protocol on Kubernetes: the agent's side of the Node annotations.

The agent watches its own Node (``kube.watch.ListWatch``, ``fieldSelector=metadata.name``: one
watch instead of a read per interval). At every change of the Node, when a fetch ends, and
every ``interval_s`` otherwise, it syncs: take the caches assigned to the Node
(``warmfleet.dev/assigned-caches``); let ``FleetNode`` fill, hold and evict; keep a view
``<root>/<cache>/`` (``CacheLinks``) exactly for the usable ones; write the reports to
``warmfleet.dev/cache-status`` when they changed. An assignment for a hostPath other than the
one mounted at the agent's root cannot be served here: it is reported failed, not fetched. An
unreadable assignment annotation keeps the previous assignments; an API error is logged once
per streak and retried. Every call has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import aiohttp

from warmfleet.agent.cache_links import CacheLinks, valid_cache_name
from warmfleet.agent.fleet_node import Assignment, FleetNode
from warmfleet.api.names import ANN_ASSIGNED, ANN_CACHE_STATUS
from warmfleet.cache.config import KubernetesNodeSpec
from warmfleet.cache.state import ArtifactRecord
from warmfleet.core.errors import WarmfleetError
from warmfleet.kube.access import KubeAccess, KubeAccessError, api_loop, json_or_raise
from warmfleet.kube.watch import ListWatch, object_name

log = logging.getLogger("warmfleet.agent.kube")
_MERGE_PATCH = "application/merge-patch+json"
# what a sync may raise and the next interval retries (API, network, cache, file system)
_RETRIED = (WarmfleetError, aiohttp.ClientError, TimeoutError, ValueError, OSError)


def parse_assignments(
    text: str | None, host_path: str
) -> tuple[dict[str, Assignment], dict[str, str]]:
    """The annotation -> (servable assignments, refused cache -> why). Raises ``ValueError``
    if the annotation is not a JSON list (the caller keeps the previous assignments)."""
    if text is None:
        return {}, {}
    entries = json.loads(text)
    if not isinstance(entries, list):
        raise ValueError(f"{ANN_ASSIGNED} is not a JSON list")
    servable: dict[str, Assignment] = {}
    refused: dict[str, str] = {}
    for entry in entries:
        cache = entry.get("cache") if isinstance(entry, dict) else None
        if not isinstance(cache, str) or not valid_cache_name(cache):
            log.warning("ignoring an assignment without a usable cache name: %r", entry)
            continue
        uri, revision, path = entry.get("uri"), entry.get("revision"), entry.get("hostPath")
        if not isinstance(uri, str) or not uri:
            refused[cache] = "the assignment has no uri"
        elif path is not None and str(path).rstrip("/") != host_path.rstrip("/"):
            refused[cache] = f"hostPath {path} is not this agent's cache directory ({host_path})"
        else:
            servable[cache] = Assignment(uri, str(revision) if revision is not None else None)
    return servable, refused


class KubeNodeSync:
    def __init__(self, node: FleetNode, spec: KubernetesNodeSpec) -> None:
        self.node = node
        self.spec = spec
        self.access = KubeAccess(spec)
        self.links = CacheLinks(node.manager.store)
        self.refused: dict[str, str] = {}
        self.errors = 0
        self._reported: str | None = None
        self._annotations: dict[str, Any] | None = None  # None: the Node not seen yet
        self._changed = asyncio.Event()  # the Node changed or a fetch ended: sync now
        node.on_fetched = self._changed.set

    def node_name(self) -> str:
        name = self.spec.node_name or os.environ.get("NODE_NAME")
        if not name:
            raise KubeAccessError("kubernetes.node_name is not set and $NODE_NAME is unset")
        return name

    async def run(self) -> None:
        name = self.node_name()
        watch = ListWatch(
            self.spec,
            lambda: "/api/v1/nodes",
            on_change=lambda nodes: self._node_changed(nodes.get(name)),
            on_error=self._failed,
            keep=lambda obj: object_name(obj) == name,
            selectors={"fieldSelector": f"metadata.name={name}"},
            retry_interval_s=self.spec.interval_s,
        )
        url = f"/api/v1/nodes/{name}"
        async with asyncio.TaskGroup() as tg:
            tg.create_task(watch.run())
            tg.create_task(
                api_loop(
                    self.access,
                    lambda http: self._sync_when_due(http, url),
                    self._failed,
                    retried=_RETRIED,
                    retry_interval_s=self.spec.interval_s,
                )
            )

    def _node_changed(self, node: Mapping[str, Any] | None) -> None:
        meta = node.get("metadata") if node is not None else None
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        self._annotations = annotations if isinstance(annotations, dict) else {}
        self._changed.set()

    def _failed(self, err: BaseException, first: bool) -> None:
        self.errors += 1
        if first:
            log.error(
                "node sync failed (retrying with backoff from %.1f s): %s",
                self.spec.interval_s,
                err,
            )

    async def _sync_when_due(self, http: aiohttp.ClientSession, path: str) -> None:
        """Wait for a change of the Node or ``interval_s``, then sync (once the Node is known)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), self.spec.interval_s)
        self._changed.clear()
        if self._annotations is not None:
            await self.sync_once(http, path, self._annotations)

    async def sync_once(
        self, http: aiohttp.ClientSession, path: str, annotations: Mapping[str, Any]
    ) -> None:
        self.node.assigned, self.refused = parse_assignments(
            annotations.get(ANN_ASSIGNED), self.spec.host_path
        )
        # Views move to a cache's current version (or go) before the tick can evict what they
        # showed, and show what became usable during the tick right after it.
        await self._sync_views(self.node.manager.records())
        await self.node.tick()
        # One snapshot for the views and the report: a fetch that ends while the views are
        # synced (a thread) must not be reported ready before its view exists.
        records = self.node.manager.records()
        usable = await self._sync_views(records)
        report = json.dumps(self.reports(usable, records), sort_keys=True)
        if report != self._reported or annotations.get(ANN_CACHE_STATUS) != report:
            patch = {"metadata": {"annotations": {ANN_CACHE_STATUS: report}}}
            headers = {**self.access.auth_headers(), "Content-Type": _MERGE_PATCH}
            timeout = self.access.timeout()
            url = self.access.api_server() + path
            data = json.dumps(patch)
            async with http.patch(url, data=data, headers=headers, timeout=timeout) as resp:
                await json_or_raise(resp)
            self._reported = report

    async def _sync_views(self, records: list[ArtifactRecord]) -> dict[str, str]:
        """Views exactly for the caches usable in ``records``; returns them (cache -> key)."""
        usable = {}
        for cache in self.node.assigned:
            rec = self.node.usable(cache, records)
            if rec is not None:
                usable[cache] = rec.key
        await asyncio.to_thread(self.links.sync, usable)
        return usable

    def reports(
        self, usable: dict[str, str], records: list[ArtifactRecord]
    ) -> dict[str, dict[str, Any]]:
        """``FleetNode``'s reports of ``records``, with ``path`` the view on the host (set once
        linked)."""
        out = self.node.reports(records)
        for cache, report in out.items():
            report["path"] = f"{self.spec.host_path.rstrip('/')}/{cache}" if cache in usable else ""
        for cache, why in self.refused.items():
            out[cache] = {"state": "failed", "bytesDone": 0, "bytesTotal": 0,
                          "healthy": False, "message": why, "path": ""}  # fmt: skip
        return out
