"""The gateway runtime: state, metrics and the I/O pieces its lifespan owns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.core.failures import one_line
from warmfleet.gateway.capture import (
    Capture,
    CaptureMetrics,
    CaptureSwitch,
    capture_aware,
    rekey_for_capture,
)
from warmfleet.gateway.capture_header import capture_header
from warmfleet.gateway.config import (
    EndpointConfig,
    GatewayConfig,
    InferenceEndpointsSource,
    VariantConfig,
    load_gateway_config,
)
from warmfleet.gateway.discovery.files import FileDiscovery
from warmfleet.gateway.discovery.inference_endpoints import (
    InferenceEndpointSync,
    derive_endpoints,
)
from warmfleet.gateway.discovery.kubernetes import KubeDiscovery
from warmfleet.gateway.documents import live_document, revalidated
from warmfleet.gateway.engine_stats import EngineStatsProbe
from warmfleet.gateway.flow import GatewayFlow
from warmfleet.gateway.health import HealthMonitor
from warmfleet.gateway.hold import GatewayHold
from warmfleet.gateway.http.upstream_pool import UpstreamPool
from warmfleet.gateway.kv_capacity import KvCapacityProbe
from warmfleet.gateway.kv_events.service import KvEventService
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.openai.body import BodyWorker
from warmfleet.gateway.openai.models import ModelsCache
from warmfleet.gateway.probes import ReaderPools
from warmfleet.gateway.proxy import Proxy
from warmfleet.gateway.replica_sync.curve_secret import fleet_curve_key
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.variant import RouterFactory
from warmfleet.gateway.world import GatewayState, build_router_or_raise

log = logging.getLogger(__name__)


class NotStartedError(RuntimeError):
    """A runtime piece was used outside the app lifespan."""


class Gateway:
    """Everything one gateway app owns. ``start``/``stop`` are called by ``start_app`` and
    ``StartedApp.stop``."""

    def __init__(
        self,
        config: GatewayConfig,
        factory: RouterFactory,
        config_path: Path | None = None,
        kv_events: KvEventService | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = GatewayMetrics()
        # spec.capture: switched by every applied config once started (docs/gateway.md)
        self.capture = CaptureSwitch(
            CaptureMetrics(self.metrics.registry), lambda: capture_header(self.state)
        )
        factory = capture_aware(factory, lambda: self.capture.current is not None)
        self.state = GatewayState(config, factory, self.metrics, clock=clock)
        self.config_path = config_path
        self.kv_events = kv_events
        self._restart_only = _restart_only(config)
        if kv_events is not None:
            kv_events.feed.register_metrics(self.metrics.registry)
        self.discovery = FileDiscovery(self.state)
        self.hold = GatewayHold(self.state, self.metrics.registry, clock)  # spec.hold
        # routing.flow: the variants' flow gates (a variant's drain also releases its hold)
        self.flow = GatewayFlow(self.state, self.metrics, clock, self.hold.release)
        self.kube_discovery = KubeDiscovery(self.state)
        # The document as given (file, reload); what is applied adds the endpoints derived
        # from InferenceEndpoints (``spec.inference_endpoints``), the latest set of which is kept.
        self.base_config = config
        self._endpoint_objects: tuple[list[Mapping[str, Any]], str] | None = None
        self._endpoint_problems: dict[str, str] = {}
        self._applied_derived: list[EndpointConfig] = []
        # Names of the endpoints in force that come from InferenceEndpoints (the admin API
        # leaves their routing to the objects).
        self.derived_endpoints: frozenset[str] = frozenset()
        self.endpoint_syncs = 0
        self.endpoint_sync_errors = 0
        self._proxy: Proxy | None = None
        self._health: HealthMonitor | None = None
        self._models: ModelsCache | None = None
        self._kv_capacity: KvCapacityProbe | None = None
        self._engine_stats: EngineStatsProbe | None = None
        self._sessions: list[ClientSession] = []
        self._pool: UpstreamPool | None = None
        # Parses and keys bodies over limits.offload_body_bytes (gateway/openai/body.py).
        self.body_worker = BodyWorker()
        # Called after a new config was applied (the HTTP server takes its new limits).
        self.on_applied: list[Callable[[GatewayConfig], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        sync = config.spec.replica_sync  # docs/replicas.md; a change needs a restart
        self.replica_sync = ReplicaSync(sync, self.metrics.registry) if sync is not None else None

    @property
    def proxy(self) -> Proxy:
        if self._proxy is None:
            raise NotStartedError("gateway not started")
        return self._proxy

    @property
    def health(self) -> HealthMonitor:
        if self._health is None:
            raise NotStartedError("gateway not started")
        return self._health

    @property
    def kv_capacity(self) -> KvCapacityProbe:
        if self._kv_capacity is None:
            raise NotStartedError("gateway not started")
        return self._kv_capacity

    @property
    def engine_stats(self) -> EngineStatsProbe:
        if self._engine_stats is None:
            raise NotStartedError("gateway not started")
        return self._engine_stats

    @property
    def models(self) -> ModelsCache:
        if self._models is None:
            raise NotStartedError("gateway not started")
        return self._models

    async def start(self) -> None:
        """Open the sockets, start the tasks. A failure part way (a busy port) stops what had
        started before it raises: no task, thread, socket or session is left behind."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        if (sync := self.replica_sync) is not None:  # first: a busy port fails the start
            sync.open(await fleet_curve_key(sync.config))  # before any task runs
        limits = self.state.limits
        self._pool = UpstreamPool(
            limits.upstream_connect_timeout_s, limits.max_upstream_connections, keepalive_s=60.0
        )
        # each reader of the instances its own pool (gateway/probes.py), each its share of the
        # 320 reads in flight, each read timed from when it has its slot: none makes another wait
        pools = ReaderPools.open()
        self._sessions = pools.sessions()
        self.body_worker.start()
        self._proxy = Proxy(self.state, self._pool)
        self._proxy.hold = self.hold
        self._proxy.flow = self.flow
        self.capture.on_switch = self._capture_switched
        self.capture.apply(self.state.spec.capture)
        self._health = HealthMonitor(self.state, pools.health)
        self._models = ModelsCache(self.state, pools.models)
        self._kv_capacity = KvCapacityProbe(self.state, pools.kv_capacity)
        self._engine_stats = EngineStatsProbe(self.state, pools.engine_stats)
        self.discovery.scan()  # instances from discovery files before the first request
        self._tasks = [
            asyncio.create_task(self._health.run(), name="warmfleet-gateway-health"),
            asyncio.create_task(self.kv_capacity.run(), name="warmfleet-gateway-kv-capacity"),
            asyncio.create_task(self.engine_stats.run(), name="warmfleet-gateway-engine-stats"),
            asyncio.create_task(self.discovery.run(), name="warmfleet-gateway-discovery"),
            asyncio.create_task(self.kube_discovery.run(), name="warmfleet-gateway-k8s-discovery"),
            asyncio.create_task(self._follow_inference_endpoints(), name="warmfleet-gateway-ie"),
            asyncio.create_task(self._sweep_idle(), name="warmfleet-gateway-pool-sweep"),
            asyncio.create_task(self.flow.run(), name="warmfleet-gateway-flow-timer"),
        ]
        if self.replica_sync is not None:
            self.replica_sync.attach(self.state)
            self._tasks.append(asyncio.create_task(self.replica_sync.run(), name="warmfleet-sync"))
        if self.kv_events is not None:
            await self.kv_events.start(self.state.instance_url)

    async def stop(self) -> None:
        await self.capture.stop()  # what is queued is written
        if self.kv_events is not None:
            await self.kv_events.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.replica_sync is not None:
            self.replica_sync.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for session in self._sessions:
            await session.close()
        self._sessions = []
        await self.body_worker.stop()

    def _capture_switched(self, capture: Capture | None) -> None:
        if self._proxy is not None:
            self._proxy.capture = capture
        routers = (v.router for e in self.state.endpoints.values() for v in e.variants.values())
        rekey_for_capture(routers, capture is not None)

    async def _sweep_idle(self) -> None:
        """Close upstream connections idle for longer than the pool's keep-alive."""
        while self._pool is not None:
            self._pool.sweep()
            await asyncio.sleep(5.0)

    def reload(self, source: str = "sighup") -> bool:
        """Re-read the config file and apply it; on any error log it and keep the old config."""
        if self.config_path is None:
            log.error("reload requested (%s) but the gateway was not started from a file", source)
            return False
        try:
            try:
                config = load_gateway_config(self.config_path)
            except ConfigError:
                self.metrics.reloads.labels(source, "error").inc()
                raise
            self.apply(config, source)
        except ConfigError as err:
            why = one_line(str(err), limit=8000)  # every bad field, on the log record's line
            log.error("config reload (%s) rejected, keeping the old config: %s", source, why)
            return False
        log.info("config reloaded from %s (%s)", self.config_path, source)
        return True

    def apply(self, config: GatewayConfig, source: str) -> None:
        """Apply ``config`` (plus the endpoints derived from InferenceEndpoints, if any)."""
        try:
            merged = self._with_derived(config)
            self.state.apply(merged)
        except ConfigError:
            self.metrics.reloads.labels(source, "error").inc()
            raise
        self.base_config = config
        if self.replica_sync is not None:
            self.replica_sync.attach(self.state)
        given = {e.name for e in config.spec.endpoints}
        self.derived_endpoints = frozenset(e.name for e in merged.spec.endpoints) - given
        self.metrics.reloads.labels(source, "ok").inc()
        if _restart_only(config) != self._restart_only:
            log.warning(
                "spec.tokenizerPath / kvEvents / replicaSync changed (%s): they apply at the "
                "next restart",
                source,
            )
        if self._proxy is not None:
            self.capture.apply(config.spec.capture)
        if self._models is not None:
            self._models.invalidate()
        if self._pool is not None:
            limits = merged.spec.limits
            self._pool.set_limits(
                limits.upstream_connect_timeout_s, limits.max_upstream_connections
            )
        for listener in self.on_applied:
            listener(config)

    # ---- endpoints from InferenceEndpoints (spec.inference_endpoints) --------------------

    def _derived(self, config: GatewayConfig) -> list[EndpointConfig]:
        """The endpoints ``config`` gets from the latest InferenceEndpoints (each reason one is
        left out is logged when it first appears)."""
        source = config.spec.inference_endpoints
        if source is None or self._endpoint_objects is None:
            return []
        objects, namespace = self._endpoint_objects
        problems: dict[str, str] = {}
        taken = [e.name for e in config.spec.endpoints]
        usable = []
        for endpoint in derive_endpoints(objects, source, namespace, taken, problems):
            try:
                for variant in endpoint.variants:
                    where = f"variant {variant.name} routing"
                    build_router_or_raise(self.state.factory, variant.routing, where)
            except ConfigError as err:
                problems[endpoint.name] = str(err)
                continue
            usable.append(endpoint)
        for name, why in problems.items():
            if self._endpoint_problems.get(name) != why:
                log.warning("InferenceEndpoint %r left out of the gateway: %s", name, why)
        self._endpoint_problems = problems
        return usable

    def _with_derived(self, config: GatewayConfig) -> GatewayConfig:
        """``config`` plus each derived endpoint the whole document still validates with (one
        that breaks a document-wide rule, such as ``kv_events``'s, is left out and logged: the
        objects can never make the document itself fail). ``config`` itself must validate, else
        ``ConfigError``: nothing is applied (the derived endpoints in force stay)."""
        merged = revalidated(config, "the document in force")
        for endpoint in self._derived(config):
            doc = merged.model_dump(mode="json", by_alias=True)
            doc["spec"]["endpoints"].append(endpoint.model_dump(mode="json", by_alias=True))
            try:
                merged = parse_document(
                    GatewayConfig, doc, f"with InferenceEndpoint {endpoint.name}"
                )
            except ConfigError as err:
                log.warning("InferenceEndpoint %r left out of the gateway: %s", endpoint.name, err)
        return merged

    def check_variant(self, endpoint: str, config: VariantConfig) -> None:
        """``ConfigError`` unless the document in force, and the one a change of the
        InferenceEndpoints re-applies, still validate with ``config`` for that variant (an admin
        change: every document-wide rule, such as ``kvEvents``'s, still holds after it)."""
        for document in (self.state.config, self.base_config):
            revalidated(live_document(document, self.state, endpoint, config), "routing")

    def publish_inference_endpoints(
        self, objects: list[Mapping[str, Any]], source: InferenceEndpointsSource, namespace: str
    ) -> None:
        """A new set of InferenceEndpoint objects: apply the document plus their endpoints."""
        if self.base_config.spec.inference_endpoints != source:
            return  # a reload changed the source meanwhile; its own sync follows
        previous = self._endpoint_objects
        self._endpoint_objects = (objects, namespace)
        derived = self._derived(self.base_config)
        if previous is not None and derived == self._applied_derived:
            return  # e.g. only an object's status changed: nothing for the gateway
        try:
            # the document as the admin API changed its own endpoints (only a reload replaces them)
            self.apply(live_document(self.base_config, self.state), "kubernetes")
        except ConfigError as err:
            self._endpoint_objects = previous
            self.endpoint_sync_errors += 1
            log.error("InferenceEndpoints not applied, keeping the previous set: %s", err)
            return
        self._applied_derived = derived
        self.endpoint_syncs += 1

    def _endpoint_sync_failed(self, err: BaseException, first: bool) -> None:
        self.endpoint_sync_errors += 1
        self.metrics.reloads.labels("kubernetes", "error").inc()
        if first:
            log.error("InferenceEndpoints unavailable, keeping the last set: %s", err)

    async def _follow_inference_endpoints(self) -> None:
        """One sync while ``spec.inference_endpoints`` is set; restarted when it changes."""
        running: tuple[InferenceEndpointsSource, asyncio.Task[None]] | None = None
        try:
            while True:
                source = self.base_config.spec.inference_endpoints
                if running is not None and (running[0] != source or running[1].done()):
                    task = running[1]
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                    if not task.cancelled() and task.exception() is not None:
                        self._endpoint_sync_failed(task.exception() or RuntimeError(), True)
                    running = None
                if running is None and source is not None:
                    sync = InferenceEndpointSync(
                        source, self.publish_inference_endpoints, self._endpoint_sync_failed
                    )
                    running = (source, asyncio.create_task(sync.run(), name="warmfleet-ie-watch"))
                await asyncio.sleep(0.5)
        finally:
            if running is not None:
                running[1].cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await running[1]


def _restart_only(config: GatewayConfig) -> tuple[str | None, ...]:
    """Settings that need a restart (like ``spec.listen``): the tokenizer, the KV events and
    replica sync."""
    spec = config.spec
    events, sync = spec.kv_events, spec.replica_sync
    return (
        spec.tokenizer_path,
        events.model_dump_json() if events is not None else None,
        sync.model_dump_json() if sync is not None else None,
    )
