"""The HF tokenizer + chat-template adapter (``tokens`` key mode for real engines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_tokenizer_helpers import write_model

from warmfleet.core.errors import BadRequestError, ConfigError
from warmfleet.gateway.tokenizer import HfChatTokenizer, normalize_message
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / ".cache" / "tiny-llama"


@pytest.fixture
def tok(tmp_path: Path) -> HfChatTokenizer:
    return HfChatTokenizer.from_dir(write_model(tmp_path))


def test_render_like_vllm(tok: HfChatTokenizer) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "the cache"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert tok.render_chat(messages) == (
        "<s><|im_start|>system\nthe cache<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}


def test_chat_ids_have_one_bos_and_completions_get_one(tok: HfChatTokenizer) -> None:
    bos = tok.encode_raw("<s>")
    assert len(bos) == 1
    chat = tok.encode_chat([{"role": "user", "content": "the prefix"}])
    assert chat[0] == bos[0]
    assert chat.count(bos[0]) == 1  # the template's BOS only: no special tokens added
    assert tok.encode_prompt("the prefix") == bos + tok.encode_raw("the prefix")


def test_tokens_key_mode_uses_the_adapter(tok: HfChatTokenizer) -> None:
    keys = key_builder(KeySpec(mode="tokens", block_size=4), tok)
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "the cache holds the prefix"}],
    }
    key = keys.key(parse_chat(body))
    ids = tok.encode_chat(body["messages"])
    assert key.prompt_tokens == len(ids)
    assert len(key.block_hashes) == len(ids) // 4


def test_normalize_message_passthrough_and_errors() -> None:
    msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}], "extra": 1}
    assert normalize_message(msg) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "x"}],
    }
    with pytest.raises(BadRequestError):
        normalize_message({"role": "user", "content": 3})


def test_template_errors(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    with pytest.raises(ConfigError, match="chat_template"):
        HfChatTokenizer.from_dir(write_model(tmp_path / "bad", "{% for %}"))
    (tmp_path / "raises").mkdir()
    tok = HfChatTokenizer.from_dir(write_model(tmp_path / "raises", "{{ raise_exception('no') }}"))
    with pytest.raises(BadRequestError, match="no"):
        tok.encode_chat([{"role": "user", "content": "x"}])
    with pytest.raises(ConfigError):
        HfChatTokenizer.from_dir(tmp_path / "missing")


def test_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    write_model(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}|")
    tok = HfChatTokenizer.from_dir(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "hi|"


@pytest.mark.skipif(
    not (TINY / "tokenizer.json").is_file(),
    reason="tiny model not built (make vllm-model builds .cache/tiny-llama)",
)
def test_tiny_model_tokenizer_roundtrip() -> None:
    tok = HfChatTokenizer.from_dir(TINY)
    messages = [
        {"role": "system", "content": "def f(x):\n    return x"},
        {"role": "user", "content": "ok"},
    ]
    text = tok.render_chat(messages)
    assert text.startswith("<|begin_of_text|><|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok.encode_chat(messages)
    assert ids[0] == tok.encode_raw("<|begin_of_text|>")[0]
    assert tok._tokenizer.decode(ids, skip_special_tokens=False) == text


TOOLS_TEMPLATE = (
    "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)


def test_tools_reach_the_template_as_vllm_dumps_them(tmp_path: Path) -> None:
    """vLLM renders the request's tools into the prompt (Llama 3.1, Qwen and others print them
    first); without them every tool-calling request's token blocks differed from the engine's
    from the first block on. vLLM passes its pydantic dump: absent fields as null, in order."""
    tok = HfChatTokenizer.from_dir(write_model(tmp_path, TOOLS_TEMPLATE))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    text = tok.render_chat([{"role": "user", "content": "hi"}], tools=[tool])
    first = text.split("\n", 1)[0]
    assert json.loads(first) == {
        "type": "function",
        "function": {"name": "f", "description": None, "parameters": {"type": "object"}},
        "defer_loading": None,
    }
    assert list(json.loads(first)["function"]) == ["name", "description", "parameters"]
    keys = key_builder(KeySpec(mode="tokens", block_size=4), tok)
    plain: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with_tools = {**plain, "tools": [tool]}
    assert keys.key(parse_chat(with_tools)).prompt_tokens == len(
        tok.encode_chat(plain["messages"], tools=[tool])
    )
    assert keys.key(parse_chat(with_tools)).block_hashes != keys.key(parse_chat(plain)).block_hashes
    with pytest.raises(BadRequestError):
        tok.render_chat([{"role": "user", "content": "hi"}], tools=[1])  # type: ignore[list-item]
