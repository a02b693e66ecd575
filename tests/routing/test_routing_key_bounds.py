"""Bounded key work: ``key.max_blocks``, canonical JSON split per element (same text), and key
building from several threads at once (the gateway keys big bodies on a worker thread)."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_routing_keys import FakeTokenizer

from warmfleet.core.config import parse_document
from warmfleet.core.errors import BadRequestError, ConfigError
from warmfleet.routing.canonical import render_chat_text
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.key_spec import CHARS_PER_TOKEN, KeySpec
from warmfleet.routing.keys import KeyHasher
from warmfleet.routing.parse import (
    MAX_OUTPUT_HINT,
    output_hint,
    parse_chat,
    parse_completions,
    parse_responses,
)
from warmfleet.routing.router import Router


def router(tokenizer: FakeTokenizer | None = None, **key: Any) -> Router:
    config = RoutingConfig.model_validate({"strategy": {"type": "prefix_affinity"}, "key": key})
    return Router(config, random.Random(0), tokenizer)


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(
    ("key", "block_units"),
    [({"mode": "text"}, 128), ({"mode": "bytes"}, 128), ({"mode": "tokens"}, 16)],
)
def test_max_blocks_caps_the_hashes_a_key_carries(key: dict[str, Any], block_units: int) -> None:
    text = "abcdefgh" * (3000 * block_units // 8)  # 3,000 blocks' worth
    default = router(FakeTokenizer(), **key).key(parse_chat(chat(text)))
    assert len(default.block_hashes) == KeySpec().max_blocks == 2048
    small = router(FakeTokenizer(), **key, max_blocks=10).key(parse_chat(chat(text)))
    assert small.block_hashes == default.block_hashes[:10]  # the same chain, cut
    assert small.prompt_tokens == default.prompt_tokens  # the load still counts everything
    units = router(FakeTokenizer(), **key, max_blocks=10, max_units=3 * block_units)
    assert len(units.key(parse_chat(chat(text))).block_hashes) == 3  # the smaller cap wins


def test_max_blocks_caps_token_id_prompts_too() -> None:
    body = {"model": "m", "prompt": list(range(5000))}
    key = router(max_blocks=7).key(parse_completions(body))
    assert len(key.block_hashes) == 7
    assert key.prompt_tokens == 5000


def test_max_blocks_is_validated_naming_the_field() -> None:
    doc = {"strategy": {"type": "random"}, "key": {"max_blocks": 0}}
    with pytest.raises(ConfigError, match=r"key\.maxBlocks"):
        parse_document(RoutingConfig, doc, "routing")


@pytest.mark.parametrize("name", ["", "x\r\ny", "x y", "tenant:"])
def test_a_tenant_header_that_no_request_can_carry_is_refused(name: str) -> None:
    doc = {"strategy": {"type": "random"}, "key": {"tenantHeader": name}}
    with pytest.raises(ConfigError, match=r"key\.tenantHeader: .*not a header name"):
        parse_document(RoutingConfig, doc, "routing")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=80,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(tools=st.lists(json_values, min_size=0, max_size=60))
def test_tools_render_as_one_canonical_dump_whatever_their_number(tools: list[Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
    rendered = render_chat_text(parse_chat(body))
    canonical = json.dumps(tools, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert rendered.startswith(f"\x1etools\x1f{canonical}\x1e")


def test_keys_built_from_several_threads_equal_the_sequential_ones() -> None:
    bodies = [chat(f"shared system prompt {'s' * 3000} / user {i % 7} " * 3) for i in range(120)]
    expected = [router().key(parse_chat(b)) for b in bodies]
    shared = router()  # one builder (its memo dicts) used by 4 threads at once
    shared.keys.spans.max_entries = 16  # cleared often: races on clear() too
    with ThreadPoolExecutor(4) as pool:
        keys = list(pool.map(lambda b: shared.key(parse_chat(b)), bodies))
    assert keys == expected


@pytest.mark.parametrize("field", ["n", "max_tokens", "max_completion_tokens"])
def test_a_count_past_64_bits_is_a_bad_request_naming_it(field: str) -> None:
    """A JSON integer of hundreds of digits (orjson leaves it to the standard library) would
    overflow the strategies' float arithmetic: it is refused as the engines refuse it."""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body[field] = 10**400
    with pytest.raises(BadRequestError) as raised:
        output_hint(body)
    assert raised.value.param == field
    body[field] = (1 << 63) - 1
    assert output_hint({**body, "max_tokens": 5} if field == "n" else body) > 0


def test_the_output_hint_is_capped_so_that_a_note_stays_a_64_bit_count() -> None:
    """``n`` x ``max_tokens``, each accepted up to 2**63 - 1, and with the prompt's tokens on
    the replica-sync wire: a hostile body must not make a note its peers refuse."""
    chat: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert output_hint({**chat, "max_tokens": (1 << 63) - 1, "n": 1 << 40}) == MAX_OUTPUT_HINT
    assert output_hint({**chat, "max_tokens": 100, "n": 2}) == 200
    completions = {"model": "m", "prompt": ["a", "b"], "max_tokens": (1 << 63) - 1, "n": 3}
    assert parse_completions(completions).output_tokens_hint == MAX_OUTPUT_HINT
    request = parse_chat({**chat, "max_completion_tokens": (1 << 63) - 1})
    assert request.output_tokens_hint == MAX_OUTPUT_HINT
    responses = {"model": "m", "input": "hi", "max_output_tokens": (1 << 63) - 1}
    assert parse_responses(responses).output_tokens_hint == MAX_OUTPUT_HINT


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 400),
    block_size=st.integers(1, 9),
    max_blocks=st.integers(1, 12),
    prefix_length=st.integers(1, 60),
    ascii_only=st.booleans(),
)
def test_a_long_text_keys_the_same_when_only_its_read_part_is_encoded(
    length: int, block_size: int, max_blocks: int, prefix_length: int, ascii_only: bool
) -> None:
    """``from_chars`` encodes an ASCII text only as far as its blocks and prefix hash read:
    the key is the one of the whole text encoded (``units`` and tokens count all of it)."""
    spec = KeySpec(block_size=block_size, max_blocks=max_blocks, prefix_length=prefix_length)
    hasher = KeyHasher(spec)
    alphabet = "abcdefgh ,." if ascii_only else "abcdé€ ,."
    text = "".join(random.Random(length).choice(alphabet) for _ in range(length))
    key = hasher.from_chars(text, seed=7, hint=3)
    if text.isascii():
        tokens = (length + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
        data = text.encode()
        whole = hasher.from_buffer(data, unit_bytes=1, seed=7, hint=3, prompt_tokens=tokens)
        assert key == whole
    assert key.units == length
    assert len(key.block_hashes) == min(length // block_size, max_blocks)
