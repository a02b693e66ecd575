"""Batched completions: a ``prompt`` array is a batch the engine runs as one request per prompt.

The key is the first prompt's (its blocks and prefix: one prompt stands for the batch, and the
engine caches each prompt under its own chain anyway), but ``prompt_tokens`` -- the load the
request puts on its instance (in-flight tokens, predicted prefill) -- counts every prompt: exactly
in ``tokens`` mode and for token-id arrays, by the one-prompt estimate in ``text``/``bytes``.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from test_routing_keys import FakeTokenizer

from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_completions
from warmfleet.routing.router import Router


def router(tokenizer: FakeTokenizer | None = None, **key: Any) -> Router:
    config = RoutingConfig(key=KeySpec(**key), strategy=strategy_config("prefix_affinity"))
    return Router(config, random.Random(0), tokenizer)


def completion(prompt: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # chars / 4 rounded up, per prompt: 10 + 2 + 1
        ("text", 13),
        # UTF-8 bytes / 4 rounded down, at least 1 per non-empty prompt: 10 + 3 + 1
        ("bytes", 14),
    ],
)
def test_batch_prompt_tokens_count_every_prompt(mode: str, expected: int) -> None:
    r = router(mode=mode, block_size=8)
    batch = ["a" * 40, "é" * 6, "c"]  # 40 chars (40 bytes), 6 chars (12 bytes), 1
    key = r.key(parse_completions(completion(batch)))
    alone = r.key(parse_completions(completion(batch[0])))
    assert key.prompt_tokens == expected
    # blocks, prefix and units stay the first prompt's; the hint covers the whole batch
    assert key == replace(
        alone, prompt_tokens=expected, output_tokens_hint=3 * alone.output_tokens_hint
    )


def test_batch_of_token_ids_counts_exactly() -> None:
    r = router(block_size=8)
    key = r.key(parse_completions(completion([list(range(20)), [7] * 9, [1]])))
    alone = r.key(parse_completions(completion(list(range(20)))))
    assert key.prompt_tokens == 20 + 9 + 1
    assert key.block_hashes == alone.block_hashes


def test_tokens_mode_counts_each_prompt_with_the_tokenizer() -> None:
    """Exact counts, not the chars / 4 estimate (this tokenizer has a token per character)."""
    r = router(FakeTokenizer(), mode="tokens", block_size=4)
    key = r.key(parse_completions(completion(["abcdefgh", "xyz", "q" * 11])))
    alone = r.key(parse_completions(completion("abcdefgh")))
    assert key.prompt_tokens == 8 + 3 + 11
    assert key.block_hashes == alone.block_hashes
    ids = r.key(parse_completions(completion([[5] * 6, [6] * 2])))
    assert ids.prompt_tokens == 8


def test_one_prompt_counts_are_unchanged() -> None:
    assert router().key(parse_completions(completion("abcde"))).prompt_tokens == 2
    assert router(mode="bytes").key(parse_completions(completion("abc"))).prompt_tokens == 1
    assert router().key(parse_completions(completion(["abcde"]))).prompt_tokens == 2
