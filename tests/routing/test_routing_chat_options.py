"""Chat rendering options for ``tokens`` keys (``routing.chat_options``).

vLLM renders a chat request with more than ``messages`` and ``tools``
(``ChatCompletionRequest.build_chat_params`` in
``vllm/entrypoints/openai/chat_completion/protocol.py``, ``merge_kwargs`` in
``vllm/renderers/params.py``); the key builder reads those fields in ``tokens`` mode and hands
them to the tokenizer. Rendering with a real template: ``tests/gateway/
test_gateway_chat_template_options.py``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from test_routing_keys import FakeTokenizer

from warmfleet.core.errors import BadRequestError
from warmfleet.routing.chat_options import (
    DEFAULT_CHAT_OPTIONS,
    ChatTemplateOptions,
    chat_template_options,
)
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.router import Router


class CharTokenizer(FakeTokenizer):
    """``FakeTokenizer`` that records the options of the last chat it encoded."""

    def __init__(self) -> None:
        self.options: ChatTemplateOptions | None = None

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> list[int]:
        self.options = options
        return super().encode_chat(messages, tools=tools, options=options)


def router(tokenizer: CharTokenizer | None = None, **key: Any) -> Router:
    config = RoutingConfig(key=KeySpec(**key), strategy=strategy_config("prefix_affinity"))
    return Router(config, random.Random(0), tokenizer)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello " * 60}], **extra}


def test_defaults_when_no_field_is_set() -> None:
    assert chat_template_options(chat()) is DEFAULT_CHAT_OPTIONS


def test_precedence_follows_vllm_merge_kwargs() -> None:
    """Request fields win over same-named kwargs unless null; null/"auto" kwargs are unset."""
    opts = chat_template_options(
        chat(
            add_generation_prompt=False,
            documents=None,
            reasoning_effort=None,
            chat_template_kwargs={
                "add_generation_prompt": True,
                "continue_final_message": True,
                "documents": [{"title": "t"}],
                "reasoning_effort": "high",
                "enable_thinking": False,
                "unset": None,
                "auto": "auto",
            },
        )
    )
    assert opts.add_generation_prompt is False
    assert opts.continue_final_message is False
    assert opts.documents == [{"title": "t"}]
    assert opts.template_kwargs == {"reasoning_effort": "high", "enable_thinking": False}
    fields_set = chat_template_options(
        chat(
            documents=[{"title": "a", "text": "b"}],
            reasoning_effort="low",
            add_special_tokens=True,
            chat_template_kwargs={"documents": [{"x": "y"}], "reasoning_effort": "high"},
        )
    )
    assert fields_set.documents == [{"title": "a", "text": "b"}]
    assert fields_set.template_kwargs == {"reasoning_effort": "low"}
    assert fields_set.add_special_tokens is True


def test_tokens_mode_hands_the_options_to_the_tokenizer() -> None:
    tok = CharTokenizer()
    r = router(tok, mode="tokens", block_size=4)
    with_prompt = r.key(parse_chat(chat()))
    without = r.key(parse_chat(chat(add_generation_prompt=False)))
    assert tok.options is not None
    assert tok.options.add_generation_prompt is False
    assert with_prompt.prompt_tokens == without.prompt_tokens + len("assistant: ")
    r.key(parse_chat(chat(chat_template_kwargs={"enable_thinking": False})))
    assert tok.options is not None
    assert tok.options.template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"chat_template": "{{ x }}"}, "chat_template"),
        ({"add_generation_prompt": 0}, "add_generation_prompt"),
        # vLLM declares these ``bool`` with a default: an explicit null fails its validation
        ({"add_generation_prompt": None}, "add_generation_prompt"),
        ({"continue_final_message": None}, "continue_final_message"),
        ({"add_special_tokens": None}, "add_special_tokens"),
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ({"documents": {"title": "x"}}, "documents"),
    ],
)
def test_tokens_mode_refuses_malformed_fields(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as err:
        router(CharTokenizer(), mode="tokens").key(parse_chat(chat(**fields)))
    assert err.value.param == param


@pytest.mark.parametrize("mode", ["text", "bytes"])
def test_text_and_bytes_modes_ignore_the_rendering_fields(mode: str) -> None:
    """They key a canonical rendering of the messages: the fields only change the prompt's
    tail, so they neither change the key nor are validated there."""
    r = router(mode=mode, block_size=16)
    plain = r.key(parse_chat(chat()))
    for extra in (
        {"add_generation_prompt": False, "chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template": "{{ x }}", "continue_final_message": True, "documents": "x"},
    ):
        assert r.key(parse_chat(chat(**extra))) == plain


def test_the_engines_default_kwargs_go_under_the_requests() -> None:
    """vLLM's ``--default-chat-template-kwargs``: every request renders with them, its own
    ``chat_template_kwargs`` entries win, and the request fields still win over both."""
    defaults = {"enable_thinking": False, "flavour": "plain"}
    options = chat_template_options(chat(), defaults)
    assert options.template_kwargs == defaults
    options = chat_template_options(chat(chat_template_kwargs={"flavour": "spicy"}), defaults)
    assert options.template_kwargs == {"enable_thinking": False, "flavour": "spicy"}
    options = chat_template_options(
        chat(chat_template_kwargs={"enable_thinking": None}), {"enable_thinking": True}
    )
    assert "enable_thinking" not in options.template_kwargs  # null: unset, as in vLLM
    options = chat_template_options(chat(add_generation_prompt=False), {"add_generation_prompt": 1})
    assert options.add_generation_prompt is False


def test_the_key_builder_passes_the_configured_defaults() -> None:
    tokenizer = CharTokenizer()
    r = router(tokenizer, mode="tokens", default_chat_template_kwargs={"enable_thinking": False})
    r.key(parse_chat(chat()))
    assert tokenizer.options is not None
    assert tokenizer.options.template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("name", ["messages", "conversation", "self", "chat_template"])
def test_defaults_that_would_replace_the_renderers_arguments_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="default_chat_template_kwargs"):
        KeySpec(mode="tokens", default_chat_template_kwargs={name: "x"})


def test_tools_are_left_out_with_tool_choice_none_when_the_engines_do() -> None:
    """vLLM's --exclude-tools-when-tool-choice-none: tool_choice "none" renders without tools."""
    tools = [{"type": "function", "function": {"name": "look"}}]
    request = chat(tools=tools, tool_choice="none")
    plain = router(CharTokenizer(), mode="tokens").key(parse_chat(chat()))
    with_tools = router(CharTokenizer(), mode="tokens").key(parse_chat(request))
    assert with_tools.block_hashes != plain.block_hashes
    excluding = router(CharTokenizer(), mode="tokens", exclude_tools_when_tool_choice_none=True)
    assert excluding.key(parse_chat(request)).block_hashes == plain.block_hashes
    auto = excluding.key(parse_chat(chat(tools=tools, tool_choice="auto")))
    assert auto.block_hashes == with_tools.block_hashes
