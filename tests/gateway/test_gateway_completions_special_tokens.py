"""Completions ``add_special_tokens`` in ``tokens`` keys: vLLM adds the tokenizer's special
tokens (BOS) to a text prompt unless the request sets it false (clients that send a prompt they
templated themselves do), so the key must follow, or every block is one token off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_gateway_chat_template_options import BS

from support.tokenizers import write_model
from warmfleet.core.errors import BadRequestError
from warmfleet.emulator.protocol import completion_prompt_ids
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.key_modes import KeyBuilder, key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_completions

PROMPT = "<|im_start|>user\nwhere is the cache?<|im_end|>\n<|im_start|>assistant\n"


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": PROMPT, **fields}


def _keys(tok: Any, mode: str = "tokens") -> KeyBuilder:
    return key_builder(KeySpec(mode=mode, block_size=BS), tok)


def test_the_key_follows_add_special_tokens(tmp_path: Path) -> None:
    tok = HfChatTokenizer.from_dir(write_model(tmp_path))
    keys = _keys(tok)
    seed = keys.seed("m", None, None)
    with_bos = keys.from_token_ids(tok.encode_raw("<s>" + PROMPT), seed, 16, BS)
    without = keys.from_token_ids(tok.encode_raw(PROMPT), seed, 16, BS)
    assert with_bos != without
    assert keys.key(parse_completions(completion())) == with_bos
    assert keys.key(parse_completions(completion(add_special_tokens=True))) == with_bos
    assert keys.key(parse_completions(completion(add_special_tokens=False))) == without
    batch = keys.key(
        parse_completions(completion(prompt=[PROMPT, PROMPT], add_special_tokens=False))
    )
    assert batch.prompt_tokens == 2 * without.prompt_tokens


@pytest.mark.parametrize("value", ["no", None])
def test_a_wrong_type_is_a_400_in_tokens_mode_only(tmp_path: Path, value: object) -> None:
    """null too: vLLM declares the field ``bool`` with a default, so null fails validation."""
    tok = HfChatTokenizer.from_dir(write_model(tmp_path))
    with pytest.raises(BadRequestError) as err:
        _keys(tok).key(parse_completions(completion(add_special_tokens=value)))
    assert err.value.param == "add_special_tokens"
    _keys(tok, "text").key(parse_completions(completion(add_special_tokens="no")))  # not read


@pytest.mark.parametrize("special", [True, False])
def test_the_emulator_tokenizer_keys_what_the_emulator_encodes(special: bool) -> None:
    tok = EmulatorTokenizer()
    body = completion(add_special_tokens=special)
    ids = completion_prompt_ids(body, tok)
    keys = _keys(tok)
    assert keys.key(parse_completions(body)) == keys.from_token_ids(
        ids, keys.seed("m", None, None), 16, BS
    )
