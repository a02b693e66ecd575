"""Acceptance 6: an instance dies mid-stream -> that stream ends with an error event (no hang,
and the ``openai`` client raises), requests not yet started go elsewhere, the instance is ejected
within two health intervals and readmitted after it returns; an instance whose /health answers
503 is ejected and recovers."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from gateway_support import (
    HEALTH,
    MODEL,
    backends_running,
    gateway_config,
    gateway_running,
    parse_sse,
)

from warmfleet.gateway.health import HealthMonitor
from warmfleet.gateway.variant import VariantRuntime

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "tell me"}]}


async def _rounds_until(
    health: HealthMonitor, variant: VariantRuntime, iid: str, healthy: bool
) -> int:
    """Health rounds completed until instance ``iid`` reaches ``healthy``."""
    rounds = 0
    while any(i.instance_id == iid for i in variant.healthy) != healthy:
        await asyncio.wait_for(health.wait_round(), 10)
        rounds += 1
        assert rounds < 50, "never changed"
    return rounds


async def test_kill_mid_stream_error_event_then_elsewhere() -> None:
    async with backends_running("a", "b", "c", chunks=4) as backends:
        a = backends[0]
        a.gate = asyncio.Event()  # a's streams stall after the first chunk
        config = gateway_config(backends, health={**HEALTH, "interval_s": 30, "timeout_s": 1})
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            resp = None
            for _ in range(3):  # round robin: one of the first three lands on a
                r = await client.post(
                    gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}
                )
                if r.headers["x-warmfleet-instance"] == "a":
                    resp = r
                    break
                await r.read()
            assert resp is not None
            first = await resp.content.readany()
            await a.kill()
            rest = await asyncio.wait_for(resp.read(), 10)  # ends, does not hang
            events = parse_sse(first + rest)
            assert json.loads(events[-1])["error"]["code"] == 502
            assert len(events) == 2

            # Requests not yet started go elsewhere (a is refused, retried, ejected). Other
            # prompts: the one that failed on a avoids a anyway (PromptAvoidance).
            for i in range(6):
                other = {**CHAT, "messages": [{"role": "user", "content": f"tell me {i}"}]}
                async with client.post(gw.url + "/v1/chat/completions", json=other) as r:
                    assert r.status == 200
                    assert r.headers["x-warmfleet-instance"] in {"b", "c"}
            variant = gw.gateway.state.default_endpoint().variant("v1")
            assert "a" not in [i.instance_id for i in variant.healthy]


async def test_openai_stream_raises_on_mid_stream_death() -> None:
    async with backends_running("a", chunks=4) as backends:
        backends[0].gate = asyncio.Event()
        async with (
            gateway_running(gateway_config(backends)) as gw,
            openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client,
        ):
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True
            )
            got = []

            async def consume() -> None:
                async for chunk in stream:
                    got.append(chunk.choices[0].delta.content)
                    await backends[0].kill()

            with pytest.raises(openai.APIError, match="failed mid-stream"):
                await consume()
            assert got == ["a-0 "]


async def test_active_ejection_within_two_intervals_and_readmission() -> None:
    async with backends_running("a", "b") as backends:
        a = backends[0]
        async with (
            gateway_running(gateway_config(backends, health=HEALTH)) as gw,
            aiohttp.ClientSession() as client,
        ):
            health = gw.gateway.health
            variant = gw.gateway.state.default_endpoint().variant("v1")
            await health.wait_round()
            assert len(variant.healthy) == 2

            await health.wait_round()  # kill right at a round boundary: no traffic, active only
            await a.kill()
            rounds = await _rounds_until(health, variant, "a", healthy=False)
            assert rounds <= 2  # unhealthy_threshold=2 probes, one per interval
            metrics = gw.gateway.metrics.render().decode()
            assert 'cause="active"' in metrics

            for _ in range(4):
                async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
                    assert r.headers["x-warmfleet-instance"] == "b"

            await health.wait_round()
            await a.restart()
            rounds = await _rounds_until(health, variant, "a", healthy=True)
            assert rounds <= 2  # healthy_threshold=2
            seen = set()
            for _ in range(4):
                async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200
                    seen.add(r.headers["x-warmfleet-instance"])
            assert seen == {"a", "b"}
            assert "warmfleet_gateway_readmissions_total" in gw.gateway.metrics.render().decode()


async def test_unhealthy_status_ejects_and_recovers() -> None:
    async with backends_running("a", "b") as backends:
        a = backends[0]
        async with gateway_running(gateway_config(backends, health=HEALTH)) as gw:
            health = gw.gateway.health
            variant = gw.gateway.state.default_endpoint().variant("v1")
            await health.wait_round()
            a.healthy = False  # /health answers 503
            await _rounds_until(health, variant, "a", healthy=False)
            a.healthy = True
            await _rounds_until(health, variant, "a", healthy=True)
