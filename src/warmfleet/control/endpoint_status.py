"""InferenceEndpoint status: phase, cache summaries, replicas, unprepared share, conditions."""

from __future__ import annotations

from collections.abc import Sequence

from warmfleet.api import names
from warmfleet.api.resources import (
    CacheState,
    CacheSummary,
    Condition,
    EndpointPhase,
    EndpointStatus,
    ProductionVariant,
    ReplicaStatus,
)
from warmfleet.control.claims import NameConflict, conflict_condition
from warmfleet.control.observed import (
    DesiredEndpoint,
    ObservedDeployment,
    ObservedReplica,
    ObservedState,
)
from warmfleet.control.placement import unprepared_share
from warmfleet.control.status import cache_state, count, target_nodes


def variant_replicas(endpoint: DesiredEndpoint, variant: ProductionVariant) -> int:
    """The variant's replica count: fixed, or the autoscaler's output clamped to its bounds."""
    scaling = variant.autoscaling
    if not scaling.enabled:
        return variant.replicas
    wanted = endpoint.autoscaled_replicas.get(variant.name, variant.replicas)
    return max(scaling.min_replicas, min(scaling.max_replicas, wanted))


def _weights_summary(endpoint: DesiredEndpoint, observed: ObservedState) -> CacheSummary | None:
    if not endpoint.spec.model_cache_config.weights_cache.enabled:
        return None
    name = names.model_cache_name(endpoint.name, endpoint.spec)
    nodes = target_nodes(observed.nodes, endpoint.spec.node_selector)
    counts = count([n.weights.get(name) for n in nodes])
    state = cache_state(counts) if observed.model_cache(name) else CacheState.PENDING
    return CacheSummary(
        name=name, state=state, ready_nodes=counts.ready, target_nodes=counts.target
    )


def _image_summary(endpoint: DesiredEndpoint, observed: ObservedState) -> CacheSummary | None:
    if not endpoint.spec.model_cache_config.image_cache.enabled:
        return None
    name = names.image_cache_name(endpoint.spec.image, endpoint.spec.node_selector)
    nodes = target_nodes(observed.nodes, endpoint.spec.node_selector)
    counts = count([n.images.get(name) for n in nodes])
    state = cache_state(counts) if observed.image_cache(name) else CacheState.PENDING
    return CacheSummary(
        name=name, state=state, ready_nodes=counts.ready, target_nodes=counts.target
    )


def _switching_cache(endpoint: DesiredEndpoint, current: list[ObservedDeployment]) -> bool:
    """A Deployment of the current revision does not load from the endpoint's weights cache yet
    (caching was just enabled: it switches once the gate opens)."""
    weights = endpoint.spec.model_cache_config.weights_cache
    cache = names.model_cache_name(endpoint.name, endpoint.spec) if weights.enabled else None
    return any(d.model_cache != cache for d in current)


def _phase(
    deleting: bool, gated: bool, deployed: bool, rolling: bool, all_ready: bool
) -> EndpointPhase:
    if deleting:
        return EndpointPhase.DELETING
    if gated:
        return EndpointPhase.GATED
    if not deployed:
        return EndpointPhase.DEPLOYING
    if rolling:
        return EndpointPhase.ROLLING
    return EndpointPhase.READY if all_ready else EndpointPhase.DEPLOYING


def _replica_status(pods: Sequence[ObservedReplica], rev: str) -> tuple[ReplicaStatus, ...]:
    return tuple(
        ReplicaStatus(
            name=p.name,
            node=p.node,
            revision=rev,
            prepared=p.prepared,
            ready=p.ready,
            time_to_ready_s=None if p.ready_s is None else round(p.ready_s - p.started_s, 3),
        )
        for p in pods
    )


def endpoint_status(
    endpoint: DesiredEndpoint,
    observed: ObservedState,
    gate: tuple[bool, str, str],
    conflicts: Sequence[NameConflict] = (),
) -> EndpointStatus:
    """``conflicts``: names it needs that are held elsewhere (``control.claims``)."""
    rev = names.revision(endpoint.spec)
    mine = [d for d in observed.deployments if d.endpoint == endpoint.name]
    current = [d for d in mine if d.revision == rev]
    pods = sorted((p for d in current for p in d.pods), key=lambda p: p.name)
    wanted = sum(variant_replicas(endpoint, v) for v in endpoint.spec.variants)
    ready = sum(1 for p in pods if p.ready)
    # Serving capacity counts every revision (Kubernetes' Deployment ``Available``: minimum
    # availability): during a rollover the old revision's replicas still take traffic.
    serving = sum(1 for d in mine for p in d.pods if p.ready)
    gate_open, gate_reason, gate_message = gate
    gated = not gate_open and (not current or _switching_cache(endpoint, current))
    rolling = any(d.revision != rev for d in mine)
    phase = _phase(endpoint.deleting, gated, bool(current), rolling, ready >= wanted)
    conditions = [
        Condition(
            type="WeightsGateOpen",
            status="False" if gated else "True",
            reason=gate_reason,
            message=gate_message,
        ),
        Condition(
            type="Available",
            status="True" if serving > 0 or wanted == 0 else "False",
            reason=phase.value,
            message=f"{serving} replicas serving; {ready}/{wanted} of revision {rev} ready",
        ),
    ]
    conflict = conflict_condition(conflicts)
    if conflict is not None:
        conditions.append(conflict)
    return EndpointStatus(
        phase=phase,
        revision=rev,
        weights_cache=_weights_summary(endpoint, observed),
        image_cache=_image_summary(endpoint, observed),
        replicas=wanted,
        ready_replicas=ready,
        unprepared_replica_share=round(unprepared_share([p.prepared for p in pods]), 6),
        replica_status=_replica_status(pods, rev),
        conditions=tuple(conditions),
    )
