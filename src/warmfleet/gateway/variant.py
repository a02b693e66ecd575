"""Live state of the gateway: variants -> instances, with load and health (active probes and
passive outlier detection, whose policy is ``gateway.outlier``).

All mutation happens on the event loop (no locks). Changes replace whole objects (a variant's
router, its instance dict), so a request that already holds a reference keeps using what it
started with: in-flight requests are untouched by a reconfiguration.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prometheus_client import Counter

from warmfleet.core.errors import NotFoundError
from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey
from warmfleet.gateway.config import FileDiscovery, InstanceSpec, VariantConfig
from warmfleet.gateway.departures import Departures
from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.metrics import FastValue, GatewayMetrics
from warmfleet.gateway.outlier import (
    EJECTED,
    PROBATION,
    Change,
    FailureCause,
    OutlierPolicy,
    PromptAvoidance,
)
from warmfleet.gateway.server_config import OutlierConfig
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.replica_notes import RoutedNote, SyncNote
from warmfleet.routing.replicas import ReplicaView
from warmfleet.routing.request import KeyRequest

log = logging.getLogger(__name__)


class RouterLike(Protocol):
    """What the gateway needs from ``warmfleet.routing.router.Router``."""

    def key(self, request: KeyRequest) -> RoutingKey: ...

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision: ...

    def on_routed(self, key: RoutingKey, decision: Decision) -> None: ...

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None: ...

    def adopt(self, previous: object) -> None: ...  # keep what ``previous`` learnt if it fits

    @property
    def engine_stats_interval_s(self) -> float | None:
        """How often its strategy wants the engines' queues and KV usage polled (None: never;
        ``gateway.engine_stats``)."""
        ...


RouterFactory = Callable[[RoutingConfig, random.Random], RouterLike]


class VariantRuntime:
    """A production variant: weight, served models, routing config + router, instances.
    ``healthy``: the instances taking traffic (the router is told of every change);
    ``routable``: those a new request may go to (minus a probation instance on trial)."""

    def __init__(
        self,
        endpoint: str,
        config: VariantConfig,
        factory: RouterFactory,
        metrics: GatewayMetrics,
        seed: int,
        *,
        outlier: OutlierConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.name = config.name
        self._factory = factory
        self._metrics = metrics
        self._seed = seed
        self._generation = 0
        self._clock = clock
        self.outlier_policy = OutlierPolicy(outlier or OutlierConfig(), clock)
        self.avoidance = PromptAvoidance()
        self.passive_ejection = True
        self._next_expiry_s = math.inf  # the soonest end of a passive ejection
        self.instances: dict[str, InstanceRuntime] = {}
        self.healthy: tuple[InstanceRuntime, ...] = ()
        self.routable: tuple[InstanceRuntime, ...] = ()
        self.on_routable: Callable[[VariantRuntime], None] | None = None  # hold, flow
        self._requests: dict[tuple[str, str, str], FastValue] = {}
        self.departures = Departures(metrics, endpoint, self.name, self._requests)  # their series
        self.series_gone = False  # removed, its series gone: a late count goes to an unexported one
        self.m_decision = metrics.decision.labels(endpoint, self.name)
        self.m_overhead = metrics.overhead.labels(endpoint, self.name)
        self.m_ttft = {s: metrics.ttft.labels(endpoint, self.name, s) for s in ("true", "false")}
        self.m_prefix_hits = metrics.prefix_hits.labels(endpoint, self.name)
        self.m_cached_blocks = metrics.cached_blocks.labels(endpoint, self.name)
        self.m_retries = metrics.retries.labels(endpoint, self.name)
        self.config = config
        self.routing_config = config.routing
        # replica sync (set by gateway/replica_sync): the peers' view, the notes' ways out and in
        self.replica: ReplicaView | None = None
        self.sync_out: Callable[[SyncNote], None] = lambda _note: None
        self.sync_in: Callable[[], None] = lambda: None
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
                self.departures.left(old, gone=iid not in new)
        self.instances = new
        self.departures.sweep(new)
        self.outlier_policy.release_excess([i.outlier for i in new.values()])
        self._outliers_changed()

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

    def _refresh_healthy(self, *, gauges: bool = False) -> None:
        """Recompute the healthy and routable sets; the router learns of every change of the
        healthy set (it purges the state of instances that left: a readmitted instance
        restarts with an empty cache), and only then are the requests waiting for a routable
        instance let go (``on_routable``: flow control drains its queue at once, through the
        router, so the router must already know the instances it drains to)."""
        instances = self.instances.values()
        healthy = tuple(i for i in instances if i.takes_traffic)
        before = self.routable
        self.routable = tuple(i for i in healthy if i.outlier.routable)
        changed = healthy != self.healthy
        self.healthy = healthy
        if changed:
            ids = [i.instance_id for i in healthy]
            (self.replica or self.router).on_instances_changed(ids)
        if changed or gauges:
            for inst in instances:
                self._gauges(inst)
        if self.routable and self.routable != before and self.on_routable is not None:
            self.on_routable(self)

    def _gauges(self, inst: InstanceRuntime) -> None:
        labels = (self.endpoint, self.name, inst.instance_id)
        standing = inst.outlier.standing
        self._metrics.healthy.labels(*labels).set(1 if inst.takes_traffic else 0)
        self._metrics.ejected.labels(*labels).set(1 if standing is EJECTED else 0)
        self._metrics.probation.labels(*labels).set(1 if standing is PROBATION else 0)

    def record_failure(self, inst: InstanceRuntime, threshold: int, cause: str) -> bool:
        """A failed health probe; ``threshold`` in a row eject. True if this ejected it."""
        inst.successes = 0
        inst.failures += 1
        if not inst.active_healthy or inst.failures < threshold:
            return False
        inst.active_healthy = False
        if not inst.removed:
            self._refresh_healthy()
            self._metrics.ejections.labels(self.endpoint, self.name, inst.instance_id, cause).inc()
        log.warning("ejected %s/%s/%s (%s)", self.endpoint, self.name, inst.instance_id, cause)
        return True

    def record_success(self, inst: InstanceRuntime, threshold: int) -> bool:
        """A good health probe; ``threshold`` in a row readmit. True if readmitted. A passive
        ejection is not ended by probes (its ``/health`` may have answered all along)."""
        inst.failures = 0
        inst.successes += 1
        if inst.active_healthy or inst.successes < threshold:
            return False
        inst.active_healthy = True
        if not inst.removed:
            self._refresh_healthy()
            if inst.takes_traffic:
                self._count_readmission(inst, "active")
        return True

    def _count_readmission(self, inst: InstanceRuntime, how: str) -> None:
        self._metrics.readmissions.labels(self.endpoint, self.name, inst.instance_id).inc()
        log.warning("readmitted %s/%s/%s (%s)", self.endpoint, self.name, inst.instance_id, how)

    # ---- passive outlier detection (fed by the proxy) -------------------------------------

    def configure_outlier(self, config: OutlierConfig, *, enabled: bool) -> None:
        """A new ``spec.health``: the next outcome uses it; switched off, every passively
        ejected instance is back at once."""
        policy = self.outlier_policy
        policy.config = config
        self.passive_ejection = enabled
        records = [i.outlier for i in self.instances.values()]
        changed = policy.release_excess(records) if enabled else policy.release_all(records)
        if not enabled:
            self.avoidance.entries.clear()
        if changed:
            self._outliers_changed()

    def passive_failure(
        self, inst: InstanceRuntime, cause: FailureCause, prompt: int | None = None
    ) -> Change:
        """A real request (for ``prompt``) failed on ``inst`` (a gateway failure): maybe eject
        it; the prompt avoids it for ``base_ejection_time_s``."""
        self._metrics.attempt_failures.labels(
            self.endpoint, self.name, inst.instance_id, cause.value
        ).inc()
        if not self.passive_ejection or inst.removed:
            return Change.NONE
        if prompt is not None:
            until_s = self._clock() + self.outlier_policy.config.base_ejection_time_s
            self.avoidance.record(prompt, inst.instance_id, until_s)
        records = [i.outlier for i in self.instances.values()]
        change = self.outlier_policy.on_failure(inst.outlier, cause, records)
        if change is Change.NONE:
            return change
        labels = (self.endpoint, self.name, inst.instance_id)
        if change is Change.EJECTED:
            self._metrics.ejections.labels(*labels, f"passive_{cause.value}").inc()
            log.warning("ejected %s/%s/%s (passive_%s)", *labels, cause.value)
        else:
            self._metrics.ejections_overflow.labels(*labels).inc()
        self._outliers_changed()
        return change

    def passive_success(self, inst: InstanceRuntime) -> Change:
        """A real request answered on ``inst``: resets its count; ends its probation."""
        change = self.outlier_policy.on_success(inst.outlier)
        if change is Change.READMITTED and not inst.removed:
            self._outliers_changed()
            self._count_readmission(inst, "probation passed")
        return change

    def avoided(self, prompt: int) -> set[str] | None:
        """The instance ``prompt`` failed on recently, to exclude from its first attempt; only
        while another instance is routable (never an empty choice)."""
        iid = self.avoidance.avoid(prompt, self._clock())
        if iid is None or not any(i.instance_id != iid for i in self.routable):
            return None
        return {iid}

    def begin_trial(self, inst: InstanceRuntime, owner: object) -> None:
        """``owner`` is the one request a probation instance gets until it has answered."""
        if self.outlier_policy.begin_trial(inst.outlier, owner):
            self._refresh_healthy()

    def end_trial(self, inst: InstanceRuntime, owner: object) -> None:
        if self.outlier_policy.end_trial(inst.outlier, owner):
            self._refresh_healthy()

    def expire_ejections(self) -> None:
        """Ejections whose time has passed become probation (also called by health rounds,
        so the admin view is current without traffic)."""
        records = [i.outlier for i in self.instances.values()]
        moved, self._next_expiry_s = self.outlier_policy.expire(records)
        if moved:
            self._refresh_healthy()
            for rec in moved:
                self._gauges(self.instances[rec.instance_id])
                log.warning("on probation %s/%s/%s", self.endpoint, self.name, rec.instance_id)

    def _outliers_changed(self) -> None:
        self._next_expiry_s = self.outlier_policy.next_ejection_end(
            i.outlier for i in self.instances.values()
        )
        self._refresh_healthy(gauges=True)

    # ---- hot path ------------------------------------------------------------------------

    def snapshot(self, exclude: set[str] | None = None) -> FleetSnapshot:
        now = self._clock()
        if now >= self._next_expiry_s:
            self.expire_ejections()
        routable = self.routable
        if exclude:
            routable = tuple(i for i in routable if i.instance_id not in exclude)
        replica = self.replica
        if replica is None:
            return FleetSnapshot(tuple([i.state for i in routable]), now)
        self.sync_in()
        # the fleet's in-flight load as this replica knows it: its own plus its peers'
        requests, tokens = replica.in_flight_requests, replica.in_flight_tokens
        states = [
            i.synced_state(requests.get(i.instance_id, 0), tokens.get(i.instance_id, 0))
            for i in routable
        ]
        return FleetSnapshot(tuple(states), now)

    def routed(self, router: RouterLike, key: RoutingKey, decision: Decision) -> RoutedNote | None:
        """The request goes to ``decision.instance_id``: ``router`` learns it; with replica sync,
        through the replica's view, and the note goes to the peers (``finished`` when it ends)."""
        replica = self.replica
        if replica is None or router is not self.router:  # a router replaced meanwhile
            router.on_routed(key, decision)
            return None
        note = replica.routed(key, decision)
        self.sync_out(note)
        return note

    def finished(self, note: RoutedNote) -> None:
        """The request of ``note`` (from ``routed``) ended, however it ended."""
        if self.replica is not None:
            self.sync_out(self.replica.finished(note))

    def request_counter(self, instance: str, reason: str, status: str) -> FastValue:
        key = (instance, reason, status)
        child = self._requests.get(key)
        if child is None:  # (removed and its series gone: one never exported, ``departures``)
            labels = (self.endpoint, self.name, *key)
            child = self._requests[key] = (
                FastValue() if self.series_gone else self._metrics.requests.labels(*labels)
            )
        return child

    def spill_counter(self, instance: str) -> Counter:
        return self._metrics.spills.labels(self.endpoint, self.name, instance)

    def describe(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "name": self.name,
            "weight": self.weight,
            "models": list(self.config.models),
            "routing": self.routing_config.model_dump(mode="json"),
            "discovery": self.config.discovery.model_dump(mode="json")
            if self.config.discovery
            else None,
            "instances": [i.describe(now) for i in self.instances.values()],
        }
