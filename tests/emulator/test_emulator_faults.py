"""Fault injection, kill/restart, and cancellation when the client goes away."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from emulator_support import chat_body, fast_spec, post_json, scrape, words

from support.waiting import wait_until
from warmfleet.emulator.config import FaultSpec
from warmfleet.emulator.fleet import EmulatedFleet


def _long_stream(tokens: int = 3000) -> dict[str, object]:
    return chat_body("sys " + words(1, 20), "go", max_tokens=tokens, stream=True)


async def test_error_rate_one_gives_500s_and_health_stays_up(
    session: aiohttp.ClientSession,
) -> None:
    spec = fast_spec(instances=2, instance_faults={1: {"error_rate": 1.0}})
    async with EmulatedFleet(spec) as fleet:
        good, bad = fleet.urls
        status, err = await post_json(session, bad, chat_body("s", "u"))
        assert status == 500
        assert err["error"]["code"] == 500
        async with session.get(bad + "/health") as resp:
            assert resp.status == 200
        status, _ = await post_json(session, good, chat_body("s", "u"))
        assert status == 200
        assert (await scrape(session, bad))["warmfleet_emulator_faults_total"] == 1


async def test_error_rate_is_seeded_and_partial(session: aiohttp.ClientSession) -> None:
    async def statuses() -> list[int]:
        async with EmulatedFleet(fast_spec(seed=7, faults={"error_rate": 0.5})) as fleet:
            return [
                (await post_json(session, fleet.urls[0], chat_body("s", "u")))[0] for _ in range(30)
            ]

    first = await statuses()
    assert first == await statuses()
    assert set(first) == {200, 500}


async def test_latency_spike_is_counted(session: aiohttp.ClientSession) -> None:
    spec = fast_spec(faults={"latency_spike_prob": 1.0, "latency_spike_ms": 1.0})
    async with EmulatedFleet(spec) as fleet:
        status, _ = await post_json(session, fleet.urls[0], chat_body("s", "u"))
        assert status == 200
        metrics = await scrape(session, fleet.urls[0])
    assert metrics["warmfleet_emulator_faults_total"] == 1


async def test_die_after_requests_kills_only_that_instance(
    session: aiohttp.ClientSession,
) -> None:
    spec = fast_spec(instances=2, instance_faults={0: {"die_after_requests": 2}})
    async with EmulatedFleet(spec) as fleet:
        doomed, survivor = fleet.urls
        body = chat_body("sys " + words(2, 60), "u")
        for _ in range(2):
            status, reply = await post_json(session, doomed, body)
            assert status == 200
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        with pytest.raises(aiohttp.ClientError):
            await post_json(session, doomed, body)
        await wait_until(lambda: not fleet.instance(0).running)
        with pytest.raises(aiohttp.ClientConnectionError):
            await post_json(session, doomed, body)
        status, _ = await post_json(session, survivor, body)
        assert status == 200
        # back on the same URL, with an empty cache and a fresh request count
        await fleet.restart(0)
        assert fleet.urls[0] == doomed
        status, reply = await post_json(session, doomed, body)
        assert status == 200
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_hang_accepts_and_never_answers(session: aiohttp.ClientSession) -> None:
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        fleet.set_faults(0, FaultSpec(hang=True))
        short = aiohttp.ClientTimeout(total=0.3)
        for path in ("/health", "/v1/models"):
            with pytest.raises(asyncio.TimeoutError):
                async with session.get(url + path, timeout=short) as resp:
                    await resp.read()
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(
                url + "/v1/chat/completions", json=chat_body("s", "u"), timeout=short
            ) as resp:
                await resp.read()
        fleet.set_faults(0, FaultSpec())
        status, _ = await post_json(session, url, chat_body("s", "u"))
        assert status == 200
        # the hung completion never reached the engine
        assert (await scrape(session, url))["vllm:prefix_cache_queries_total"] > 0
        stats = fleet.instance(0).stats()
        assert stats is not None
        assert stats.running == 0


async def test_client_disconnect_cancels_the_engine_request(
    session: aiohttp.ClientSession,
) -> None:
    async with EmulatedFleet(fast_spec(speedup=5.0)) as fleet:
        url = fleet.urls[0]
        instance = fleet.instance(0)
        resp = await session.post(url + "/v1/chat/completions", json=_long_stream())
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        driver = instance.driver
        assert driver is not None
        assert driver.in_flight == 1
        resp.close()  # the client goes away mid-stream

        def cancelled() -> bool:
            stats = instance.stats()
            return (
                driver.in_flight == 0
                and stats is not None
                and stats.running == 0
                and stats.kv_usage_frac == 0.0  # its KV blocks are free
            )

        await wait_until(cancelled)
        metrics = await scrape(session, url)
        assert metrics.get("vllm:request_success_total", 0) == 0
        assert metrics["vllm:generation_tokens_total"] < 3000
        # a non-streamed request whose client gives up is cancelled too
        body = {**_long_stream(), "stream": False}
        queried_tokens = driver.stats().prefix_cache_queries_tokens
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(
                url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.3)
            ) as resp:
                await resp.read()
        assert driver.stats().prefix_cache_queries_tokens > queried_tokens  # it was admitted
        await wait_until(cancelled)


async def test_kill_mid_stream_cuts_the_stream_and_restart_serves(
    session: aiohttp.ClientSession,
) -> None:
    async with EmulatedFleet(fast_spec(speedup=5.0)) as fleet:
        url = fleet.urls[0]
        async with session.post(url + "/v1/chat/completions", json=_long_stream()) as resp:
            assert (await resp.content.readline()).startswith(b"data: ")
            await fleet.kill(0)
            with pytest.raises(aiohttp.ClientError):
                async for _ in resp.content:
                    pass
        assert not fleet.instance(0).running
        assert fleet.instance(0).stats() is None
        with pytest.raises(aiohttp.ClientConnectionError):
            await post_json(session, url, chat_body("s", "u"))
        await fleet.restart(0)
        status, _ = await post_json(session, url, chat_body("s", "u"))
        assert status == 200
