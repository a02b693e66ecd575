"""Pods come and go: an instance that leaves takes every per-instance series with it (gauges at
once; counters, and the variant's cached request counters, once no request is in flight to it),
so neither ``/metrics`` nor the process grows with every rollout. A request still in flight to a
departed instance counts into its series, which go at the first sweep after it ended (a change
of the instance set, or a health round); nothing re-creates them afterwards."""

from __future__ import annotations

from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import InstanceSpec, parse_gateway_config
from warmfleet.gateway.outlier import FailureCause
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.variant import VariantRuntime

PER_INSTANCE = (
    "requests",
    "in_flight_requests",
    "instance_healthy",
    "instance_kv_capacity_blocks",
    "spills",
    "ejections",
    "attempt_failures",
    "ejections_overflow",
    "instance_ejected",
    "instance_on_probation",
    "readmissions",
)


def _gateway(passive: bool = True) -> Gateway:
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "health": {"passiveEjection": passive, "outlier": {"maxEjectionPercent": 50}},
            "endpoints": [{"name": "e", "variants": [{"name": "v", "instances": []}]}],
        },
    }
    return Gateway(parse_gateway_config(doc), default_router_factory)


def _specs(rollout: int) -> list[InstanceSpec]:
    return [
        InstanceSpec(id=f"pod-{rollout}-{k}", url=f"http://10.0.{k}.{rollout % 250 + 1}:8000")
        for k in range(4)
    ]


def _series(gateway: Gateway) -> dict[str, set[str]]:
    """Per-instance metric -> the instance ids it has series for."""
    found: dict[str, set[str]] = {name: set() for name in PER_INSTANCE}
    for family in gateway.metrics.registry.collect():
        name = family.name.removeprefix("warmfleet_gateway_")
        for sample in family.samples:
            if name in found and "instance_id" in sample.labels:
                found[name].add(sample.labels["instance_id"])
    return found


def _traffic(variant: VariantRuntime) -> None:
    """What requests and probes leave behind on every instance: every per-instance series."""
    for inst in variant.instances.values():
        variant.request_counter(inst.instance_id, "routed", "200").inc()
        variant.request_counter(inst.instance_id, "routed", "client_disconnect").inc()
        variant.spill_counter(inst.instance_id).inc()
        variant.passive_failure(inst, FailureCause.CONNECT)  # ejected, or refused (overflow)
    for inst in variant.instances.values():
        variant.record_failure(inst, 1, "active")
        variant.record_success(inst, 1)  # readmitted


def test_rollouts_leave_no_series_behind() -> None:
    gateway = _gateway()
    variant = gateway.state.endpoint("e").variant("v")
    for rollout in range(1, 201):
        variant.set_instances(_specs(rollout))  # 4 new pods replace the previous 4
        _traffic(variant)
        if rollout == 1:  # every per-instance metric has series
            live = {f"pod-1-{k}" for k in range(4)}
            assert all(ids and ids <= live for ids in _series(gateway).values())
    live = {f"pod-200-{k}" for k in range(4)}
    series = _series(gateway)
    assert all(ids and ids <= live for ids in series.values()), series
    assert series["requests"] == live
    assert {key[0] for key in variant._requests} == live
    assert len(variant._requests) == 8


def test_a_request_in_flight_to_a_departed_instance_counts_then_its_series_go() -> None:
    gateway = _gateway()
    variant = gateway.state.endpoint("e").variant("v")
    variant.set_instances(_specs(1))
    _traffic(variant)
    gone = variant.instances["pod-1-0"]
    gone.add_load(1, 100)  # one request in flight to it
    variant.set_instances(_specs(1)[1:])  # it leaves
    assert "pod-1-0" not in _series(gateway)["in_flight_requests"]  # gauges go at once
    assert "pod-1-0" in _series(gateway)["requests"]  # counters wait for the request
    variant.request_counter("pod-1-0", "routed", "200").inc()  # it ends, and counts
    variant.passive_failure(gone, FailureCause.TIMEOUT)  # (or failed)
    gone.add_load(-1, -100)
    requests = gateway.metrics.registry.get_sample_value(
        "warmfleet_gateway_requests_total",
        {"endpoint": "e", "variant": "v", "instance_id": "pod-1-0", "reason": "routed",
         "status": "200"},
    )  # fmt: skip
    assert requests == 2.0
    gateway.state.forget_departed()  # what every health round does
    assert all("pod-1-0" not in ids for ids in _series(gateway).values())
    assert all(key[0] != "pod-1-0" for key in variant._requests)
    assert _series(gateway)["requests"] == {"pod-1-1", "pod-1-2", "pod-1-3"}


def test_a_departed_instance_that_returns_keeps_its_series() -> None:
    gateway = _gateway()
    variant = gateway.state.endpoint("e").variant("v")
    variant.set_instances(_specs(1))
    _traffic(variant)
    variant.instances["pod-1-0"].add_load(1, 100)
    variant.set_instances(_specs(1)[1:])
    variant.set_instances(_specs(1))  # back before its request ended
    gateway.state.forget_departed()
    assert "pod-1-0" in _series(gateway)["requests"]
    variant.set_instances([])  # every instance leaves: only the one in flight stays counted
    assert _series(gateway)["requests"] == {"pod-1-0"}
    assert _series(gateway)["instance_healthy"] == set()


def test_a_removed_variant_forgets_its_instances_once_drained() -> None:
    gateway = _gateway()
    variant = gateway.state.endpoint("e").variant("v")
    variant.set_instances(_specs(1))
    _traffic(variant)
    inst = variant.instances["pod-1-0"]
    inst.add_load(1, 100)
    doc = gateway.base_config.model_dump(mode="json", by_alias=True)
    doc["spec"]["endpoints"][0]["variants"][0]["name"] = "w"  # v goes, w comes
    gateway.apply(parse_gateway_config(doc), "test")
    assert _series(gateway)["requests"] == {"pod-1-0"}
    inst.add_load(-1, -100)
    gateway.state.forget_departed()
    assert _series(gateway)["requests"] == set()
