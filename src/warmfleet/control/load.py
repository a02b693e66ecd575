"""Load signals for the autoscaler: the gateway's in-flight gauge, and one scaling decision per
variant (pure; the caller keeps the ``AutoscalerState`` between calls)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from warmfleet.api import names
from warmfleet.control.autoscaler import AutoscalerState, recommend
from warmfleet.control.observed import DesiredEndpoint, ObservedDeployment

IN_FLIGHT_METRIC = "warmfleet_gateway_in_flight_requests"
# Requests the gateway holds for a variant with no ready replica (``routing.hold``): the demand
# that brings a variant scaled to zero back; counted with the in-flight ones.
HELD_METRIC = "warmfleet_gateway_held_requests"
# Requests waiting in a variant's flow-control queue (``routing.flow``: overload, or no ready
# replica), one sample per (band, tenant): demand too.
FLOW_QUEUED_METRIC = "warmfleet_gateway_flow_queued_requests"
_LOAD_METRICS = frozenset((IN_FLIGHT_METRIC, HELD_METRIC, FLOW_QUEUED_METRIC))
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

VariantKey = tuple[str, str]  # (endpoint, variant)


def in_flight_by_variant(texts: Iterable[str]) -> dict[VariantKey, float]:
    """Sum ``warmfleet_gateway_in_flight_requests`` over instances, plus
    ``warmfleet_gateway_held_requests`` (requests waiting for a first ready replica) and
    ``warmfleet_gateway_flow_queued_requests`` (waiting in flow control's queue, over bands and
    tenants), over every gateway's Prometheus text exposition.

    A variant with a NaN, infinite or negative sample is left out (its total is unknown: the
    autoscaler then keeps its count, as for a variant without a sample)."""
    totals: dict[VariantKey, float] = {}
    unknown: set[VariantKey] = set()
    for text in texts:
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None or match["name"] not in _LOAD_METRICS:
                continue
            labels = dict(_LABEL.findall(match["labels"] or ""))
            key = (labels.get("endpoint", ""), labels.get("variant", ""))
            try:
                value = float(match["value"])
            except ValueError:
                continue
            if not math.isfinite(value) or value < 0.0:
                unknown.add(key)
            totals[key] = totals.get(key, 0.0) + value
    return {k: v for k, v in totals.items() if k not in unknown}


def autoscale(
    endpoints: Sequence[DesiredEndpoint],
    deployments: Sequence[ObservedDeployment],
    in_flight: Mapping[VariantKey, float],
    now_s: float,
    states: Mapping[VariantKey, AutoscalerState],
    *,
    partial: bool = False,
) -> tuple[dict[str, dict[str, int]], dict[VariantKey, AutoscalerState]]:
    """Replicas per endpoint and variant for every autoscaled variant, and the new states.

    The current count is the variant's Deployment at the endpoint's newest revision (else the
    previous decision, else the spec's replicas). Variants without a metric sample keep their count.
    ``partial``: some gateways could not be scraped, so each total is only a lower bound of the
    load; it may scale a variant up, never down (a recommendation below the current count keeps
    the count and the previous state, as for a variant without a sample).
    """
    decisions: dict[str, dict[str, int]] = {}
    new_states: dict[VariantKey, AutoscalerState] = {}
    for endpoint in endpoints:
        if endpoint.deleting:
            continue
        for variant in endpoint.spec.variants:
            if not variant.autoscaling.enabled:
                continue
            key = (endpoint.name, variant.name)
            current = _current(endpoint, variant.name, variant.replicas, deployments)
            rec = None
            if key in in_flight:
                rec = recommend(
                    variant.autoscaling, current, in_flight[key], now_s, states.get(key)
                )
            if rec is None or (partial and rec.replicas < current):  # hold: count and state
                decisions.setdefault(endpoint.name, {})[variant.name] = current
                if key in states:
                    new_states[key] = states[key]
                continue
            decisions.setdefault(endpoint.name, {})[variant.name] = rec.replicas
            new_states[key] = rec.state
    return decisions, new_states


def _current(
    endpoint: DesiredEndpoint, variant: str, default: int, deployments: Sequence[ObservedDeployment]
) -> int:
    """The variant's replicas the autoscaler starts from: its Deployment's; during a rollover
    the last decision (the new revision's Deployment holds only a rolling step, and scaling
    from that shrank the old one with it), else the largest Deployment's."""
    mine = [d for d in deployments if d.endpoint == endpoint.name and d.variant == variant]
    rev = names.revision(endpoint.spec)
    if any(d.revision != rev for d in mine):
        last = endpoint.autoscaled_replicas.get(variant)
        return last if last is not None else max(d.replicas for d in mine)
    if mine:
        return max(d.replicas for d in mine)
    return endpoint.autoscaled_replicas.get(variant, default)
