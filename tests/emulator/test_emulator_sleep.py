"""vLLM's sleep mode on the emulator: /sleep, /wake_up, /is_sleeping and their semantics."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from emulator_support import chat_body, fast_spec, post_json, words

from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.sleep import SleepError, SleepState
from warmfleet.engine.presets import get_preset


async def _sleeping(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url + "/is_sleeping") as resp:
        assert resp.status == 200
        return bool((await resp.json())["is_sleeping"])


async def _post(session: aiohttp.ClientSession, url: str) -> int:
    async with session.post(url) as resp:
        return resp.status


async def test_sleep_refuses_generation_keeps_tokenize_and_wake_serves(
    session: aiohttp.ClientSession,
) -> None:
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        assert not await _sleeping(session, url)
        assert await _post(session, url + "/sleep?level=1") == 200
        assert await _sleeping(session, url)
        status, err = await post_json(session, url, chat_body("s", "u"))
        assert status == 503
        assert "sleeping" in err["error"]["message"]
        status, _ = await post_json(session, url, {"input": "x"}, path="/v1/embeddings")
        assert status == 503
        status, tokens = await post_json(session, url, {"prompt": "a b c"}, path="/tokenize")
        assert status == 200
        assert tokens["count"] > 0
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
        assert await _post(session, url + "/wake_up") == 200
        assert not await _sleeping(session, url)
        status, _ = await post_json(session, url, chat_body("s", "u"))
        assert status == 200


async def test_sleep_discards_the_kv_cache(session: aiohttp.ClientSession) -> None:
    body = chat_body("sys " + words(3, 200), "u")
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        await post_json(session, url, body)
        _, warm = await post_json(session, url, body)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert await _post(session, url + "/sleep") == 200  # level 1 by default
        assert await _post(session, url + "/wake_up") == 200
        _, after = await post_json(session, url, body)
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_wake_with_tags_is_partial(session: aiohttp.ClientSession) -> None:
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        assert await _post(session, url + "/sleep?level=2") == 200
        assert await _post(session, url + "/wake_up?tags=weights") == 200
        assert await _sleeping(session, url)  # the KV cache still sleeps
        status, _ = await post_json(session, url, chat_body("s", "u"))
        assert status == 503
        assert await _post(session, url + "/wake_up?tags=kv_cache") == 200
        assert not await _sleeping(session, url)


@pytest.mark.parametrize("level", [1, 2])
async def test_wake_takes_the_engine_specs_time(session: aiohttp.ClientSession, level: int) -> None:
    """Level 1 wakes from host memory, level 2 from disk: at least the spec's time / speedup."""
    speedup = 5.0
    expected_s = get_preset("tiny-cpu").wake_s(level) / speedup
    async with EmulatedFleet(fast_spec(speedup=speedup)) as fleet:
        url = fleet.urls[0]
        assert await _post(session, url + f"/sleep?level={level}") == 200
        started = time.perf_counter()
        assert await _post(session, url + "/wake_up") == 200
        assert time.perf_counter() - started >= expected_s


async def test_sleep_waits_for_running_requests(session: aiohttp.ClientSession) -> None:
    """A running request finishes (the emulator's choice); /sleep answers only after it."""
    body = chat_body("s", "u", max_tokens=400)  # ~20 ms steps / 20: ~0.4 s
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        running = asyncio.create_task(post_json(session, url, body))
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        assert await _post(session, url + "/sleep") == 200
        assert time.perf_counter() - started >= 0.2  # it waited for the request
        status, answer = await running
        assert status == 200
        assert answer["usage"]["completion_tokens"] == 400
        status, _ = await post_json(session, url, chat_body("s", "u"))
        assert status == 503


async def test_bad_parameters_are_400(session: aiohttp.ClientSession) -> None:
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        assert await _post(session, url + "/sleep?level=3") == 400
        assert await _post(session, url + "/wake_up?tags=everything") == 400
        assert not await _sleeping(session, url)


def test_sleep_state_levels_and_tags() -> None:
    state = SleepState()
    state.sleep(1)
    state.sleep(2)
    assert (state.level, state.is_sleeping) == (2, True)  # the deeper level is kept
    assert state.wake({"kv_cache"}) is False  # no weights woken: no wake cost
    state.finish_wake()
    assert state.is_sleeping
    assert state.level == 2
    assert state.wake({"weights"}) is True
    state.finish_wake()
    assert (state.level, state.is_sleeping) == (0, False)
    with pytest.raises(SleepError):
        SleepState.parse_level("0")
    assert SleepState.parse_tags([]) == {"weights", "kv_cache"}


async def test_a_sleep_whose_client_gives_up_leaves_the_instance_serving(
    session: aiohttp.ClientSession,
) -> None:
    """A /sleep cancelled while it waits for running requests rolls back to awake (it left
    every later request refused with 503, /wake_up included)."""
    body = chat_body("s", "u", max_tokens=400)  # ~0.4 s
    async with EmulatedFleet(fast_spec()) as fleet:
        url = fleet.urls[0]
        running = asyncio.create_task(post_json(session, url, body))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):
            async with session.post(url + "/sleep", timeout=aiohttp.ClientTimeout(total=0.1)):
                pass
        assert (await running)[0] == 200
        await asyncio.sleep(0.05)  # the handler sees the disconnect
        assert not await _sleeping(session, url)
        status, _ = await post_json(session, url, chat_body("s", "u"))
        assert status == 200
