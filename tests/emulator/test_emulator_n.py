"""``n`` > 1 as vLLM V1 serves it: one engine request per choice, sharing the prompt's blocks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from emulator_support import (
    BLOCK,
    DRIVER_SPEC,
    MODEL,
    chat_body,
    chat_ids,
    fast_spec,
    post_json,
    scrape,
    sse_events,
    words,
)
from openai.types.chat import ChatCompletionMessageParam

from support.waiting import wait_until
from warmfleet.emulator.driver import running_driver
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.engine.events import EngineEvent, EngineEventKind

COMPLETIONS = "/v1/completions"


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    async with EmulatedFleet(fast_spec()) as running:
        yield running


def _by_index(chunks: list[Any]) -> dict[int, list[Any]]:
    """Each chunk carries one choice; group (choice, usage) pairs by choice index."""
    out: dict[int, list[Any]] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        out.setdefault(choice["index"], []).append((choice, chunk.get("usage")))
    return out


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def _full_blocks(prompt_tokens: int) -> int:
    """What a child reuses of the first child's blocks (at least one token is computed)."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


async def test_chat_n3_choices_usage_cached_tokens_and_metrics(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    body = chat_body("system " + words(1, 60), "question " + words(2, 9), max_tokens=4, n=3)
    prompt = len(chat_ids(body))
    before = await scrape(session, url)
    status, reply = await post_json(session, url, body)
    assert status == 200
    delta = _delta(before, await scrape(session, url))
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    texts = [c["message"]["content"] for c in choices]
    assert [len(t.split()) for t in texts] == [4, 4, 4]
    assert len(set(texts)) == 3  # three samples, not three copies
    assert {c["finish_reason"] for c in choices} == {"length"}
    usage = reply["usage"]
    assert usage["prompt_tokens"] == prompt  # counted once
    assert usage["completion_tokens"] == 12  # summed over the choices
    assert usage["total_tokens"] == prompt + 12
    # cold cache: child 0 computes the prompt, children 1 and 2 (admitted in the same step)
    # reuse its blocks; the response reports the child that finished last, as vLLM does
    assert usage["prompt_tokens_details"]["cached_tokens"] == _full_blocks(prompt)
    # every engine and frontend metric counts the three children; request_params_n the parent
    assert delta["vllm:prefix_cache_queries_total"] == 3 * prompt
    assert delta["vllm:prefix_cache_hits_total"] == 2 * _full_blocks(prompt)
    assert delta["vllm:prompt_tokens_total"] == 3 * prompt
    assert delta["vllm:generation_tokens_total"] == 12
    assert delta["vllm:time_to_first_token_seconds_count"] == 3
    assert delta["vllm:e2e_request_latency_seconds_count"] == 3
    assert delta["vllm:request_success_total"] == 3
    assert delta["vllm:request_params_n_count"] == 1
    assert delta["vllm:request_params_n_sum"] == 3
    assert delta["vllm:request_prompt_tokens_count"] == 3
    assert delta["vllm:request_prompt_tokens_sum"] == 3 * prompt
    assert delta["vllm:request_generation_tokens_count"] == 3
    assert delta["vllm:request_generation_tokens_sum"] == 12
    assert delta["vllm:request_params_max_tokens_sum"] == 3 * 4
    # the most tokens one child generated, once per parent
    assert delta["vllm:request_max_num_generation_tokens_count"] == 1
    assert delta["vllm:request_max_num_generation_tokens_sum"] == 4
    assert delta["vllm:num_requests_running"] == 0
    # choice 0 is what n = 1 gets for the same prompt
    status, single = await post_json(session, url, {**body, "n": 1})
    assert [c["message"]["content"] for c in single["choices"]] == texts[:1]


async def test_completions_n3_each_choice_ends_on_its_own(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    """Without ``ignore_eos`` each child request meets its own (emulated) EOS; the cached
    tokens are the last child's to finish: the longest one (ties: the later child)."""
    url = fleet.urls[0]
    body = {"model": MODEL, "prompt": words(3, 40), "max_tokens": 200, "n": 3}
    status, reply = await post_json(session, url, body, COMPLETIONS)
    assert status == 200
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    lengths = [len(c["text"].split()) for c in choices]
    assert all(8 <= k <= 128 for k in lengths)  # eos_min_tokens .. eos_max_tokens
    assert {c["finish_reason"] for c in choices} == {"stop"}
    usage = reply["usage"]
    assert usage["prompt_tokens"] == 41  # BOS + 40 words, once
    assert usage["completion_tokens"] == sum(lengths)
    last = max(range(3), key=lambda i: (lengths[i], i))
    expected = 0 if last == 0 else _full_blocks(41)
    assert usage["prompt_tokens_details"]["cached_tokens"] == expected


async def test_chat_stream_n2_role_and_finish_per_choice_one_usage_chunk(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = chat_body("sys " + words(4, 50), "go", max_tokens=5, n=2, stream_options=options)
    prompt = len(chat_ids(body))
    chunks = await sse_events(session, url, "/v1/chat/completions", body)
    usage_chunks = [c for c in chunks if not c["choices"]]
    assert usage_chunks == chunks[-1:]  # one usage chunk, at the end
    final = usage_chunks[0]["usage"]
    assert final["prompt_tokens"] == prompt
    assert final["completion_tokens"] == 10
    assert final["total_tokens"] == prompt + 10
    # streamed, vLLM reports the first output's child: child 0, which computed the prompt
    assert final["prompt_tokens_details"]["cached_tokens"] == 0
    # both role chunks come first (vLLM sends them at the first output), in index order
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks[:2]] == [
        (0, {"role": "assistant", "content": ""}),
        (1, {"role": "assistant", "content": ""}),
    ]
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    status, full = await post_json(session, url, plain)
    assert status == 200
    per_index = _by_index(chunks[:-1])
    assert sorted(per_index) == [0, 1]
    for index, items in per_index.items():
        assert ["role" in choice["delta"] for choice, _ in items] == [True] + [False] * 5
        finishes = [choice["finish_reason"] for choice, _ in items]
        assert finishes == [None] * 5 + ["length"]  # one finish chunk per choice, last
        # continuous usage: the prompt and this choice's tokens so far
        assert [u["completion_tokens"] for _, u in items] == [0, 1, 2, 3, 4, 5]
        assert {u["prompt_tokens"] for _, u in items} == {prompt}
        text = "".join(choice["delta"].get("content", "") for choice, _ in items)
        assert text == full["choices"][index]["message"]["content"]


async def test_completions_stream_n2_warm_prompt(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    body = {"model": MODEL, "prompt": words(6, 40), "max_tokens": 6, "ignore_eos": True}
    status, _ = await post_json(session, url, body, COMPLETIONS)  # warms the prompt's blocks
    assert status == 200
    stream_body = {**body, "n": 2, "stream_options": {"include_usage": True}}
    chunks = await sse_events(session, url, COMPLETIONS, stream_body)
    assert [c for c in chunks if not c["choices"]] == chunks[-1:]
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == 41
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens_details"]["cached_tokens"] == _full_blocks(41)
    status, full = await post_json(session, url, {**body, "n": 2}, COMPLETIONS)
    per_index = _by_index(chunks[:-1])
    for index, items in per_index.items():
        assert [choice["finish_reason"] for choice, _ in items] == [None] * 5 + ["length"]
        assert all(u is None for _, u in items)  # no continuous usage unless asked
        assert "".join(choice["text"] for choice, _ in items) == full["choices"][index]["text"]
    assert sorted(per_index) == [0, 1]


def _tokens_through(text: str, end: int) -> int:
    """Output tokens up to the one holding character ``end - 1`` (every token is one word)."""
    return len(text[:end].split(" "))


async def test_stop_strings_apply_to_each_choice(
    fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    base = {"model": MODEL, "prompt": words(5, 30), "max_tokens": 24, "ignore_eos": True, "n": 2}
    status, plain = await post_json(session, url, base, COMPLETIONS)
    assert status == 200
    full = [c["text"] for c in plain["choices"]]
    words_1 = full[1].split(" ")
    stop = " " + words_1[7] + " " + words_1[8]  # from the middle of choice 1 only
    body = {**base, "stop": [stop]}
    status, cut = await post_json(session, url, body, COMPLETIONS)
    assert status == 200
    streamed = _by_index(await sse_events(session, url, COMPLETIONS, body))
    expected_tokens = 0
    for index, (choice, text) in enumerate(zip(cut["choices"], full, strict=True)):
        if stop in text:
            at = text.index(stop)
            assert (choice["text"], choice["finish_reason"]) == (text[:at], "stop")
            assert choice["stop_reason"] == stop
            expected_tokens += _tokens_through(text, at + len(stop))
        else:
            assert (choice["text"], choice["finish_reason"]) == (text, "length")
            assert choice["stop_reason"] is None
            expected_tokens += 24
        items = streamed[index]
        assert "".join(c["text"] for c, _ in items) == choice["text"]
        assert items[-1][0]["finish_reason"] == choice["finish_reason"]
        assert items[-1][0]["stop_reason"] == choice["stop_reason"]
    assert cut["choices"][1]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == expected_tokens


async def test_disconnect_cancels_every_child(session: aiohttp.ClientSession) -> None:
    async with EmulatedFleet(fast_spec(speedup=5.0)) as fleet:
        url = fleet.urls[0]
        instance = fleet.instance(0)
        driver = instance.driver
        assert driver is not None
        body = chat_body("sys " + words(1, 20), "go", max_tokens=1000, n=3, stream=True)
        resp = await session.post(url + "/v1/chat/completions", json=body)
        assert (await resp.content.readline()).startswith(b"data: ")
        assert driver.in_flight == 3
        assert driver.stats().running == 3
        resp.close()  # the client goes away mid-stream

        def cancelled() -> bool:
            stats = driver.stats()
            return driver.in_flight == 0 and stats.running == 0 and stats.kv_usage_frac == 0.0

        await wait_until(cancelled)
        metrics = await scrape(session, url)
        assert metrics.get("vllm:request_success_total", 0) == 0
        assert metrics["vllm:request_params_n_count"] == 0
        assert metrics["vllm:request_max_num_generation_tokens_count"] == 0
        # a non-streamed request whose client gives up is cancelled too
        queried = driver.stats().prefix_cache_queries_tokens
        with pytest.raises(TimeoutError):
            async with session.post(
                url + "/v1/chat/completions",
                json={**body, "stream": False},
                timeout=aiohttp.ClientTimeout(total=0.3),
            ) as resp:
                await resp.read()
        assert driver.stats().prefix_cache_queries_tokens > queried  # its children were admitted
        await wait_until(cancelled)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": -2}, "n"),
        ({"n": True}, "n"),  # a boolean is not an integer
        ({"n": 1.5}, "n"),
        ({"n": "2"}, "n"),
        ({"n": 16385}, "n"),  # vLLM's VLLM_MAX_N_SEQUENCES default is 16384
        ({"n": 2, "temperature": 0}, "n"),  # vLLM: n must be 1 when using greedy sampling
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
async def test_invalid_n_is_a_400_naming_the_param(
    fleet: EmulatedFleet, session: aiohttp.ClientSession, extra: dict[str, Any], param: str
) -> None:
    url = fleet.urls[0]
    chat = chat_body("s", "u", **extra)
    completion = {"model": MODEL, "prompt": "one two", **extra}
    for path, body in (("/v1/chat/completions", chat), (COMPLETIONS, completion)):
        status, err = await post_json(session, url, body, path)
        assert status == 400, (path, extra)
        assert err["error"]["param"] == param
        assert err["error"]["code"] == 400
        assert err["error"]["type"] == "BadRequestError"


async def test_accepted_n_values(fleet: EmulatedFleet, session: aiohttp.ClientSession) -> None:
    url = fleet.urls[0]
    for extra, choices in (
        ({"n": 2, "temperature": 0.7}, 2),
        ({"n": 2, "temperature": 1e-6}, 2),  # vLLM raises it to 0.01: not greedy
        ({"n": 1, "temperature": 0}, 1),
        ({"n": None}, 1),  # chat: null is the default
    ):
        status, reply = await post_json(session, url, chat_body("s", "u", **extra))
        assert status == 200, extra
        assert len(reply["choices"]) == choices
    # completions: ``n`` is not optional in vLLM's CompletionRequest
    body = {"model": MODEL, "prompt": "one two", "n": None}
    status, err = await post_json(session, url, body, COMPLETIONS)
    assert (status, err["error"]["param"]) == (400, "n")


async def test_openai_client_parses_n2(fleet: EmulatedFleet) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "tell me about " + words(1, 30)}
    ]
    extra = {"ignore_eos": True}
    async with openai.AsyncOpenAI(
        base_url=fleet.urls[0] + "/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        full = await client.chat.completions.create(
            model=MODEL, messages=messages, n=2, max_tokens=4, extra_body=extra
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            n=2,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        pieces: dict[int, list[str]] = {0: [], 1: []}
        finishes: dict[int, list[str]] = {0: [], 1: []}
        usages = []
        async for chunk in stream:
            if chunk.usage is not None:
                usages.append(chunk.usage)
            for choice in chunk.choices:
                pieces[choice.index].append(choice.delta.content or "")
                if choice.finish_reason is not None:
                    finishes[choice.index].append(choice.finish_reason)
        completion = await client.completions.create(
            model=MODEL, prompt="once upon a time", n=2, max_tokens=3, extra_body=extra
        )
    assert [c.index for c in full.choices] == [0, 1]
    assert full.usage is not None
    assert full.usage.completion_tokens == 8
    for index, answer in enumerate(full.choices):
        assert "".join(pieces[index]) == answer.message.content
        assert finishes[index] == ["length"]
    assert len(usages) == 1
    assert usages[0].completion_tokens == 8
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 6


async def test_driver_submit_n_children_share_a_queue_and_the_prompt() -> None:
    async with running_driver(DRIVER_SPEC, speedup=10.0) as driver:
        prefix = tuple(range(1, 9))  # 8 full blocks of a 34-token prompt
        streams = driver.submit_n(prefix, 34, [3, 5, 2], wants_tokens=True)
        assert [s.index for s in streams] == [0, 1, 2]
        assert len({id(s.queue) for s in streams}) == 1
        events: list[EngineEvent] = []
        while sum(e.kind is EngineEventKind.FINISHED for e in events) < 3:
            events.extend(await streams[0].next_batch())
        firsts = {e.request_id: e for e in events if e.kind is EngineEventKind.FIRST_TOKEN}
        # admitted in one step: children 1 and 2 reuse child 0's blocks (not its last token)
        assert [firsts[s.request_id].cached_tokens for s in streams] == [0, 32, 32]
        assert len({e.time_s for e in firsts.values()}) == 1
        ends = {e.request_id: e.output_tokens for e in events if e.kind is EngineEventKind.FINISHED}
        assert [ends[s.request_id] for s in streams] == [3, 5, 2]
        assert driver.in_flight == 0
        streams = driver.submit_n(prefix, 34, [500, 500], wants_tokens=False)
        await streams[0].next_batch()  # their first tokens
        assert driver.stats().running == 2
        driver.cancel(*streams)
        driver.cancel(*streams)  # idempotent
        assert driver.in_flight == 0
        assert driver.stats().running == 0
        assert driver.stats().kv_usage_frac == 0.0
