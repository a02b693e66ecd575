"""Kubernetes discovery: variants with ``discovery: {type: kubernetes}`` follow the
EndpointSlices of their Service.

Per variant, one watcher task: list the slices (``labelSelector=kubernetes.io/service-name``),
apply, then watch from the list's ``resourceVersion`` and apply every change; when the watch
ends (its ``timeoutSeconds``, a 410 "too old", or the client-side deadline) list again. On any
error the variant keeps its instances, the error is logged once per streak, and the watcher
retries after ``retry_interval_s``. Every call has a timeout; the service-account token is
re-read at every list (projected tokens rotate).

One supervisor task (owned by the runtime) starts, restarts and stops the watchers as config
reloads add, change or drop Kubernetes discovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from warmfleet.gateway.config import KubernetesDiscovery
from warmfleet.gateway.endpointslices import SERVICE_NAME_LABEL, belongs_to, instances_from_slices
from warmfleet.gateway.fleet import GatewayState
from warmfleet.kube.access import (
    KubeAccessError,
    api_server,
    auth_headers,
    json_or_raise,
    read_own,
    tls,
)

log = logging.getLogger(__name__)
_SLICES = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
_TICK_S = 0.5
_GONE = 410

WatchKey = tuple[str, str, str]  # endpoint, variant, discovery config (JSON)


class _Watcher:
    """Follows one variant's Service; applies the ready instances to the variant."""

    def __init__(self, owner: KubeDiscovery, key: WatchKey, disc: KubernetesDiscovery) -> None:
        self.owner = owner
        self.key = key
        self.disc = disc
        self.slices: dict[str, Mapping[str, Any]] = {}

    async def run(self) -> None:
        disc = self.disc
        failing = False
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls(disc))) as http:
            while True:
                try:
                    await self._list_and_watch(http)
                    failing = False
                except (KubeAccessError, aiohttp.ClientError, TimeoutError, ValueError) as err:
                    self.owner.failed(self.key, err, first=not failing)
                    failing = True
                    await asyncio.sleep(disc.retry_interval_s)

    async def _list_and_watch(self, http: aiohttp.ClientSession) -> None:
        disc = self.disc
        namespace = disc.namespace or read_own(disc.namespace_path, "discovery.namespace")
        url = api_server(disc) + _SLICES.format(namespace=namespace)
        selector = {"labelSelector": f"{SERVICE_NAME_LABEL}={disc.service}"}
        timeout = aiohttp.ClientTimeout(total=disc.timeout_s)
        headers = auth_headers(disc)
        async with http.get(url, params=selector, headers=headers, timeout=timeout) as resp:
            listing = await json_or_raise(resp)
        items = listing.get("items")
        if not isinstance(items, list):
            raise KubeAccessError(f"{url}: the list has no items")
        self.slices = {
            _name(s): s for s in items if isinstance(s, dict) and belongs_to(s, disc.service)
        }
        self.owner.apply(self.key, self.disc, self.slices.values())
        params = {
            **selector,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, round(disc.watch_timeout_s))),
        }
        version = (listing.get("metadata") or {}).get("resourceVersion")
        if version:
            params["resourceVersion"] = str(version)
        watch_timeout = aiohttp.ClientTimeout(total=None, sock_connect=disc.timeout_s)
        # The server ends the watch after timeoutSeconds; this deadline covers one that does not.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(disc.watch_timeout_s + disc.timeout_s):
                async with http.get(
                    url, params=params, headers=auth_headers(disc), timeout=watch_timeout
                ) as resp:
                    if resp.status != 200:
                        await json_or_raise(resp)
                    async for line in resp.content:
                        event = json.loads(line) if line.strip() else None
                        if isinstance(event, dict) and not self._event(event):
                            return

    def _event(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; ``False``: the watch must restart from a new list."""
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return True  # nothing to apply
        if kind == "ERROR":
            code = obj.get("code")
            if code == _GONE:
                return False
            raise KubeAccessError(f"watch error {code}: {obj.get('message', '')}")
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return True  # BOOKMARK
        name = _name(obj)
        if kind == "DELETED" or not belongs_to(obj, self.disc.service):
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
        self.owner.apply(self.key, self.disc, self.slices.values())
        return True


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


class KubeDiscovery:
    """The supervisor: one watcher per variant with Kubernetes discovery."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.loads = 0
        self.errors = 0
        self._tasks: dict[WatchKey, asyncio.Task[None]] = {}

    def wanted(self) -> dict[WatchKey, KubernetesDiscovery]:
        wanted: dict[WatchKey, KubernetesDiscovery] = {}
        for variant in self.state.variants():
            disc = variant.config.kubernetes_discovery()
            if disc is not None:
                wanted[(variant.endpoint, variant.name, disc.model_dump_json())] = disc
        return wanted

    def sync(self) -> None:
        """Start watchers for new or changed discovery configs, stop the others."""
        wanted = self.wanted()
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
        for key in [k for k, task in self._tasks.items() if task.done()]:
            crashed = self._tasks.pop(key)  # a bug, not an API error: log it, start afresh
            if not crashed.cancelled() and crashed.exception() is not None:
                self.failed(key, crashed.exception() or RuntimeError(), first=True)
        for key, disc in wanted.items():
            if key not in self._tasks:
                name = f"warmfleet-gateway-k8s-{key[0]}-{key[1]}"
                self._tasks[key] = asyncio.create_task(_Watcher(self, key, disc).run(), name=name)

    async def run(self) -> None:
        try:
            while True:
                self.sync()
                await asyncio.sleep(_TICK_S)
        finally:
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def apply(self, key: WatchKey, disc: KubernetesDiscovery, slices: Any) -> None:
        """The variant's instances become the slices' ready endpoints (if it still uses
        ``disc``: a reload may have changed it meanwhile)."""
        endpoint = self.state.endpoints.get(key[0])
        variant = endpoint.variants.get(key[1]) if endpoint is not None else None
        if variant is None or variant.config.kubernetes_discovery() != disc:
            return
        specs = instances_from_slices(slices, disc.port, disc.scheme)
        if [variant.spec_of(i) for i in variant.instances.values()] == specs:
            return
        variant.set_instances(specs)
        self.loads += 1
        self.state.metrics.reloads.labels("kubernetes", "ok").inc()
        log.info("kubernetes %s: %d ready instances for %s/%s", disc.source, len(specs), *key[:2])

    def failed(self, key: WatchKey, err: BaseException, *, first: bool) -> None:
        self.errors += 1
        self.state.metrics.reloads.labels("kubernetes", "error").inc()
        if first:
            log.error("kubernetes discovery for %s/%s failed, keeping the old instances: %s",
                      key[0], key[1], err)  # fmt: skip
