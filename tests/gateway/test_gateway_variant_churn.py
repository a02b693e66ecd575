"""A variant removed (a reload, an InferenceEndpoint deleted) takes every series labelled with
it along once its last request has ended: the request counters (``instance_id="none"`` too),
the decision, overhead and TTFT histograms, predicted hits, retries, flow control's series and
the hold's outcomes. A request still in flight (on an instance, parked in its flow gate or held)
keeps them until it ends; nothing re-creates them afterwards; a variant of that name added again
keeps its own."""

from __future__ import annotations

import asyncio
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

import aiohttp
from gateway_support import CHAT, backends_running, chat, gateway_doc, gateway_running

from support.waiting import wait_until
from warmfleet.core.types import RoutingKey
from warmfleet.flow.model import FlowRequest
from warmfleet.gateway import variant as variant_module
from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.routing.hold import HoldOutcome

FLOW: dict[str, Any] = {}  # flow control's defaults


def _doc(*variants: str, flow: bool = False) -> dict[str, Any]:
    routing: dict[str, Any] = {"strategy": {"type": "round_robin"}}
    if flow:
        routing["flow"] = FLOW
    made = [
        {
            "name": name,
            "routing": routing,
            "instances": [{"id": f"{name}-0", "url": f"http://10.0.0.{i + 1}:8000"}],
        }
        for i, name in enumerate(variants)
    ]
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"hold": {}, "endpoints": [{"name": "e", "variants": made}]},
    }


def _variants_with_series(gateway: Gateway) -> dict[str, set[str]]:
    """Variant -> the families (sample names) that have a series labelled with it."""
    found: dict[str, set[str]] = {}
    for family in gateway.metrics.registry.collect():
        for sample in family.samples:
            if "variant" in sample.labels:
                found.setdefault(sample.labels["variant"], set()).add(family.name)
    return found


def _traffic(gateway: Gateway, variant: VariantRuntime) -> None:
    """What requests leave behind on a variant: a series in each per-variant family."""
    variant.m_decision.observe(0.001)
    variant.m_overhead.observe(0.001)
    for child in variant.m_ttft.values():
        child.observe(0.01)
    variant.m_prefix_hits.inc()
    variant.m_cached_blocks.inc(3)
    variant.m_retries.inc()
    inst = next(iter(variant.instances))
    variant.request_counter(inst, "routed", "200").inc()
    variant.request_counter("none", "unavailable", "503").inc()
    flow = gateway.flow
    config = variant.routing_config.flow
    if config is not None:
        variant_flow = flow.flow_of(variant, config)
        variant_flow._observe_wait(_flow_request(), 0.01, "dispatched")
        flow.cancelled(variant_flow)
    waiter = gateway.hold.queue.admit((variant.endpoint, variant.name))
    assert waiter is not None
    gateway.hold.queue.leave(waiter, HoldOutcome.TIMEOUT)


def _flow_request() -> FlowRequest:
    return FlowRequest(0, RoutingKey((1,), 1, 1, 1, 1, 1), "t", 0, 0.0)


def _remove(gateway: Gateway, *keep: str, flow: bool = False) -> None:
    gateway.apply(parse_gateway_config(_doc(*keep, flow=flow)), "test")


def _gateway(flow: bool = False) -> Gateway:
    return Gateway(parse_gateway_config(_doc("v", "w", flow=flow)), default_router_factory)


def test_a_removed_variant_leaves_no_series_behind() -> None:
    gateway = _gateway(flow=True)
    endpoint = gateway.state.endpoint("e")
    for name in ("v", "w"):
        _traffic(gateway, endpoint.variant(name))
    before = _variants_with_series(gateway)
    assert before["v"] == before["w"]
    assert len(before["v"]) >= 12, before["v"]  # every per-variant family has one
    _remove(gateway, "w", flow=True)
    gateway.state.forget_departed()  # what every health round does
    assert _variants_with_series(gateway).keys() == {"w"}
    assert _variants_with_series(gateway)["w"] == before["w"]


def test_removed_variants_do_not_pile_up() -> None:
    """A variant replaced 50 times (say, a canary renamed each rollout): only the live one."""
    gateway = _gateway()
    for rollout in range(50):
        name = f"canary-{rollout}"
        _remove(gateway, "w", name)
        _traffic(gateway, gateway.state.endpoint("e").variant(name))
        gateway.state.forget_departed()
    assert _variants_with_series(gateway).keys() == {"w", "canary-49"}


