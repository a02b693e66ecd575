"""OpenAI/vLLM request semantics of routing keys: output-token hints, content parts, cache_salt.

Each test pins a behaviour of vLLM's OpenAI server (0.32, ``vllm/entrypoints/openai/*/protocol.py``
and ``vllm/renderers/chat_utils.py``) that the key builder must mirror.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from warmfleet.core.errors import BadRequestError
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat, parse_completions
from warmfleet.routing.router import Router


def router(**key: Any) -> Router:
    config = RoutingConfig(key=KeySpec(**key), strategy=strategy_config("prefix_affinity"))
    return Router(config, random.Random(0))


def chat(content: Any = "hello " * 100, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def completion(prompt: Any = "abc " * 50, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, **extra}


# ---- output-token hint ---------------------------------------------------------------------


def test_chat_hint_counts_every_choice() -> None:
    """``n`` choices decode ``n`` sequences of up to ``max_completion_tokens`` each."""
    r = router()
    assert r.key(parse_chat(chat(max_completion_tokens=100, n=4))).output_tokens_hint == 400
    assert r.key(parse_chat(chat(max_tokens=50, n=None))).output_tokens_hint == 50


def test_completions_hint_defaults_to_16() -> None:
    """The completions API (OpenAI and vLLM) generates at most 16 tokens unless told; an explicit
    null means the same."""
    r = router()
    assert r.key(parse_completions(completion())).output_tokens_hint == 16
    assert r.key(parse_completions(completion(max_tokens=None))).output_tokens_hint == 16
    assert r.key(parse_completions(completion(max_tokens=7))).output_tokens_hint == 7


def test_completions_hint_ignores_max_completion_tokens() -> None:
    """``max_completion_tokens`` is a chat parameter; vLLM's completions endpoint ignores it."""
    r = router()
    body = completion(max_completion_tokens=4000, max_tokens=10)
    assert r.key(parse_completions(body)).output_tokens_hint == 10
    only_chat_param = completion(max_completion_tokens=4000)
    assert r.key(parse_completions(only_chat_param)).output_tokens_hint == 16


def test_completions_hint_counts_every_prompt_and_choice() -> None:
    """A list of prompts is a batch: vLLM generates ``n`` completions for each prompt."""
    r = router()
    batch = completion(["a " * 40, "b " * 40, "c " * 40], max_tokens=10, n=2)
    assert r.key(parse_completions(batch)).output_tokens_hint == 60
    ids = completion([list(range(40)), list(range(40))], max_tokens=10)
    assert r.key(parse_completions(ids)).output_tokens_hint == 20
    one = completion(list(range(40)), max_tokens=10)  # one prompt of token ids
    assert r.key(parse_completions(one)).output_tokens_hint == 10


@pytest.mark.parametrize("n", [0, -1, "2", True, 1.5])
def test_bad_n_is_a_400_naming_n(n: Any) -> None:
    with pytest.raises(BadRequestError) as err:
        router().key(parse_chat(chat(max_tokens=5, n=n)))
    assert err.value.param == "n"


# ---- chat content parts (text mode) ----------------------------------------------------------


def test_text_parts_key_like_the_string_vllm_joins_them_into() -> None:
    """vLLM renders a list of text parts as their texts joined with newlines, so a message sent
    as parts and the same message sent as that string are the same prompt."""
    r = router(block_size=16)
    a = "first paragraph " * 8
    b = "second paragraph " * 8
    parts = [{"type": "text", "text": a}, {"type": "text", "text": b}]
    assert r.key(parse_chat(chat(parts))) == r.key(parse_chat(chat(a + "\n" + b)))


def test_input_text_parts_are_text() -> None:
    """``input_text`` / ``output_text`` parts (Responses-style clients) are plain text to vLLM."""
    r = router(block_size=16)
    text = "some words " * 30
    expected = r.key(parse_chat(chat(text)))
    for kind in ("input_text", "output_text"):
        assert r.key(parse_chat(chat([{"type": kind, "text": text}]))) == expected


# ---- cache_salt ------------------------------------------------------------------------------


def test_cache_salt_separates_keys() -> None:
    """vLLM's ``cache_salt`` isolates prefix-cache blocks: the same prompt under two salts (or
    none) shares no cached block, so it must not share routing affinity either."""
    r = router()
    plain = r.key(parse_chat(chat()))
    salt_a = r.key(parse_chat(chat(cache_salt="tenant-a")))
    salt_b = r.key(parse_chat(chat(cache_salt="tenant-b")))
    assert len({plain.block_hashes[0], salt_a.block_hashes[0], salt_b.block_hashes[0]}) == 3
    assert len({plain.prefix_hash, salt_a.prefix_hash, salt_b.prefix_hash}) == 3
    assert r.key(parse_chat(chat(cache_salt="tenant-a"))) == salt_a
    comp_plain = r.key(parse_completions(completion()))
    comp_salted = r.key(parse_completions(completion(cache_salt="s")))
    assert comp_plain.prefix_hash != comp_salted.prefix_hash


def test_no_cache_salt_keeps_the_unsalted_seed() -> None:
    """Requests without a salt keep the seed the KV-event translator uses (model, no tenant)."""
    r = router()
    key = r.key(parse_chat(chat(cache_salt=None)))
    assert key.chain_seed == r.keys.seed("m", None, None)
