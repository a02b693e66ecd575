"""The gateway's world: its endpoints (each a weighted set of variants, ``variant``) and how a
new configuration document is applied to it."""

from __future__ import annotations

import logging
import random
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any, Protocol

from warmfleet.core.errors import ConfigError, NotFoundError
from warmfleet.engine.presets import preset_names
from warmfleet.gateway.config import GatewayConfig, GatewaySpec, check_origin
from warmfleet.gateway.departures import forget_models_answers, forget_variant
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.server_config import HealthConfig, LimitsConfig
from warmfleet.gateway.variant import RouterFactory, VariantRuntime
from warmfleet.routing.config import RoutingConfig

log = logging.getLogger(__name__)
_MAX_MODEL_CACHE = 1024


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


class GatewayState:
    """Endpoints, limits, health settings and the admin token currently in force."""

    def __init__(
        self,
        config: GatewayConfig,
        factory: RouterFactory,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.clock = clock  # of passive ejections (tests inject one)
        self.factory = factory
        self.rng = random.Random(config.spec.seed)
        self.endpoints: dict[str, EndpointRuntime] = {}
        # removed variants, until their last request has ended (``forget_departed``)
        self.retired: list[VariantRuntime] = []
        # what holds a variant's requests or series besides it (flow control, the hold)
        self.series_owners: list[VariantSeries] = []
        self.config = config
        check_routers(config, factory)
        check_instances(config)
        self._apply_settings(config.spec)
        self._apply_endpoints(config.spec)

    # ---- settings read on the hot path ---------------------------------------------------

    @property
    def spec(self) -> GatewaySpec:
        return self.config.spec

    @property
    def health(self) -> HealthConfig:
        return self.config.spec.health

    def _apply_settings(self, spec: GatewaySpec) -> None:
        limits = spec.limits
        self.limits: LimitsConfig = limits  # read on every request: a plain attribute
        self.admin_token = spec.admin.resolved_token()
        self.variant_header = spec.variant_header.lower()
        self.default_endpoint_name = spec.default_endpoint_name
        self.model_selects_endpoint = spec.model_selects_endpoint

    # ---- lookups -------------------------------------------------------------------------

    def endpoint(self, name: str) -> EndpointRuntime:
        found = self.endpoints.get(name)
        if found is None:
            raise NotFoundError(f"endpoint {name!r} not found")
        return found

    def default_endpoint(self) -> EndpointRuntime:
        if self.default_endpoint_name is None:
            raise NotFoundError("no endpoint is configured yet")
        return self.endpoint(self.default_endpoint_name)

    def openai_endpoint(self, model: str | None) -> EndpointRuntime:
        """The endpoint the OpenAI routes serve ``model`` from: with
        ``spec.model_selects_endpoint``, the one named like the model if there is one; else the
        default endpoint."""
        if self.model_selects_endpoint and model is not None:
            found = self.endpoints.get(model)
            if found is not None:
                return found
        return self.default_endpoint()

    def openai_endpoints(self) -> list[EndpointRuntime]:
        """Every endpoint the OpenAI routes can reach (``/v1/models`` lists their models)."""
        if self.model_selects_endpoint:
            return list(self.endpoints.values())
        return [self.default_endpoint()] if self.default_endpoint_name is not None else []

    def instance_url(self, instance_id: str) -> str | None:
        """The URL of the instance named ``instance_id`` in any variant (None: unknown)."""
        for variant in self.variants():
            inst = variant.instances.get(instance_id)
            if inst is not None:
                return inst.base_url
        return None

    def variants(self) -> Iterator[VariantRuntime]:
        for endpoint in self.endpoints.values():
            yield from endpoint.variants.values()

    def describe(self) -> dict[str, Any]:
        return {
            "default_endpoint": self.default_endpoint_name,
            "endpoints": [e.describe() for e in self.endpoints.values()],
        }

    # ---- reconfiguration -----------------------------------------------------------------

    def apply(self, config: GatewayConfig) -> None:
        """Apply a validated document. Settings and routers change for the next request; the
        objects in-flight requests hold are left alone. Listen address changes need a restart.
        Everything that can refuse ``config`` is checked before anything of it is applied."""
        check_routers(config, self.factory)
        check_instances(config)
        if config.spec.listen != self.config.spec.listen:
            log.warning("spec.listen changed; the new address applies after a restart")
        self._apply_settings(config.spec)
        self.config = config
        self._apply_endpoints(config.spec)

    def _apply_endpoints(self, spec: GatewaySpec) -> None:
        endpoints: dict[str, EndpointRuntime] = {}
        for ep_config in spec.endpoints:
            endpoint = self.endpoints.get(ep_config.name) or EndpointRuntime(ep_config.name)
            variants: dict[str, VariantRuntime] = {}
            for v_config in ep_config.variants:
                existing = endpoint.variants.get(v_config.name)
                if existing is None:
                    existing = VariantRuntime(
                        ep_config.name,
                        v_config,
                        self.factory,
                        self.metrics,
                        spec.seed,
                        clock=self.clock,
                    )
                else:
                    existing.update_config(v_config)
                existing.configure_outlier(
                    spec.health.outlier, enabled=spec.health.passive_ejection
                )
                variants[v_config.name] = existing
            for name, old in endpoint.variants.items():
                if name not in variants:
                    self._retire(old)
            endpoint.variants = variants
            endpoint.invalidate()
            endpoints[ep_config.name] = endpoint
        for name, old_ep in self.endpoints.items():
            if name not in endpoints:
                for variant in old_ep.variants.values():
                    self._retire(variant)
        self.endpoints = endpoints

    def _retire(self, variant: VariantRuntime) -> None:
        """A variant removed: its instances leave, and its series go once its last request has
        ended (``forget_departed``); in-flight requests keep their references."""
        variant.set_instances([])
        self.retired.append(variant)

    def forget_departed(self) -> None:
        """Forget the series of the instances that left, and of the variants removed, once
        their last request has ended (every health round; ``gateway.departures``)."""
        live: set[str] = set()
        for variant in self.variants():
            variant.departures.sweep(variant.instances)
            live.update(variant.instances)
        forget_models_answers(self.metrics, live)
        busy = {(old.endpoint, old.name) for old in self.retired if self._in_flight(old)}
        retired: list[VariantRuntime] = []
        gone: set[tuple[str, str]] = set()
        for old in self.retired:
            where = (old.endpoint, old.name)
            if where in busy:  # (kept until every removed object of that name has drained)
                retired.append(old)
            elif self._variant(*where) is None:  # (else its series are the new one's)
                old.series_gone = True  # a late count goes nowhere
                gone.add(where)
        self.retired = retired
        for where in gone:
            forget_variant(self.metrics, *where)
            for owner in self.series_owners:
                owner.forget_variant(*where)

    def _in_flight(self, old: VariantRuntime) -> bool:
        """Whether a request still holds removed variant ``old``: on one of its instances, in
        its flow gate or held (a variant of that name added again: only the instances count,
        the series are the new one's too)."""
        same = self._variant(old.endpoint, old.name)
        if old.departures.sweep(same.instances if same is not None else {}):
            return True
        return same is None and any(o.waiting(old.endpoint, old.name) for o in self.series_owners)

    def _variant(self, endpoint: str, name: str) -> VariantRuntime | None:
        current = self.endpoints.get(endpoint)
        return current.variants.get(name) if current is not None else None


class VariantSeries(Protocol):
    """Keeps requests and series of variants besides ``VariantRuntime``: flow control, the
    hold. Told when a removed variant's series go."""

    def waiting(self, endpoint: str, variant: str) -> bool:
        """Whether a request of that variant is still parked here."""
        ...

    def forget_variant(self, endpoint: str, variant: str) -> None:
        """That variant is gone and none of its requests is left: drop what is kept of it."""
        ...


def build_router_or_raise(factory: RouterFactory, routing: RoutingConfig, where: str) -> None:
    """Build a throwaway router so a config that validates but cannot run is rejected early
    (on load, reload and the admin API alike), its flow control's engine preset too."""
    try:
        factory(routing, random.Random(0))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {err}") from err
    flow = routing.flow
    if flow is not None and flow.engine_preset not in preset_names():
        raise ConfigError(
            f"{where}.flow.enginePreset: {flow.engine_preset!r} is not one of "
            f"{', '.join(preset_names())}"
        )


def check_routers(config: GatewayConfig, factory: RouterFactory) -> None:
    for i, endpoint in enumerate(config.spec.endpoints):
        for j, variant in enumerate(endpoint.variants):
            build_router_or_raise(
                factory, variant.routing, f"spec.endpoints.{i}.variants.{j}.routing"
            )


def check_instances(config: GatewayConfig) -> None:
    """Every static instance of ``config`` can be sent to (``ConfigError`` naming its URL): a
    document built in code was not validated, and an instance that fails half way through
    ``apply`` would leave half of the document applied."""
    for i, endpoint in enumerate(config.spec.endpoints):
        for j, variant in enumerate(endpoint.variants):
            where = "instances" if variant.instances is not None else "discovery.instances"
            for k, spec in enumerate(variant.static_instances()):
                try:
                    check_origin(spec.url)
                except ValueError as err:
                    field = f"spec.endpoints.{i}.variants.{j}.{where}.{k}.url"
                    raise ConfigError(f"{field}: {err}") from err
