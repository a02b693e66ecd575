"""The emulator's Responses API, embeddings and ``/detokenize``, as vLLM serves them, checked
with the official client where it has them."""

from __future__ import annotations

import base64
from array import array
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from emulator_support import MODEL, fast_spec, post_json, words

from warmfleet.emulator.embeddings import embedding
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.tokenizer import EmulatorTokenizer


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with EmulatedFleet(fast_spec()) as fleet:
        yield fleet.urls[0]


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


async def test_a_response_renders_the_chat_of_its_input(url: str) -> None:
    """Instructions + input are the chat's system + user messages: the same prompt tokens, and
    the second request's prefix is cached."""
    system, question = words(1, 40), words(2, 10)
    async with _client(url) as client:
        chat = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=3,
        )
        response = await client.responses.create(
            model=MODEL,
            instructions=system,
            input=[{"role": "user", "content": [{"type": "input_text", "text": question}]}],
            max_output_tokens=3,
        )
    assert chat.usage is not None
    assert response.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.input_tokens_details.cached_tokens > 0
    assert response.output_text == chat.choices[0].message.content
    assert response.output[0].type == "message"
    expected = "incomplete" if response.usage.output_tokens == 3 else "completed"
    assert response.status == expected


async def test_a_streamed_response_has_the_typed_events(url: str) -> None:
    async with _client(url) as client:
        stream = await client.responses.create(
            model=MODEL, input=words(3, 20), max_output_tokens=5, stream=True
        )
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    last = events[-1]
    assert last.type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == last.response.output_text
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == deltas


async def test_response_errors(url: str, session: aiohttp.ClientSession) -> None:
    status, body = await post_json(
        session, url, {"model": MODEL, "input": "x", "previous_response_id": "r"}, "/v1/responses"
    )
    assert (status, body["error"]["param"]) == (400, "previous_response_id")
    status, body = await post_json(
        session, url, {"model": MODEL, "input": "x", "max_output_tokens": 0}, "/v1/responses"
    )
    assert (status, body["error"]["param"]) == (400, "max_output_tokens")
    status, body = await post_json(
        session, url, {"model": MODEL, "input": "x", "max_output_tokens": 10**7}, "/v1/responses"
    )
    assert (status, body["error"]["param"]) == (400, "max_output_tokens")
    status, body = await post_json(session, url, {"model": "other", "input": "x"}, "/v1/responses")
    assert status == 404


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("tool_choice", '{"a": ' * 1000 + "1" + "}" * 1000),  # a 500 after the generation ran
        ("top_p", "NaN"),  # echoed as a bare NaN: not JSON
        ("metadata", '{"a": Infinity}'),
        ("metadata", '{"a": 1}'),
        ("parallel_tool_calls", '"yes"'),
    ],
)
async def test_echoed_response_fields_are_checked(
    url: str, session: aiohttp.ClientSession, field: str, raw: str
) -> None:
    data = f'{{"model": "{MODEL}", "input": "x", "max_output_tokens": 2, "{field}": {raw}}}'
    headers = {"Content-Type": "application/json"}
    async with session.post(url + "/v1/responses", data=data, headers=headers) as resp:
        body = await resp.json()
    assert (resp.status, body["error"]["param"]) == (400, field)


async def test_embeddings_are_deterministic_in_both_encodings(url: str) -> None:
    async with _client(url) as client:
        packed = await client.embeddings.create(model=MODEL, input=["a b c", "d"])
        plain = await client.embeddings.create(
            model=MODEL, input=["a b c", "d"], encoding_format="float", dimensions=64
        )
        ids_input = await client.embeddings.create(
            model=MODEL, input=[5, 6, 7], encoding_format="float"
        )
        with pytest.raises(openai.BadRequestError):
            await client.embeddings.create(model=MODEL, input="x", dimensions=0)
    ids = EmulatorTokenizer().encode_prompt("a b c")
    assert plain.data[0].embedding == pytest.approx(embedding(ids, 64))
    assert ids_input.data[0].embedding == pytest.approx(embedding([5, 6, 7], 64))
    for one, other in zip(packed.data, plain.data, strict=True):
        assert one.embedding == pytest.approx(other.embedding, rel=1e-6, abs=1e-7)
    assert plain.data[0].embedding != plain.data[1].embedding
    assert sum(v * v for v in plain.data[0].embedding) == pytest.approx(1.0)
    assert plain.usage.prompt_tokens == len(ids) + 2  # "d": BOS and one piece


async def test_base64_is_little_endian_float32(url: str, session: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "input": [1, 2], "encoding_format": "base64", "dimensions": 4}
    status, answer = await post_json(session, url, body, "/v1/embeddings")
    assert status == 200
    vector = array("f", base64.b64decode(answer["data"][0]["embedding"]))
    assert list(vector) == pytest.approx(embedding([1, 2], 4), rel=1e-6)


async def test_detokenize_reverses_tokenize_and_output(
    url: str, session: aiohttp.ClientSession
) -> None:
    text = "prefix caching keeps the hot blocks"
    status, tokens = await post_json(session, url, {"model": MODEL, "prompt": text}, "/tokenize")
    assert status == 200
    status, back = await post_json(session, url, {"tokens": tokens["tokens"]}, "/detokenize")
    assert (status, back) == (200, {"prompt": "<|begin_of_text|>" + text})
    async with _client(url) as client:
        out = await client.completions.create(model=MODEL, prompt="q", max_tokens=6)
    output_ids = EmulatorTokenizer().encode(out.choices[0].text)  # output words: known anywhere
    status, back = await post_json(session, url, {"tokens": output_ids}, "/detokenize")
    assert back["prompt"] == out.choices[0].text
    status, back = await post_json(session, url, {"tokens": [100]}, "/detokenize")
    assert back["prompt"] == "<|100|>"  # an id no text seen here hashes to
    for bad in ({"tokens": "x"}, {"tokens": [-1]}, {"tokens": [10**9]}, {"tokens": [True]}):
        status, err = await post_json(session, url, bad, "/detokenize")
        assert (status, err["error"]["param"]) == (400, "tokens")
    status, _ = await post_json(session, url, {"model": "other", "tokens": [1]}, "/detokenize")
    assert status == 404
