"""Kubernetes discovery: variants with ``discovery: {type: kubernetes}`` follow the
EndpointSlices of their Service.

Per variant, one watcher task (``kube.watch.ListWatch`` on the Service's slices,
``labelSelector=kubernetes.io/service-name``): every change of the set is applied to the
variant. A variant derived from an InferenceEndpoint has ``service_owner_uid``: its task also
watches the Service itself (``fieldSelector=metadata.name``; both watches in one TaskGroup) and
applies the slices only while the Service's controller ``ownerReference`` is the
InferenceEndpoint of that uid; otherwise (another endpoint holds the name, or there is no
Service, or the gateway may not read it) the variant has no instances, the reason is logged
once per change and shown by the admin API (``KubeDiscovery.problem``).

The slices are read at the ``discovery.k8s.io`` version the server serves (``v1``, else
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
from warmfleet.kube.access import KubeAccessError, read_own, served_versions_of
from warmfleet.kube.endpointslices import (
    SERVICE_NAME_LABEL,
    SLICE_GROUP,
    belongs_to,
    endpoints_from_slices,
    slice_version,
)
from warmfleet.kube.owners import endpoint_service_problem
from warmfleet.kube.watch import ListWatch, object_name

log = logging.getLogger(__name__)
_SLICES = "/apis/" + SLICE_GROUP + "/{version}/namespaces/{namespace}/endpointslices"
_SERVICES = "/api/v1/namespaces/{namespace}/services"
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


def service_watch(
    spec: KubeWatchSpec,
    service: str,
    on_change: Callable[[Mapping[str, Any] | None], None],
    on_error: Callable[[BaseException, bool], None],
) -> ListWatch:
    """The watch of the one Service ``service`` (``fieldSelector=metadata.name``, also checked
    here): ``on_change`` gets the object, ``None`` while there is none, at each change."""

    def path() -> str:
        namespace = spec.namespace or read_own(spec.namespace_path, "discovery.namespace")
        return _SERVICES.format(namespace=namespace)

    return ListWatch(
        spec,
        path,
        on_change=lambda services: on_change(services.get(service)),
        on_error=on_error,
        keep=lambda obj: object_name(obj) == service,
        selectors={"fieldSelector": f"metadata.name={service}"},
        watch_timeout_s=spec.watch_timeout_s,
        retry_interval_s=spec.retry_interval_s,
    )


class OwnedSliceWatch:
    """A variant's slices, followed only while its Service's controller is the InferenceEndpoint
    of ``disc.service_owner_uid``: the Service and its slices are watched side by side (one
    TaskGroup). Nothing is applied before the Service was listed; while it is another's (or
    missing, or cannot be read) the variant has no instances and ``owner`` has the reason, else
    the slices apply once listed."""

    def __init__(self, owner: KubeDiscovery, key: WatchKey, disc: KubernetesDiscovery) -> None:
        self.owner, self.key, self.disc = owner, key, disc
        self.uid = disc.service_owner_uid or ""
        self.service_known = False
        self.problem: str | None = None
        self.slices: list[Mapping[str, Any]] | None = None  # None: not listed yet

        def failed(err: BaseException, first: bool) -> None:
            owner.failed(key, err, first=first)

        self.service = service_watch(disc, disc.service, self.service_changed, self.service_failed)
        self.slice_watch = service_slice_watch(disc, disc.service, self.slices_changed, failed)

    def service_failed(self, err: BaseException, first: bool) -> None:
        """Until the Service has been read (RBAC without ``services``: a 403), its read's error
        is why the variant has no instances: kept as ``owner``'s problem (logged once per
        change, there). Once read, an error keeps the variant as it was (``owner.failed``)."""
        if self.service_known:
            self.owner.failed(self.key, err, first=first)
            return
        self.owner.failed(self.key, err, first=False)  # counted; logged as the problem
        problem = f"cannot read Service {_where(self.disc)}: {err}"
        if problem != self.problem:
            self.owner.owner_checked(self.key, self.disc.service, problem)
        self.problem = problem

    def service_changed(self, service: Mapping[str, Any] | None) -> None:
        problem = endpoint_service_problem(service, self.disc.service, self.uid)
        if not self.service_known or problem != self.problem:
            self.owner.owner_checked(self.key, self.disc.service, problem, absent=service is None)
        self.service_known, self.problem = True, problem
        self.push()

    def slices_changed(self, slices: Iterable[Mapping[str, Any]]) -> None:
        self.slices = list(slices)
        self.push()

    def push(self) -> None:
        if not self.service_known:
            return
        if self.problem is not None:
            self.owner.apply(self.key, self.disc, [])
        elif self.slices is not None:
            self.owner.apply(self.key, self.disc, self.slices)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.service.run(), name=f"{self.key[0]}-{self.key[1]}-service")
            group.create_task(self.slice_watch.run(), name=f"{self.key[0]}-{self.key[1]}-slices")


def _where(disc: KubernetesDiscovery) -> str:
    """``namespace/service`` (the namespace may be unknown: its file unreadable)."""
    try:
        namespace = disc.namespace or read_own(disc.namespace_path, "discovery.namespace")
    except KubeAccessError:
        namespace = "?"
    return f"{namespace}/{disc.service}"


def slice_watch(
    owner: KubeDiscovery, key: WatchKey, disc: KubernetesDiscovery
) -> SliceWatch | OwnedSliceWatch:
    """The watch of one variant's Service slices, reporting to ``owner`` (with
    ``service_owner_uid``: only while the Service is that InferenceEndpoint's)."""
    if disc.service_owner_uid is not None:
        return OwnedSliceWatch(owner, key, disc)
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
        # why a variant's Service is not followed (service_owner_uid): shown by the admin API
        self.problems: dict[WatchKey, str] = {}

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
            self.problems.pop(key, None)
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

    def owner_checked(
        self, key: WatchKey, service: str, problem: str | None, *, absent: bool = False
    ) -> None:
        """The variant's Service was found not to be its own (``problem``: why; ``absent``: there
        is none, as before the operator makes it: logged at INFO), or its own (again): logged
        once per change, the reason kept for the admin API."""
        before = self.problems.pop(key, None)
        if problem is not None:
            self.problems[key] = problem
            level = logging.INFO if absent else logging.WARNING
            log.log(level, "kubernetes discovery for %s/%s: no instances: %s", *key[:2], problem)
        elif before is not None:
            log.info("kubernetes discovery for %s/%s: Service %s is its own", *key[:2], service)

    def problem(self, endpoint: str, variant: str) -> str | None:
        """Why the variant's Kubernetes discovery gives it no instances (``None``: no reason
        known), for its discovery config in force."""
        found = self.state.endpoints.get(endpoint)
        runtime = found.variants.get(variant) if found is not None else None
        disc = runtime.config.kubernetes_discovery() if runtime is not None else None
        if disc is None:
            return None
        return self.problems.get((endpoint, variant, disc.model_dump_json()))

    def failed(self, key: WatchKey, err: BaseException, *, first: bool) -> None:
        self.errors += 1
        self.state.metrics.reloads.labels("kubernetes", "error").inc()
        if first:
            log.error("kubernetes discovery for %s/%s failed, keeping the old instances: %s",
                      key[0], key[1], err)  # fmt: skip
