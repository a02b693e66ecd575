"""The emulator through the official openai client and raw HTTP: shapes, caching, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from emulator_support import (
    BLOCK,
    MODEL,
    chat_body,
    chat_ids,
    expected_cached_tokens,
    fast_spec,
    metric_labels,
    post_json,
    scrape,
    words,
)
from openai.types.chat import ChatCompletionMessageParam

from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.metrics import token_buckets
from warmfleet.emulator.tokenizer import EmulatorTokenizer


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    async with EmulatedFleet(fast_spec(instances=2)) as running:
        yield running


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


async def test_openai_chat_stream_and_not_agree(fleet: EmulatedFleet) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "tell me about " + words(1, 30)}
    ]
    async with _client(fleet.urls[0]) as client:
        full = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=7, extra_body={"ignore_eos": True}
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_completion_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        pieces: list[str] = []
        finish: list[str | None] = []
        usage = None
        roles = []
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                pieces.append(choice.delta.content or "")
                finish.append(choice.finish_reason)
    answer = full.choices[0]
    assert answer.finish_reason == "length"
    assert full.usage is not None
    assert full.usage.completion_tokens == 7
    assert full.usage.prompt_tokens == len(EmulatorTokenizer().encode_chat(messages))
    assert answer.message.content is not None
    assert len(answer.message.content.split()) == 7
    assert "".join(pieces) == answer.message.content  # deterministic output text
    assert roles == ["assistant"]
    assert finish[-1] == "length"
    assert all(f is None for f in finish[:-1])
    assert usage is not None
    assert usage.completion_tokens == 7
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == full.usage.prompt_tokens // BLOCK * BLOCK


async def test_openai_completions_stream_and_not(fleet: EmulatedFleet) -> None:
    prompt = "once upon a time " + words(2, 40)
    async with _client(fleet.urls[1]) as client:
        full = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True}
        )
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, stream=True, extra_body={"ignore_eos": True}
        )
        texts = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert full.choices[0].finish_reason == "length"
    assert full.usage is not None
    assert full.usage.completion_tokens == 5
    assert full.usage.prompt_tokens == 1 + 4 + 40  # BOS + four short words + 40 words
    assert "".join(texts) == full.choices[0].text
    assert len(texts) == 5


def test_token_buckets_are_vllms_1_2_5_series() -> None:
    assert token_buckets(16) == (1.0, 2.0, 5.0, 10.0)
    assert token_buckets(20) == (1.0, 2.0, 5.0, 10.0, 20.0)
    assert token_buckets(131_072)[-3:] == (20_000.0, 50_000.0, 100_000.0)


async def test_emulated_eos_without_ignore_eos(fleet: EmulatedFleet) -> None:
    async with _client(fleet.urls[0]) as client:
        short = await client.completions.create(model=MODEL, prompt=words(3, 20), max_tokens=2)
        free = await client.completions.create(model=MODEL, prompt=words(3, 20), max_tokens=4000)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None
    assert short.usage.completion_tokens == 2
    assert free.choices[0].finish_reason == "stop"
    assert free.usage is not None
    assert 8 <= free.usage.completion_tokens <= 128  # eos_min_tokens .. eos_max_tokens


async def test_cached_tokens_grow_on_a_shared_prefix(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    system = "you are helpful " + words(4, 150)
    first = chat_body(system, "question one " + words(5, 9))
    second = chat_body(system, "question two " + words(6, 11))
    url = fleet.urls[0]
    status, cold = await post_json(session, url, first)
    assert status == 200
    status, warm = await post_json(session, url, second)
    assert status == 200
    status, repeat = await post_json(session, url, second)
    assert status == 200
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    expected = expected_cached_tokens(chat_ids(first), chat_ids(second))
    assert expected >= 8 * BLOCK
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
    prompt_tokens = repeat["usage"]["prompt_tokens"]
    assert repeat["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        (prompt_tokens - 1) // BLOCK * BLOCK
    )
    # the other instance has its own cache
    status, other = await post_json(session, fleet.urls[1], second)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_multi_turn_reuses_the_previous_turn(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    turn1 = chat_body("system " + words(7, 60), "first " + words(8, 30), max_tokens=20)
    _, reply = await post_json(session, url, turn1)
    answer = reply["choices"][0]["message"]["content"]
    turn2 = dict(turn1)
    turn2["messages"] = [
        *turn1["messages"],
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "and then " + words(9, 10)},
    ]
    _, reply2 = await post_json(session, url, turn2)
    assert reply2["usage"]["prompt_tokens_details"]["cached_tokens"] == expected_cached_tokens(
        chat_ids(turn1), chat_ids(turn2)
    )
    assert reply2["usage"]["prompt_tokens_details"]["cached_tokens"] >= (
        reply["usage"]["prompt_tokens"] // BLOCK * BLOCK
    )


async def test_metrics_agree_with_responses(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    system = "shared " + words(10, 90)
    prompt_total = cached_total = completion_total = 0
    for i in range(6):
        body = chat_body(system, words(20 + i, 5 + i), max_tokens=3 + i)
        if i % 2:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                lines = [line async for line in resp.content]
            import json  # noqa: PLC0415

            data = [x[6:].strip() for x in lines if x.startswith(b"data: ")]
            assert data[-1] == b"[DONE]"
            usage = json.loads(data[-2])["usage"]
        else:
            _, reply = await post_json(session, url, body)
            usage = reply["usage"]
        prompt_total += usage["prompt_tokens"]
        completion_total += usage["completion_tokens"]
        cached_total += usage["prompt_tokens_details"]["cached_tokens"]
    metrics = await scrape(session, url)
    assert cached_total > 0
    assert metrics["vllm:prefix_cache_hits_total"] == cached_total
    assert metrics["vllm:prefix_cache_queries_total"] == prompt_total
    assert metrics["vllm:prompt_tokens_total"] == prompt_total
    assert metrics["vllm:generation_tokens_total"] == completion_total
    assert metrics["vllm:time_to_first_token_seconds_count"] == 6
    assert metrics["vllm:e2e_request_latency_seconds_count"] == 6
    assert metrics["vllm:request_success_total"] == 6
    # per-request histograms, as vLLM V1 observes them when a request finishes
    assert metrics["vllm:request_prompt_tokens_count"] == 6
    assert metrics["vllm:request_prompt_tokens_sum"] == prompt_total
    assert metrics["vllm:request_generation_tokens_sum"] == completion_total
    assert metrics["vllm:request_max_num_generation_tokens_sum"] == completion_total  # n = 1
    assert metrics["vllm:request_params_max_tokens_sum"] == sum(3 + i for i in range(6))
    assert metrics["vllm:num_requests_running"] == 0
    assert metrics["vllm:num_requests_waiting"] == 0
    assert 0 <= metrics["vllm:kv_cache_usage_perc"] <= 1
    info = await metric_labels(session, url, "vllm:cache_config_info")
    assert info["block_size"] == str(BLOCK)
    assert info["num_gpu_blocks"] == str(4096 // BLOCK)
    # instance 1 served nothing
    other = await scrape(session, fleet.urls[1])
    assert other["vllm:prefix_cache_queries_total"] == 0


async def test_lru_eviction_through_http(session: aiohttp.ClientSession) -> None:
    async with EmulatedFleet(fast_spec(kv_capacity_tokens=12 * BLOCK)) as fleet:
        url = fleet.urls[0]
        a = chat_body("alpha " + words(30, 150), "q", max_tokens=2)
        b = chat_body("beta " + words(31, 150), "q", max_tokens=2)
        await post_json(session, url, a)
        _, a_again = await post_json(session, url, a)
        await post_json(session, url, b)  # needs most of the cache: evicts a's blocks
        _, a_after = await post_json(session, url, a)
    warm = a_again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert warm == (a_again["usage"]["prompt_tokens"] - 1) // BLOCK * BLOCK
    # b took most of the 12 blocks: a's deepest blocks went first (LRU, leaf before root)
    assert a_after["usage"]["prompt_tokens_details"]["cached_tokens"] < warm // 2


async def test_info_routes_and_tokenize(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    async with session.get(url + "/health") as resp:
        assert resp.status == 200
    async with session.get(url + "/v1/models") as resp:
        models = await resp.json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    for path in ("/server_info", "/model_info"):
        async with session.get(url + path) as resp:
            info = await resp.json()
        assert resp.status == 200
        assert "model_path" not in info
        assert "tokenizer_path" not in info
    status, tok = await post_json(session, url, {"prompt": "one two six"}, "/tokenize")
    assert status == 200
    assert tok["count"] == 4
    assert tok["tokens"][0] == 1  # BOS
    assert tok["max_model_len"] > 0
    body = chat_body("sys", "hello there")
    status, chat_tok = await post_json(session, url, body, "/tokenize")
    assert chat_tok["tokens"] == chat_ids(body)
    status, rendered = await post_json(session, url, body, "/v1/chat/completions/render")
    assert status == 200
    assert rendered["token_ids"] == chat_ids(body)
    status, rendered_list = await post_json(
        session, url, {"model": MODEL, "prompt": "one two"}, "/v1/completions/render"
    )
    assert rendered_list[0]["token_ids"] == tok["tokens"][:3]


async def test_seed_draws_the_sample_and_greedy_ignores_it(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    """As in vLLM: with sampling, the same seed gives the same output and another seed another
    one; greedy output (temperature 0) does not depend on the seed."""
    url = fleet.urls[0]
    body = chat_body("sys " + words(3, 30), "q " + words(4, 5), max_tokens=12)

    async def text(**extra: object) -> str:
        status, reply = await post_json(session, url, {**body, **extra})
        assert status == 200, reply
        return str(reply["choices"][0]["message"]["content"])

    plain = await text()
    seven = await text(seed=7)
    assert await text(seed=7) == seven
    assert len({plain, seven, await text(seed=8), await text(seed=-(2**63))}) == 4
    assert await text(seed=7, temperature=0) == await text(temperature=0) == plain
    for bad in (True, "7", 1.5, 2**63):
        status, err = await post_json(session, url, {**body, "seed": bad})
        assert status == 400
        assert err["error"]["param"] == "seed"


async def test_bad_requests_are_openai_errors(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    async with session.post(url + "/v1/chat/completions", data=b"{not json") as resp:
        assert resp.status == 400
        assert "error" in await resp.json()
    status, err = await post_json(session, url, {**chat_body("s", "u"), "model": "nope"})
    assert status == 404
    assert err["error"]["code"] == 404
    status, err = await post_json(session, url, {"model": MODEL, "messages": []})
    assert status == 400
    assert err["error"]["param"] == "messages"
    status, err = await post_json(session, url, chat_body("s", "u", max_tokens=10**6))
    assert status == 400
    assert "maximum context length" in err["error"]["message"]
    huge = chat_body(words(40, 5000), "u", max_tokens=2)  # more than the 4096-token KV cache
    status, err = await post_json(session, url, huge)
    assert status == 400
    status, err = await post_json(session, url, {"model": MODEL, "prompt": 5}, "/v1/completions")
    assert status == 400


async def test_completions_default_to_16_tokens_like_vllm(session: aiohttp.ClientSession) -> None:
    """vLLM's CompletionRequest.max_tokens defaults to 16; chat has no default limit, and
    ``max_completion_tokens`` is a chat field only."""
    async with EmulatedFleet(fast_spec(eos_min_tokens=40, eos_max_tokens=60)) as fleet:
        url = fleet.urls[0]
        body = {"model": MODEL, "prompt": words(8, 20)}  # emulated EOS after 40-60 tokens
        status, reply = await post_json(session, url, body, "/v1/completions")
        assert status == 200
        assert reply["usage"]["completion_tokens"] == 16
        assert reply["choices"][0]["finish_reason"] == "length"
        chat_field = {**body, "max_completion_tokens": 3}
        status, reply = await post_json(session, url, chat_field, "/v1/completions")
        assert reply["usage"]["completion_tokens"] == 16
        unlimited = {**body, "max_tokens": None}
        status, reply = await post_json(session, url, unlimited, "/v1/completions")
        assert status == 200
        assert reply["usage"]["completion_tokens"] >= 40
        assert reply["choices"][0]["finish_reason"] == "stop"
        chat = {"model": MODEL, "messages": [{"role": "user", "content": words(8, 20)}]}
        status, reply = await post_json(session, url, chat)
        assert reply["usage"]["completion_tokens"] >= 40
        status, reply = await post_json(session, url, {**chat, "max_completion_tokens": 3})
        assert reply["usage"]["completion_tokens"] == 3


async def test_min_tokens_over_max_tokens_is_a_400(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    too_many = {"model": MODEL, "prompt": words(8, 20), "min_tokens": 17}  # max_tokens 16
    status, err = await post_json(session, url, too_many, "/v1/completions")
    assert status == 400
    assert err["error"]["param"] == "min_tokens"
    status, err = await post_json(session, url, chat_body("s", "u", max_tokens=4, min_tokens=5))
    assert status == 400
    status, _ = await post_json(session, url, chat_body("s", "u", max_tokens=4, min_tokens=4))
    assert status == 200


async def test_deeply_nested_values_are_a_400_not_a_500(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    """Values rendered into the prompt as JSON (tools, tool calls, non-text content parts),
    nested as deeply as the body parser accepts, are the client's error."""
    url = fleet.urls[0]
    deep = "[" * 1000 + "]" * 1000
    head = f'{{"model": "{MODEL}", '
    user = '{"role": "user", "content": "hi"}'
    bodies = {
        "tools": head + f'"messages": [{user}], "tools": {deep}}}',
        "messages[0].tool_calls": head
        + f'"messages": [{{"role": "assistant", "content": "", "tool_calls": {deep}}}]}}',
        "messages[0].content[0]": head
        + f'"messages": [{{"role": "user", "content": [{{"type": "x", "v": {deep}}}]}}]}}',
    }
    for param, raw in bodies.items():
        for path in ("/v1/chat/completions", "/tokenize", "/v1/chat/completions/render"):
            async with session.post(url + path, data=raw.encode()) as resp:
                assert resp.status == 400, (param, path, resp.status)
                err = (await resp.json())["error"]
            assert err["param"] == param
            assert err["code"] == 400


async def test_http2_probe_is_answered_without_error_logs(
    fleet: EmulatedFleet, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """sglang-router probes workers for gRPC with an HTTP/2 preface."""
    port = fleet.instance(0).port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    await writer.drain()
    answer = await reader.read(4096)
    writer.close()
    await writer.wait_closed()
    assert b" 400 " in answer.split(b"\r\n", 1)[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    async with session.get(fleet.urls[0] + "/health") as resp:
        assert resp.status == 200
