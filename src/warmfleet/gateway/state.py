"""Live state of the gateway: endpoints -> variants -> instances, with load and health.

All mutation happens on the event loop (no locks). Changes replace whole objects (a variant's
router, its instance dict), so a request that already holds a reference keeps using what it
started with: in-flight requests are untouched by a reconfiguration.
"""

from __future__ import annotations

import logging
import random
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from typing import Any, Protocol

from prometheus_client import Counter

from warmfleet.core.errors import NotFoundError
from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, InstanceState, RoutingKey
from warmfleet.gateway.config import FileDiscovery, InstanceSpec, VariantConfig
from warmfleet.gateway.metrics import FastValue, GatewayMetrics
from warmfleet.gateway.upstream import Origin
from warmfleet.routing.config import RoutingConfig

log = logging.getLogger(__name__)
_MAX_MODEL_CACHE = 1024


class RouterLike(Protocol):
    """What the gateway needs from ``warmfleet.routing.router.Router``."""

    def key_for_chat(self, body: Mapping[str, Any], tenant: str | None) -> RoutingKey: ...

    def key_for_completions(self, body: Mapping[str, Any], tenant: str | None) -> RoutingKey: ...

    def key_for_bytes(self, raw: bytes, tenant: str | None, model: str) -> RoutingKey: ...

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision: ...

    def on_routed(self, key: RoutingKey, decision: Decision) -> None: ...

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None: ...

    def adopt(self, previous: object) -> None:
        """Replace ``previous``: keep what it learnt if it means the same on this router."""
        ...


RouterFactory = Callable[[RoutingConfig, random.Random], RouterLike]


class InstanceRuntime:
    """One instance of one variant: where it is, its health and the load the gateway sent it."""

    __slots__ = (
        "base_url",
        "data_parallel_rank",
        "failures",
        "healthy",
        "in_flight_requests",
        "in_flight_tokens",
        "instance_id",
        "m_in_flight",
        "origin",
        "removed",
        "state",
        "successes",
    )

    def __init__(
        self, spec: InstanceSpec, metrics: GatewayMetrics, endpoint: str, variant: str
    ) -> None:
        self.instance_id = spec.id
        self.base_url = spec.url
        self.data_parallel_rank = spec.data_parallel_rank
        self.origin = Origin(spec.url, spec.data_parallel_rank)
        self.healthy = True
        self.failures = 0
        self.successes = 0
        self.in_flight_requests = 0
        self.in_flight_tokens = 0
        self.removed = False
        self.m_in_flight = metrics.in_flight.labels(endpoint, variant, spec.id)
        self.state = InstanceState(spec.id)  # what strategies see; rebuilt on every load change
        metrics.healthy.labels(endpoint, variant, spec.id).set(1)

    def add_load(self, requests: int, tokens: int) -> None:
        """A request of ``tokens`` tokens starts (``requests=1``) or ends (``-1``, ``-tokens``)."""
        self.in_flight_requests += requests
        self.in_flight_tokens += tokens
        self.state = InstanceState(self.instance_id, self.in_flight_requests, self.in_flight_tokens)
        self.m_in_flight.inc(requests)


