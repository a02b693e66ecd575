"""vLLM's stop / stop_token_ids / continuous usage semantics, and 400s for logprobs and echo."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from emulator_support import MODEL, fast_spec, post_json, sse_events, words
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.emulator import sampling
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.sampling import StopParams, find_stop
from warmfleet.emulator.tokenizer import (
    OUTPUT_WORDS,
    EmulatorTokenizer,
    output_piece,
    output_text,
)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with EmulatedFleet(fast_spec()) as fleet:
        yield fleet.urls[0]


def _completion(max_tokens: int = 24, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": words(5, 30),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


async def _plain(session: aiohttp.ClientSession, url: str, **extra: Any) -> str:
    status, reply = await post_json(session, url, _completion(**extra), "/v1/completions")
    assert status == 200
    text: str = reply["choices"][0]["text"]
    return text


def _stop_of(text: str) -> tuple[str, int]:
    """A two-word stop string taken from the middle of ``text``, and where it first starts."""
    pieces = [" " + w for w in text.split(" ")[1:]]
    stop = pieces[6] + pieces[7]
    return stop, text.index(stop)


def _tokens_through(text: str, end: int) -> int:
    """Output tokens up to the one holding character ``end - 1`` (every token is one word)."""
    return len(text[:end].split(" "))


async def test_stop_string_ends_the_choice_like_vllm(
    url: str, session: aiohttp.ClientSession
) -> None:
    full = await _plain(session, url)
    stop, index = _stop_of(full)
    tokens = _tokens_through(full, index + len(stop))
    body = _completion(stop=["zzzz", stop])
    status, reply = await post_json(session, url, body, "/v1/completions")
    assert status == 200
    choice = reply["choices"][0]
    assert choice["text"] == full[:index]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert reply["usage"]["completion_tokens"] == tokens
    chunks = await sse_events(session, url, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[:index]
    assert len(chunks) == tokens
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == stop
    kept = await _plain(session, url, stop=stop, include_stop_str_in_output=True)
    assert kept == full[: index + len(stop)]


async def test_stop_string_in_chat_stream_and_not(url: str, session: aiohttp.ClientSession) -> None:
    chat: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": words(6, 20)}],
        "max_tokens": 24,
        "ignore_eos": True,
    }
    _, reply = await post_json(session, url, chat)
    full = reply["choices"][0]["message"]["content"]
    stop, index = _stop_of(full)
    _, reply = await post_json(session, url, {**chat, "stop": stop})
    assert reply["choices"][0]["message"]["content"] == full[:index]
    assert reply["choices"][0]["stop_reason"] == stop
    assert reply["usage"]["completion_tokens"] == _tokens_through(full, index + len(stop))
    chunks = await sse_events(session, url, "/v1/chat/completions", {**chat, "stop": stop})
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == full[:index]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_stop_token_ids_end_the_choice_without_the_token_text(
    url: str, session: aiohttp.ClientSession
) -> None:
    full = await _plain(session, url)
    ids = EmulatorTokenizer().encode(full)  # the output re-tokenizes one id per word
    target = ids[9]
    first = ids.index(target)
    status, reply = await post_json(
        session, url, _completion(stop_token_ids=[target]), "/v1/completions"
    )
    assert status == 200
    choice = reply["choices"][0]
    assert reply["usage"]["completion_tokens"] == first + 1
    assert choice["text"] == " ".join(full.split(" ")[:first])  # up to the stop token
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == target


def test_stops_before_min_tokens_are_skipped() -> None:
    seed = 12345
    text = output_text(seed, 40)
    stop = output_piece(seed, 3)
    first_end = text.index(stop) + len(stop)
    hit = find_stop(StopParams((stop,)), seed, 40, 0)
    assert hit is not None
    assert hit.output_tokens == _tokens_through(text, first_end)
    later = find_stop(StopParams((stop,)), seed, 40, hit.output_tokens)
    assert later is None or later.output_tokens > hit.output_tokens
    assert find_stop(StopParams(("\n",)), seed, 40, 0) is None


async def test_continuous_usage_stats_put_a_running_usage_on_every_chunk(
    url: str, session: aiohttp.ClientSession
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": words(7, 10)}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream_options": options,
    }
    chunks = await sse_events(session, url, "/v1/chat/completions", chat)
    running = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert running == [0, 1, 2, 3, 4, 5]  # the role chunk, then one per token
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    prompt = chunks[0]["usage"]["prompt_tokens"]
    assert all(
        c["usage"]["total_tokens"] == prompt + c["usage"]["completion_tokens"] for c in chunks
    )
    plain = await sse_events(
        session, url, "/v1/completions", _completion(5, stream_options=options)
    )
    assert [c["usage"]["completion_tokens"] for c in plain if c["choices"]] == [1, 2, 3, 4, 5]
    alone = {"include_usage": False, "continuous_usage_stats": True}  # vLLM: needs both
    chunks = await sse_events(
        session, url, "/v1/chat/completions", {**chat, "stream_options": alone}
    )
    assert all("usage" not in c for c in chunks)


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 3}, "logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
        ("/v1/chat/completions", {"echo": True}, "echo"),
        ("/v1/completions", {"logprobs": 1}, "logprobs"),
        ("/v1/completions", {"logprobs": 0}, "logprobs"),
        ("/v1/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("/v1/completions", {"echo": True}, "echo"),
        ("/v1/completions", {"stop": [""]}, "stop"),
        ("/v1/completions", {"stop": 5}, "stop"),
        ("/v1/completions", {"stop_token_ids": ["x"]}, "stop_token_ids"),
    ],
)
async def test_unsupported_or_invalid_sampling_options_are_400s(
    url: str, session: aiohttp.ClientSession, path: str, extra: dict[str, Any], param: str
) -> None:
    base: dict[str, Any] = (
        _completion()
        if path == "/v1/completions"
        else {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    status, err = await post_json(session, url, {**base, **extra}, path)
    assert status == 400
    assert err["error"]["param"] == param


async def test_disabled_logprobs_and_echo_are_accepted(
    url: str, session: aiohttp.ClientSession
) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    off = {"logprobs": False, "top_logprobs": 0, "echo": False, "stop": [], "stop_token_ids": []}
    status, reply = await post_json(session, url, {**chat, **off})
    assert status == 200
    assert reply["choices"][0]["logprobs"] is None
    plain = {"logprobs": None, "echo": False, "stop": None}
    status, _ = await post_json(session, url, _completion(2, **plain), "/v1/completions")
    assert status == 200


def _first_stop_by_full_text(
    strings: tuple[str, ...], seed: int, output_tokens: int, min_tokens: int
) -> int | None:
    """The oracle: the output tokens through the first stop string that ends after token
    ``min_tokens``, found by generating every token (what ``find_stop`` may cut short)."""
    text, ends = "", []
    for k in range(output_tokens):
        text += output_piece(seed, k)
        ends.append(len(text))
    for k in range(min_tokens, output_tokens):
        start = ends[k - 1] if k else 0
        if any(text.find(s, max(0, start - len(s) + 1), ends[k]) != -1 for s in strings):
            return k + 1
    return None


@given(
    seed=st.integers(0, 1 << 20),
    stops=st.lists(st.text("abcdefghijklmnopqrstuvwxyz ", min_size=1, max_size=9), max_size=3),
    output_tokens=st.integers(1, 700),
    min_tokens=st.integers(0, 300),
)
@settings(max_examples=300, deadline=None)
def test_the_bounded_stop_scan_finds_what_the_full_text_holds(
    seed: int, stops: list[str], output_tokens: int, min_tokens: int
) -> None:
    strings = (*stops, output_piece(seed, 1 + seed % 200).strip())
    hit = find_stop(StopParams(strings), seed, output_tokens, min_tokens)
    expected = _first_stop_by_full_text(strings, seed, output_tokens, min_tokens)
    assert (hit.output_tokens if hit else None) == expected


def test_a_stop_that_never_comes_is_not_looked_for_in_every_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The output repeats every ``len(OUTPUT_WORDS)`` tokens, so the scan ends after a period
    past ``min_tokens`` and the longest stop; scanning every one of n x max_tokens tokens once
    froze the event loop (16,384 x 16,000: minutes)."""
    pieces = [0]

    def counted(seed: int, index: int) -> str:
        pieces[0] += 1
        return output_piece(seed, index)

    monkeypatch.setattr(sampling, "output_piece", counted)
    assert find_stop(StopParams(("zzzzz",)), 7, 16_000, 100) is None
    assert pieces[0] <= 100 + 2 * len(OUTPUT_WORDS) + len("zzzzz") + 1
