"""Crafted bodies against the key's work: a client's ``cache_salt`` is never kept, a template
that drops the final message is found out in linear time, big tool arguments parse the same on
the yielding path, and a Responses text item is checked like a content part."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.errors import BadRequestError
from warmfleet.core.hashing import chain_seed
from warmfleet.core.jsonio import FAST_PARSE_MAX_VALUES, loads_text_yielding
from warmfleet.gateway.tokenizer import cut_after_final_message
from warmfleet.routing.canonical import render_chat_text
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.keys import KeyHasher
from warmfleet.routing.parse import parse_chat, parse_responses


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------------------------
# The chain seed


def test_a_salted_seed_chains_the_salt_onto_the_unsalted_one() -> None:
    hasher = KeyHasher(KeySpec())
    salt = hasher.spec.salt
    for tenant in (None, "t"):
        assert hasher.seed("m", None, tenant) == chain_seed(salt, "m", None, tenant)
        expected = chain_seed(salt, "m", "lora", tenant, "cache_salt:s1")
        assert hasher.seed("m", "lora", tenant, "s1") == expected
        assert hasher.seed("m", "lora", tenant, "s1") == expected  # (memoised: the same)


def test_clients_salts_and_long_names_are_not_kept() -> None:
    hasher = KeyHasher(KeySpec())
    hasher.seed("m", None, None)  # the memo's entry exists before measuring
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(32):
            long = f"{i}" + "s" * (1 << 20)  # 1 MiB each: 32 MiB if kept
            hasher.seed("m", None, None, long)
            hasher.seed("m", None, long)
            del long
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 1 << 20


# --------------------------------------------------------------------------------------------
# continue_final_message's cut


@settings(max_examples=300, deadline=None)
@given(rendered=st.text("ab\n ", max_size=30), final=st.text("ab\n ", max_size=6))
def test_the_cut_finds_the_last_occurrence_as_rfind_does(rendered: str, final: str) -> None:
    at = rendered.rfind(final.strip())
    if at < 0:
        with pytest.raises(BadRequestError):
            cut_after_final_message(rendered, final)
        return
    lead = final.lstrip()
    end = at + len(lead) if rendered[at : at + len(lead)] == final else at + len(final.strip())
    assert cut_after_final_message(rendered, final) == rendered[:end]


@pytest.mark.timeout(30)
def test_a_dropped_final_message_is_found_out_in_linear_time() -> None:
    """A backward naive search over these takes minutes (~200 s here); a forward two-way
    search over both reversed, milliseconds."""
    n = 1_000_000
    rendered = "<|im_start|>user\n" + "a" * (2 * n) + "<|im_end|>\n"
    with pytest.raises(BadRequestError, match="drops the final message"):
        cut_after_final_message(rendered, "ab" + "a" * (n - 2))


# --------------------------------------------------------------------------------------------
# Tool arguments and canonical JSON


def test_many_valued_tool_arguments_render_as_the_standard_library_would() -> None:
    value = {"z": list(range(FAST_PARSE_MAX_VALUES + 5)), "a": [{"k": [1.5, None, "é"]}] * 40}
    arguments = json.dumps(value, indent=1)  # whitespace and key order are not canonical
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = {
        "model": "m",
        "messages": [{"role": "assistant", "content": None, "tool_calls": [call]}],
    }
    rendered = render_chat_text(parse_chat(body))
    assert f":f:{_canonical(value)}\x1d" in rendered


@pytest.mark.parametrize(
    "text", ["[" + "1," * FAST_PARSE_MAX_VALUES + "2]", '{"a": [' + "{}," * 30_000 + "{}]}"]
)
def test_the_yielding_text_parser_gives_json_loads_values(text: str) -> None:
    assert loads_text_yielding(text) == json.loads(text)


@pytest.mark.parametrize("text", ["[" + "1," * FAST_PARSE_MAX_VALUES + "]", "[1,", "nope"])
def test_the_yielding_text_parser_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads_text_yielding(text)


def test_nested_containers_render_as_one_canonical_dump() -> None:
    tools = [{"b": {"c": list(range(100)), "a": [[1, 2], {"y": 1, "x": [3]}]}, "e": []}]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
    assert render_chat_text(parse_chat(body)).startswith(f"\x1etools\x1f{_canonical(tools)}\x1e")


# --------------------------------------------------------------------------------------------
# Responses items


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "text"}, "input[0].text"),
        ({"type": "input_text", "text": 5}, "input[0].text"),
        ({"type": "refusal"}, "input[0].refusal"),
        ({"type": "input_image", "image_url": 3}, "input[0].image_url"),
    ],
)
def test_a_top_level_part_item_is_checked_like_a_content_part(
    item: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        parse_responses({"model": "m", "input": [item]})
    assert caught.value.param == param


def test_a_top_level_text_item_keys_as_its_text() -> None:
    request = parse_responses({"model": "m", "input": [{"type": "input_text", "text": "hi"}]})
    assert "hi" in render_chat_text(request)