class VariantRuntime:
    """A production variant: weight, served models, routing config + router, instances."""

    def __init__(
        self,
        endpoint: str,
        config: VariantConfig,
        factory: RouterFactory,
        metrics: GatewayMetrics,
        seed: int,
    ) -> None:
        self.endpoint = endpoint
        self.name = config.name
        self._factory = factory
        self._metrics = metrics
        self._seed = seed
        self._generation = 0
        self.instances: dict[str, InstanceRuntime] = {}
        self.healthy: tuple[InstanceRuntime, ...] = ()
        self._requests: dict[tuple[str, str, str], FastValue] = {}
        self.m_decision = metrics.decision.labels(endpoint, self.name)
        self.m_overhead = metrics.overhead.labels(endpoint, self.name)
        self.m_ttft = {s: metrics.ttft.labels(endpoint, self.name, s) for s in ("true", "false")}
        self.m_prefix_hits = metrics.prefix_hits.labels(endpoint, self.name)
        self.m_cached_blocks = metrics.cached_blocks.labels(endpoint, self.name)
        self.m_retries = metrics.retries.labels(endpoint, self.name)
        self.config = config
        self.routing_config = config.routing
        self.router = self._new_router(config.routing)
        self.set_instances(config.static_instances())

    # ---- configuration -------------------------------------------------------------------

    @property
    def weight(self) -> float:
        return self.config.weight

    @property
    def discovery(self) -> FileDiscovery | None:
        return self.config.file_discovery()

    def serves(self, model: str) -> bool:
        return not self.config.models or model in self.config.models

    def _new_router(self, routing: RoutingConfig) -> RouterLike:
        self._generation += 1
        rng = random.Random(f"{self._seed}/{self.endpoint}/{self.name}/{self._generation}")
        return self._factory(routing, rng)

    def set_routing(self, routing: RoutingConfig) -> None:
        """Swap in a new router; requests already routed keep their instance."""
        router = self._new_router(routing)
        router.adopt(self.router)  # a parameter change must not forget the engines' caches
        router.on_instances_changed([i.instance_id for i in self.healthy])
        self.router = router
        self.routing_config = routing
        self.config = self.config.model_copy(update={"routing": routing})

    def update_config(self, config: VariantConfig) -> None:
        """Apply a new variant config (from a reload): routing, weight, models, instances."""
        if config.routing != self.routing_config:
            self.set_routing(config.routing)
        live = [self.spec_of(i) for i in self.instances.values()]
        self.config = config.model_copy(update={"routing": self.routing_config})
        if not config.discovered and live != config.static_instances():
            self.set_instances(config.static_instances())

    def set_instances(self, specs: Sequence[InstanceSpec]) -> None:
        """Replace the instance set; instances with the same id and URL keep their state."""
        new: dict[str, InstanceRuntime] = {}
        for spec in specs:
            old = self.instances.get(spec.id)
            if (
                old is not None
                and old.base_url == spec.url
                and old.data_parallel_rank == spec.data_parallel_rank
            ):
                new[spec.id] = old
            else:
                new[spec.id] = InstanceRuntime(spec, self._metrics, self.endpoint, self.name)
        for iid, old in self.instances.items():
            if new.get(iid) is not old:
                old.removed = True
                if iid not in new:
                    self._metrics.forget_instance(self.endpoint, self.name, iid)
        self.instances = new
        self._refresh_healthy()

    def replace_static_instances(self, specs: Sequence[InstanceSpec]) -> None:
        """Admin change of a static variant: the live list becomes the variant's config."""
        self.config = self.config.model_copy(update={"instances": list(specs), "discovery": None})
        self.set_instances(specs)

    def add_instance(self, spec: InstanceSpec) -> None:
        specs = [self.spec_of(i) for i in self.instances.values() if i.instance_id != spec.id]
        self.replace_static_instances([*specs, spec])

    def remove_instance(self, instance_id: str) -> None:
        if instance_id not in self.instances:
            raise NotFoundError(f"instance {instance_id!r} not found in variant {self.name!r}")
        rest = [self.spec_of(i) for i in self.instances.values() if i.instance_id != instance_id]
        self.replace_static_instances(rest)

    @staticmethod
    def spec_of(inst: InstanceRuntime) -> InstanceSpec:
        return InstanceSpec(
            id=inst.instance_id, url=inst.base_url, data_parallel_rank=inst.data_parallel_rank
        )

    # ---- health --------------------------------------------------------------------------

    def _refresh_healthy(self) -> None:
        """Recompute the healthy set; the router learns of every change (it purges the state of
        instances that left: a readmitted instance restarts with an empty cache)."""
        healthy = tuple(i for i in self.instances.values() if i.healthy)
        changed = healthy != self.healthy
        self.healthy = healthy
        if changed:
            self.router.on_instances_changed([i.instance_id for i in healthy])

    def record_failure(self, inst: InstanceRuntime, threshold: int, cause: str) -> bool:
        """Count a failure; eject at ``threshold`` consecutive ones. True if this ejected it."""
        inst.successes = 0
        inst.failures += 1
        if not inst.healthy or inst.failures < threshold:
            return False
        inst.healthy = False
        if not inst.removed:
            self._refresh_healthy()
            self._metrics.healthy.labels(self.endpoint, self.name, inst.instance_id).set(0)
            self._metrics.ejections.labels(self.endpoint, self.name, inst.instance_id, cause).inc()
        log.warning("ejected %s/%s/%s (%s)", self.endpoint, self.name, inst.instance_id, cause)
        return True

    def record_success(self, inst: InstanceRuntime, threshold: int) -> bool:
        """Count a success; readmit at ``threshold`` consecutive ones. True if readmitted."""
        inst.failures = 0
        inst.successes += 1
        if inst.healthy or inst.successes < threshold:
            return False
        inst.healthy = True
        if not inst.removed:
            self._refresh_healthy()
            self._metrics.healthy.labels(self.endpoint, self.name, inst.instance_id).set(1)
            self._metrics.readmissions.labels(self.endpoint, self.name, inst.instance_id).inc()
        log.warning("readmitted %s/%s/%s", self.endpoint, self.name, inst.instance_id)
        return True

    # ---- hot path ------------------------------------------------------------------------

    def snapshot(self, exclude: set[str] | None = None) -> FleetSnapshot:
        healthy = self.healthy
        if exclude:
            healthy = tuple(i for i in healthy if i.instance_id not in exclude)
        return FleetSnapshot(tuple([i.state for i in healthy]), time.monotonic())

    def request_counter(self, instance: str, reason: str, status: str) -> FastValue:
        key = (instance, reason, status)
        child = self._requests.get(key)
        if child is None:
            child = self._metrics.requests.labels(
                self.endpoint, self.name, instance, reason, status
            )
            self._requests[key] = child
        return child

    def spill_counter(self, instance: str) -> Counter:
        return self._metrics.spills.labels(self.endpoint, self.name, instance)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weight": self.weight,
            "models": list(self.config.models),
            "routing": self.routing_config.model_dump(mode="json"),
            "discovery": self.config.discovery.model_dump(mode="json")
            if self.config.discovery
            else None,
            "instances": [
                {
                    "id": i.instance_id,
                    "url": i.base_url,
                    "data_parallel_rank": i.data_parallel_rank,
                    "healthy": i.healthy,
                    "in_flight_requests": i.in_flight_requests,
                    "in_flight_tokens": i.in_flight_tokens,
                }
                for i in self.instances.values()
            ],
        }


