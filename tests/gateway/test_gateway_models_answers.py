"""``/v1/models`` when one instance's answer is bad (truncated, nested too deep, too large):
only that instance's models are dropped, counted by reason, and the others' are listed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gateway_support import (
    MODEL,
    FakeBackend,
    gateway_config,
    gateway_running,
    nested,
)

from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import InstanceSpec, parse_gateway_config
from warmfleet.gateway.openai.models import ModelsCache
from warmfleet.gateway.runtime import Gateway

# --------------------------------------------------------------------------------------------
# /v1/models: one instance's bad answer drops only its models


class ModelsAnswer(FakeBackend):
    def __init__(self, name: str, answer: bytes) -> None:
        super().__init__(name)
        self.answer = answer

    async def _models(self, request: web.Request) -> web.Response:
        return web.Response(body=self.answer, content_type="application/json")


def models_answer(entry_extra: Any) -> bytes:
    entry = {"id": "evil-model", "object": "model", "x": entry_extra}
    return json.dumps({"object": "list", "data": [entry]}).encode()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b'{"object": "list", "data": [{"id": "evil-model", "x": ' + b"[" * 5000, "malformed"),
        (b'{"data": [{"id": "evil-model", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}]}", "malformed"),
        (models_answer(nested(40)), "too_deep"),
        (models_answer("z" * (5 << 20)), "too_large"),
    ],
    ids=["truncated deep", "deep", "deep within the parser", "too large"],
)
async def test_one_bad_models_answer_drops_only_that_instance(answer: bytes, reason: str) -> None:
    good, evil = FakeBackend("good"), ModelsAnswer("evil", answer)
    for backend in (good, evil):
        await backend.start()
    try:
        config = gateway_config([good, evil], models=())
        async with gateway_running(config) as gw, aiohttp.ClientSession() as http:
            await wait_healthy(gw.gateway.state, 2)
            async with http.get(gw.url + "/v1/models") as resp:
                assert resp.status == 200
                listed = [e["id"] for e in (await resp.json())["data"]]
            assert listed == [MODEL]
            registry = gw.gateway.metrics.registry
            labels = {"instance_id": "evil", "reason": reason}
            value = registry.get_sample_value(
                "warmfleet_gateway_models_answers_dropped_total", labels
            )
            assert value == 1
    finally:
        for backend in (good, evil):
            await backend.stop()


async def wait_healthy(state: Any, count: int) -> None:
    for _ in range(500):
        if sum(len(v.healthy) for v in state.variants()) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("instances not healthy in time")


# --------------------------------------------------------------------------------------------
# the dropped answers' series live as long as their instance id


def _dropped_ids(gateway: Gateway) -> set[str]:
    found: set[str] = set()
    for family in gateway.metrics.registry.collect():
        if family.name == "warmfleet_gateway_models_answers_dropped":
            found |= {s.labels["instance_id"] for s in family.samples if s.name.endswith("_total")}
    return found


def _two_variants(url: str) -> Gateway:
    """Endpoint ``e``: variants ``v`` (pods ``pod-0``, ``shared``) and ``w`` (``shared`` too),
    all at ``url``, serving any model."""
    instances = [{"id": "pod-0", "url": url}, {"id": "shared", "url": url}]
    variants = [
        {"name": "v", "instances": instances},
        {"name": "w", "instances": [{"id": "shared", "url": url}]},
    ]
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"endpoints": [{"name": "e", "variants": variants}]},
    }
    return Gateway(parse_gateway_config(doc), default_router_factory)


async def test_a_departed_instances_dropped_answers_series_goes() -> None:
    """Pods replaced 20 times, each answering malformed: only the live ids keep a series (an
    id still in another variant keeps its own)."""
    evil = ModelsAnswer("evil", b"{")
    await evil.start()
    try:
        gateway = _two_variants(evil.url)
        variant = gateway.state.endpoint("e").variant("v")
        async with aiohttp.ClientSession() as session:
            cache = ModelsCache(gateway.state, session)
            for rollout in range(1, 21):
                await cache.get()
                cache.invalidate()
                pods = [InstanceSpec(id=f"pod-{rollout}", url=evil.url)]
                variant.set_instances(pods)  # the pod replaced, "shared" leaves v
                gateway.state.forget_departed()  # what every health round does
            assert _dropped_ids(gateway) == {"shared"}  # w still has it
            await cache.get()
        assert _dropped_ids(gateway) == {"shared", "pod-20"}
    finally:
        await evil.stop()


class HeldAnswer(ModelsAnswer):
    """A malformed answer, sent once ``answer_now`` is set; ``asked`` is set when it is asked."""

    def __init__(self, name: str) -> None:
        super().__init__(name, b"{")
        self.asked = asyncio.Event()
        self.answer_now = asyncio.Event()

    async def _models(self, request: web.Request) -> web.Response:
        self.asked.set()
        await self.answer_now.wait()
        return await super()._models(request)


async def test_an_answer_read_after_its_instance_left_counts_no_series() -> None:
    """A refresh in flight when the instance leaves: its malformed answer, read after the
    instance's series went, does not bring them back."""
    evil = HeldAnswer("evil")
    await evil.start()
    try:
        gateway = _two_variants(evil.url)
        async with aiohttp.ClientSession() as session:
            cache = ModelsCache(gateway.state, session)
            refresh = asyncio.create_task(cache.get())
            await asyncio.wait_for(evil.asked.wait(), 10)
            gateway.state.endpoint("e").variant("v").set_instances([])
            gateway.state.forget_departed()
            evil.answer_now.set()
            await asyncio.wait_for(refresh, 10)
        assert _dropped_ids(gateway) == {"shared"}  # w's, answered in the same refresh
    finally:
        evil.answer_now.set()
        await evil.stop()
