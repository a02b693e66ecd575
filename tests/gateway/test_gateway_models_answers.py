"""``/v1/models`` when one instance's answer is bad (truncated, nested too deep, too large):
only that instance's models are dropped, counted by reason, and the others' are listed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gateway_support import MODEL, FakeBackend, gateway_config, gateway_running, nested

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
