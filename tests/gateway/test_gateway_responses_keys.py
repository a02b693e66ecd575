"""Keying Responses and embeddings bodies (``routing.parse``) and their body limits: a Responses
request keys as the chat it renders, so it shares blocks with the same conversation sent as a
chat, in every key mode; bad shapes are 400s naming the Responses param."""

from __future__ import annotations

from typing import Any

import pytest

from warmfleet.core.errors import BadRequestError
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.gateway.openai.body import parse_request_body
from warmfleet.gateway.server_config import LimitsConfig
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import (
    parse_chat,
    parse_completions,
    parse_embeddings,
    parse_responses,
)

SYSTEM = "You are a cache. " * 20
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}


def responses_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "instructions": SYSTEM,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "look it up"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "found"},
        ],
        **extra,
    }


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "look it up"}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
        ],
        **extra,
    }


@pytest.mark.parametrize("mode", ["text", "bytes", "tokens"])
def test_a_responses_request_keys_as_its_chat(mode: str) -> None:
    keys = key_builder(KeySpec(mode=mode, block_size=16), EmulatorTokenizer())
    response = keys.key(parse_responses(responses_body(max_output_tokens=7)))
    chat = keys.key(parse_chat(chat_body(max_tokens=7)))
    assert response == chat
    assert response.output_tokens_hint == 7
    assert len(response.block_hashes) > 2
    shorter = keys.key(parse_responses({"model": "m", "instructions": SYSTEM, "input": "q"}))
    assert shorter.block_hashes[:2] == response.block_hashes[:2]  # the shared prefix
    assert shorter != keys.key(parse_responses({"model": "m", "input": "q"}))


def test_a_string_input_is_one_user_message() -> None:
    request = parse_responses({"model": "m", "input": "hi", "prompt_cache_key": "t1"})
    assert request.messages == [{"role": "user", "content": "hi"}]
    assert request.tenant == "t1"


def user(part: object) -> dict[str, Any]:
    return {"role": "user", "content": [part]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": []}, "input"),
        ({"input": ["x"]}, "input[0]"),
        ({"input": "x", "instructions": 3}, "instructions"),
        ({"input": [{"role": 1, "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": 1}]}, "input[0].content"),
        ({"input": [user({"type": "input_text"})]}, "input[0].content[0].text"),
        ({"input": [user({"type": "input_image"})]}, "input[0].content[0].image_url"),
        ({"input": [user({"type": "refusal"})]}, "input[0].content[0].refusal"),
        ({"input": [user({"type": "image_url", "image_url": 1})]}, "input[0].content[0].image_url"),
        ({"input": [user(7)]}, "input[0].content[0]"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": 5}]}, "input[0].type"),
        ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "x", "tools": {}}, "tools"),
        ({"input": "x", "model": ""}, "model"),
    ],
)  # fmt: skip
def test_bad_responses_bodies_name_their_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_responses({"model": "m", **body})
    assert info.value.param == param


def test_other_items_are_keyed_by_their_content() -> None:
    keys = key_builder(KeySpec(mode="text", block_size=16))
    reasoning = {"type": "reasoning", "id": "r1", "summary": []}
    one = keys.key(
        parse_responses({"model": "m", "input": [reasoning, {"role": "user", "content": "q"}]})
    )
    two = keys.key(
        parse_responses(
            {"model": "m", "input": [{**reasoning, "id": "r2"}, {"role": "user", "content": "q"}]}
        )
    )
    assert one != two


def test_embeddings_key_as_a_completions_batch() -> None:
    keys = key_builder(KeySpec(mode="text", block_size=16))
    batch = ["alpha " * 20, "beta"]
    embeddings = parse_embeddings({"model": "m", "input": batch})
    assert embeddings.output_tokens_hint == 0
    completions = parse_completions({"model": "m", "prompt": batch, "max_tokens": 0})
    assert keys.key(embeddings) == keys.key(completions)
    with pytest.raises(BadRequestError) as info:
        parse_embeddings({"model": "m", "input": [["x"]]})
    assert info.value.param == "input"


def test_body_limits_count_responses_items_and_embeddings_inputs() -> None:
    limits = LimitsConfig(max_messages=2, max_prompts=2, max_content_parts=3)
    items = [{"role": "user", "content": "x"}] * 3
    with pytest.raises(BadRequestError) as info:
        parse_request_body(
            b'{"input": %s}' % str(items).replace("'", '"').encode(), limits, kind="responses"
        )
    assert info.value.param == "input"
    with pytest.raises(BadRequestError) as info:
        parse_request_body(b'{"input": ["a", "b", "c"]}', limits, kind="embeddings")
    assert info.value.param == "input"
    parts = b'{"input": [{"role": "user", "content": [%s]}]}' % b",".join(
        [b'{"type": "input_text", "text": "%d"}' % i for i in range(4)]
    )
    with pytest.raises(BadRequestError) as info:
        parse_request_body(parts, limits, kind="responses")
    assert "content parts" in str(info.value)
    assert parse_request_body(b'{"input": ["a", "b"]}', limits, kind="embeddings")
    with pytest.raises(BadRequestError) as info:
        parse_request_body(b'{"messages": [1, 2, 3]}', limits, kind="tokenize")
    assert info.value.param == "messages"
