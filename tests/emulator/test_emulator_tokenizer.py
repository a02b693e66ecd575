"""The emulator tokenizer and chat template (pure): determinism, prefix sharing, block hashes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.emulator.tokenizer import (
    SPECIAL_IDS,
    VOCAB_SIZE,
    EmulatorTokenizer,
    output_text,
    prompt_block_hashes,
    render_chat,
)
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=80)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _text}
)


def test_short_words_are_one_token_and_long_words_cost_one_per_four_chars() -> None:
    tok = EmulatorTokenizer()
    assert len(tok.encode_plain("a bb ccc dddd")) == 4
    assert len(tok.encode_plain("abcdefghij")) == 3
    assert len(tok.encode_plain(" abcdefgh")) == 2
    assert tok.encode("<|begin_of_text|>x") == [
        SPECIAL_IDS["<|begin_of_text|>"],
        tok.encode("x")[0],
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(_message, min_size=1, max_size=5), _text, _text)
def test_a_conversation_is_a_token_prefix_of_its_continuation(
    messages: list[dict[str, str]], answer: str, follow_up: str
) -> None:
    tok = EmulatorTokenizer()
    before = tok.encode_chat(messages)
    after = tok.encode_chat(
        [
            *messages,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": follow_up},
        ]
    )
    assert after[: len(before)] == before
    assert all(0 < t < VOCAB_SIZE for t in after)


@settings(max_examples=60, deadline=None)
@given(_text)
def test_tokenization_is_deterministic_and_cache_independent(text: str) -> None:
    long_text = (text + " ") * 40  # long enough for the segment cache
    fresh = EmulatorTokenizer()
    warm = EmulatorTokenizer()
    warm.encode(long_text)
    assert fresh.encode(long_text) == warm.encode(long_text) == warm.encode(long_text)


def test_output_text_retokenizes_to_its_token_count() -> None:
    tok = EmulatorTokenizer()
    for tokens in (1, 2, 17, 64):
        assert len(tok.encode_plain(output_text(12345, tokens))) == tokens


def test_block_hashes_match_the_routing_tokens_key_mode() -> None:
    """Hashes of the emulator equal the router's ``tokens`` key with the same seed and block."""
    tok = EmulatorTokenizer()
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi " * 100}]}
    ids = tok.encode_chat(body["messages"])
    builder = key_builder(KeySpec(mode="tokens", block_size=16), tok)
    seed = builder.seed("m", None, None)
    key = builder.key(parse_chat(body))
    assert key.block_hashes == prompt_block_hashes(ids, 16, seed)
    assert len(key.block_hashes) == len(ids) // 16


def test_shared_text_prefix_shares_blocks() -> None:
    tok = EmulatorTokenizer()
    doc = "the shared document " * 50
    a = prompt_block_hashes(tok.encode_chat([{"role": "user", "content": doc + "first?"}]), 16, 0)
    b = prompt_block_hashes(tok.encode_chat([{"role": "user", "content": doc + "other?"}]), 16, 0)
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert shared >= 10
    assert render_chat([{"role": "user", "content": "x"}]).endswith("<|end_header_id|>")
