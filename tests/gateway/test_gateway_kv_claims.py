"""Exact mode with late engine events: a conversation's next turn, sent as soon as its first
turn answered and before that turn's KV events reached the gateway, goes where the first turn
went (``routing.claims``); with ``claimTtlS: 0`` it starts cold elsewhere. The events pass
through a relay that holds each batch for ``DELAY_S``, as a busy engine, network or relay does;
the gateway's metrics and admin view show that delay and how the claims ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families
from test_gateway_kv_events_config import (
    BLOCK,
    HEADERS,
    MODEL,
    cached_tokens,
    document,
    two_engines,
    warm_until_exact,
    words,
)

from warmfleet.bench.live_procs import free_port
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import load_gateway_config
from warmfleet.gateway.server import StartedApp, start_app

DELAY_S = 1.0  # well past a turn's answer on a loaded machine (the emulator answers in ms)
CONVERSATIONS = 4


async def delaying_relay(upstream: str, downstream: str, delay_s: float) -> None:
    """Engines' PUB sockets connect to ``upstream``; every batch is republished on
    ``downstream`` ``delay_s`` later, in order."""
    context = zmq.asyncio.Context()
    sub, pub = context.socket(zmq.SUB), context.socket(zmq.PUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(upstream)
    pub.bind(downstream)
    loop = asyncio.get_running_loop()
    try:
        while True:
            frames = await sub.recv_multipart()
            loop.call_later(delay_s, pub.send_multipart, frames)
    finally:
        sub.close(linger=0)
        pub.close(linger=0)
        context.term()


@contextlib.asynccontextmanager
async def late_events_gateway(
    tmp_path: Path, claim_ttl_s: float
) -> AsyncIterator[tuple[StartedApp, EmulatedFleet]]:
    engines, gateway_side = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    relay = asyncio.create_task(delaying_relay(engines, gateway_side, DELAY_S))
    spec = two_engines(engines, 256)
    try:
        async with EmulatedFleet(spec) as fleet:
            instances = [{"id": f"emu-{i}", "url": u} for i, u in enumerate(fleet.urls)]
            events = {"endpoint": gateway_side, "bind": False, "resyncBatches": 2}
            doc = document(instances, kv_events=events)
            variant = doc["spec"]["endpoints"][0]["variants"][0]
            variant["routing"]["strategy"]["claimTtlS"] = claim_ttl_s
            path = tmp_path / "gateway.yaml"
            path.write_text(yaml.safe_dump(doc))
            app = create_app(load_gateway_config(path), tokenizer=EmulatorTokenizer())
            started = await start_app(app)
            try:
                yield started, fleet
            finally:
                await started.stop()
    finally:
        relay.cancel()
        await asyncio.gather(relay, return_exceptions=True)


async def turn(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]
) -> tuple[int, str, str]:
    """(cached prompt tokens, instance, reason) of one chat turn through the gateway."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "ignore_eos": True}
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        headers = resp.headers
    return cached_tokens(answer), headers["x-warmfleet-instance"], headers["x-warmfleet-reason"]


async def second_turns(started: StartedApp, fleet: EmulatedFleet) -> list[tuple[bool, str, int]]:
    """Per conversation: (second turn on the first's instance, its reason, cached tokens)."""
    out = []
    async with aiohttp.ClientSession() as session:
        await warm_until_exact(started, fleet, session)
        await asyncio.sleep(DELAY_S + 0.3)  # the warm-up's events are in
        for c in range(CONVERSATIONS):
            messages = [
                {"role": "system", "content": f"conversation {c} " + words(31 + c, 160)},
                {"role": "user", "content": "first question " + words(90 + c, 20)},
            ]
            _, first, _ = await turn(session, started.url, messages)
            messages += [
                {"role": "assistant", "content": "an answer"},
                {"role": "user", "content": "second question " + words(60 + c, 20)},
            ]
            cached, second, reason = await turn(session, started.url, messages)
            out.append((second == first, reason, cached))
            await asyncio.sleep(DELAY_S + 0.3)  # the next conversation starts on a settled view
    return out


async def observed(url: str) -> tuple[dict[str, float], dict[str, Any]]:
    """The gateway's samples (``name{label=value,...}`` -> value) and its kv-events state."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        async with session.get(f"{url}/admin/v1/kv-events", headers=HEADERS) as resp:
            state: dict[str, Any] = await resp.json()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples, state


async def test_next_turns_before_their_events_stay_with_claims(tmp_path: Path) -> None:
    async with late_events_gateway(tmp_path, claim_ttl_s=5.0) as (started, fleet):
        results = await second_turns(started, fleet)
        samples, state = await observed(started.url)
    assert all(stayed for stayed, _, _ in results), results
    assert {reason for _, reason, _ in results} == {"prefix_hit"}, results
    assert all(cached >= 8 * BLOCK for _, _, cached in results), results  # the engine agrees
    # Every batch passed the relay: none arrived sooner than DELAY_S after its engine's stamp.
    delays = "warmfleet_gateway_kv_events_delay_seconds"
    assert samples[f"{delays}_count{{}}"] > 0
    assert samples[f"{delays}_bucket{{le=0.5}}"] == 0
    assert samples[f"{delays}_sum{{}}"] >= DELAY_S * samples[f"{delays}_count{{}}"]
    # Each first turn claimed its new blocks; the engine's events confirmed them in the TTL.
    claimed = samples["warmfleet_gateway_kv_claims_blocks_total{}"]
    ended = {
        outcome: samples[f"warmfleet_gateway_kv_claims_ended_blocks_total{{outcome={outcome}}}"]
        for outcome in ("confirmed", "late", "lapsed", "displaced")
    }
    assert claimed >= CONVERSATIONS * 8, samples
    assert ended["confirmed"] >= CONVERSATIONS * 8, ended
    assert ended["late"] == ended["displaced"] == 0, ended
    assert sum(ended.values()) <= claimed
    assert state["claims"] == {
        "ttl_s": 5.0,
        "blocks": {"claimed": claimed, **ended},
    }, state
    assert {view["claimed_blocks"] for view in state["instances"].values()} == {0}, state


async def test_without_claims_next_turns_before_their_events_start_cold(tmp_path: Path) -> None:
    async with late_events_gateway(tmp_path, claim_ttl_s=0.0) as (started, fleet):
        results = await second_turns(started, fleet)
    assert all(reason == "no_match" for _, reason, _ in results), results
    assert not all(stayed for stayed, _, _ in results), results