class EndpointRuntime:
    """An endpoint: its variants and the weighted choice among those serving a model."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.variants: dict[str, VariantRuntime] = {}
        self._by_model: dict[str | None, tuple[tuple[VariantRuntime, ...], list[float]]] = {}

    def invalidate(self) -> None:
        self._by_model = {}

    def variant(self, name: str) -> VariantRuntime:
        found = self.variants.get(name)
        if found is None:
            raise NotFoundError(f"variant {name!r} not found in endpoint {self.name!r}")
        return found

    def pick_variant(
        self, model: str | None, requested: str | None, rng: random.Random
    ) -> VariantRuntime:
        """The named variant, else a weighted choice among the variants serving ``model``."""
        if requested is not None:
            chosen = self.variant(requested)
            if model is not None and not chosen.serves(model):
                raise NotFoundError(f"the model {model!r} is not served by variant {requested!r}")
            return chosen
        entry = self._by_model.get(model)
        if entry is None:
            entry = self._candidates(model)
            if len(self._by_model) >= _MAX_MODEL_CACHE:
                self._by_model.clear()
            self._by_model[model] = entry
        variants, cumulative = entry
        if len(variants) == 1:
            return variants[0]
        total = cumulative[-1]
        if total <= 0:
            return rng.choice(variants)
        return variants[min(bisect_right(cumulative, rng.random() * total), len(variants) - 1)]

    def _candidates(self, model: str | None) -> tuple[tuple[VariantRuntime, ...], list[float]]:
        variants = tuple(v for v in self.variants.values() if model is None or v.serves(model))
        if not variants:
            raise NotFoundError(f"the model {model!r} does not exist on endpoint {self.name!r}")
        return variants, list(accumulate(v.weight for v in variants))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "variants": [v.describe() for v in self.variants.values()]}
