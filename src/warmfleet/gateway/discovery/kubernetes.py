"""Kubernetes discovery: variants with ``discovery: {type: kubernetes}`` follow the
EndpointSlices of their Service.

Per variant, one watcher task (``kube.watch.ListWatch`` on the Service's slices,
``labelSelector=kubernetes.io/service-name``): every change of the set is applied to the
variant. The slices are read at the ``discovery.k8s.io`` version the server serves (``v1``, else
``v1beta1`` as on Kubernetes 1.20), found by API discovery before the first list and again after
an error. On an API error the variant keeps its instances, the error is logged once per streak
and the watcher retries after a backoff (``kube.access.api_loop``: from ``retry_interval_s``,
doubling, capped, jittered).

One supervisor task (owned by the runtime) starts, restarts and stops the watchers as config
reloads add, change or drop Kubernetes discovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from warmfleet.gateway.config import InstanceSpec, KubernetesDiscovery
from warmfleet.gateway.kube_watch_config import KubeWatchSpec
from warmfleet.gateway.world import GatewayState
from warmfleet.kube.access import read_own, served_versions_of
from warmfleet.kube.endpointslices import (
    SERVICE_NAME_LABEL,
    SLICE_GROUP,
    belongs_to,
    endpoints_from_slices,
    slice_version,
)
from warmfleet.kube.watch import ListWatch

log = logging.getLogger(__name__)
_SLICES = "/apis/" + SLICE_GROUP + "/{version}/namespaces/{namespace}/endpointslices"
_TICK_S = 0.5

WatchKey = tuple[str, str, str]  # endpoint, variant, discovery config (JSON)


def instances_from_slices(
    slices: Iterable[Mapping[str, Any]], port: str | int, scheme: str = "http"
) -> list[InstanceSpec]:
    """The ready instances behind a Service's slices, sorted by id (deterministic)."""
    return endpoints_from_slices(
        slices, port, lambda iid, url: InstanceSpec(id=iid, url=url), scheme
    )


class SliceWatch(ListWatch):
    """A ``ListWatch`` of EndpointSlices at the version the server serves."""

    version: str | None = None

    async def list_and_watch(self, http: aiohttp.ClientSession) -> None:
        if self.version is None:
            self.version = slice_version(await served_versions_of(http, self.access, SLICE_GROUP))
        try:
            await super().list_and_watch(http)
        except Exception:
            self.version = None  # found again: the server may have changed
            raise


def service_slice_watch(
    spec: KubeWatchSpec,
    service: str,
    on_change: Callable[[Iterable[Mapping[str, Any]]], None],
    on_error: Callable[[BaseException, bool], None],
) -> SliceWatch:
    """The watch of Service ``service``'s EndpointSlices (the engines' of a variant, or the
    gateway's own for its replica-sync peers): ``on_change`` gets every slice at each change."""

    def path() -> str:
        namespace = spec.namespace or read_own(spec.namespace_path, "discovery.namespace")
        return _SLICES.format(version=watch.version or "v1", namespace=namespace)

    watch = SliceWatch(
        spec,
        path,
        on_change=lambda slices: on_change(slices.values()),
        on_error=on_error,
        keep=lambda obj: belongs_to(obj, service),
        selectors={"labelSelector": f"{SERVICE_NAME_LABEL}={service}"},
        watch_timeout_s=spec.watch_timeout_s,
        retry_interval_s=spec.retry_interval_s,
    )
    return watch


def slice_watch(owner: KubeDiscovery, key: WatchKey, disc: KubernetesDiscovery) -> SliceWatch:
    """The watch of one variant's Service slices, reporting to ``owner``."""
    return service_slice_watch(
        disc,
        disc.service,
        lambda slices: owner.apply(key, disc, slices),
        lambda err, first: owner.failed(key, err, first=first),
    )


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
                watch = slice_watch(self, key, disc)
                self._tasks[key] = asyncio.create_task(watch.run(), name=name)

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