def test_a_request_in_flight_keeps_the_series_until_it_ends() -> None:
    gateway = _gateway()
    old = gateway.state.endpoint("e").variant("v")
    _traffic(gateway, old)
    inst = old.instances["v-0"]
    inst.add_load(1, 100)  # a request in flight to it
    _remove(gateway, "w")
    gateway.state.forget_departed()
    assert "v" in _variants_with_series(gateway)
    old.m_ttft["true"].observe(0.5)  # it ends, and counts
    old.request_counter("v-0", "routed", "200").inc()
    inst.add_load(-1, -100)
    labels = {"endpoint": "e", "variant": "v", "stream": "true"}
    ttft = "warmfleet_gateway_ttft_seconds_count"
    assert gateway.metrics.registry.get_sample_value(ttft, labels) == 2.0
    gateway.state.forget_departed()
    assert _variants_with_series(gateway).keys() == {"w"}


async def test_a_held_or_parked_request_keeps_the_series_until_it_ends() -> None:
    gateway = _gateway(flow=True)
    old = gateway.state.endpoint("e").variant("v")
    _traffic(gateway, old)
    waiter = gateway.hold.queue.admit(("e", "v"))  # held: no instance ready
    assert waiter is not None
    config = old.routing_config.flow
    assert config is not None
    parked = gateway.flow.flow_of(old, config).parked
    parked[7] = (asyncio.get_running_loop().create_future(), old.router)  # in its gate
    _remove(gateway, "w", flow=True)
    gateway.state.forget_departed()
    assert "v" in _variants_with_series(gateway)
    parked.clear()  # dispatched or shed
    gateway.state.forget_departed()
    assert "v" in _variants_with_series(gateway)  # still held
    gateway.hold.queue.leave(waiter, HoldOutcome.TIMEOUT)
    gateway.state.forget_departed()
    assert _variants_with_series(gateway).keys() == {"w"}


def test_a_late_count_on_a_forgotten_variant_brings_nothing_back() -> None:
    """A request that picked the variant before it went and holds no instance (keying a big
    body off the loop) counts after its series went: nothing is exported."""
    gateway = _gateway()
    old = gateway.state.endpoint("e").variant("v")
    _remove(gateway, "w")
    gateway.state.forget_departed()
    old.request_counter("none", "unavailable", "503").inc()
    assert "v" not in _variants_with_series(gateway)


def test_the_flag_each_request_reads_is_a_native_attribute_of_the_compiled_variant() -> None:
    """Every flow-controlled or held request asks whether its variant's series went: the flag is
    a field of ``VariantRuntime`` (compiled by mypyc: a native attribute read), not of the
    interpreted ``Departures`` (a dictionary lookup on each request). It is set once the
    removed variant's series go, never before."""
    assert str(variant_module.__file__).endswith(tuple(EXTENSION_SUFFIXES))
    assert "series_gone" in VariantRuntime.__dict__  # mypyc's descriptor of a native field
    gateway = _gateway()
    old = gateway.state.endpoint("e").variant("v")
    assert old.series_gone is False
    _remove(gateway, "w")
    assert old.series_gone is False  # removed; its series still there
    gateway.state.forget_departed()
    assert old.series_gone is True
    assert gateway.state.endpoint("e").variant("w").series_gone is False


def test_a_variant_added_again_keeps_its_series() -> None:
    gateway = _gateway()
    old = gateway.state.endpoint("e").variant("v")
    _traffic(gateway, old)
    inst = old.instances["v-0"]
    inst.add_load(1, 100)
    _remove(gateway, "w")
    _remove(gateway, "v", "w")  # back before the request ended: a new VariantRuntime
    assert gateway.state.endpoint("e").variant("v") is not old
    inst.add_load(-1, -100)
    gateway.state.forget_departed()
    assert _variants_with_series(gateway)["v"] >= {"warmfleet_gateway_decision_seconds"}


async def test_a_reloaded_config_without_the_variant_clears_metrics() -> None:
    """The running gateway: requests through ``v`` and ``w``, then ``v`` removed by a config
    change: after a health round ``/metrics`` names no ``variant="v"``."""
    async with backends_running("a", "b") as (a, b):
        variants = [
            {"name": name, "models": ["fake-model"], "instances": [{"id": f.name, "url": f.url}]}
            for name, f in (("v", a), ("w", b))
        ]
        doc = gateway_doc([], variants=variants)
        async with gateway_running(parse_gateway_config(doc)) as started:
            gateway = started.gateway
            body = chat([{"role": "user", "content": "hello"}])
            async with aiohttp.ClientSession() as http:
                for name in ("v", "w", "v", "w"):
                    headers = {gateway.state.variant_header: name}
                    async with http.post(started.url + CHAT, json=body, headers=headers) as resp:
                        assert resp.status == 200, await resp.text()
            assert {"v", "w"} <= _variants_with_series(gateway).keys()
            doc["spec"]["endpoints"][0]["variants"] = variants[1:]
            gateway.apply(parse_gateway_config(doc), "test")
            rounds = gateway.health.rounds_completed
            await wait_until(lambda: gateway.health.rounds_completed > rounds, what="a round")
            async with aiohttp.ClientSession() as http, http.get(started.url + "/metrics") as r:
                text = await r.text()
            assert 'variant="v"' not in text
            assert 'variant="w"' in text
