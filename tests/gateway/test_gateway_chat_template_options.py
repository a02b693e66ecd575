"""``tokens`` keys render chat requests with vLLM's request fields, not only messages and tools.

vLLM (``ChatCompletionRequest.build_chat_params``/``build_tok_params``, ``vllm/renderers``) hands
its chat template ``add_generation_prompt``, ``continue_final_message``, ``documents``,
``reasoning_effort`` and ``chat_template_kwargs`` and encodes with ``add_special_tokens``; a key
that ignores them names other tokens than the engine caches. Each expected prompt below is
written out by hand and encoded with the raw tokenizer, so the tests fail on a renderer that
drops a field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.tokenizers import TEMPLATE, write_model
from warmfleet.core.errors import BadRequestError
from warmfleet.core.types import RoutingKey
from warmfleet.emulator.protocol import chat_prompt_ids
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.key_modes import KeyBuilder, key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat

BS = 4
USER = [{"role": "user", "content": "where is the cache?"}]
HEAD = "<s><|im_start|>user\nwhere is the cache?<|im_end|>\n"
GEN = "<|im_start|>assistant\n"


@pytest.fixture
def tok(tmp_path: Path) -> HfChatTokenizer:
    return HfChatTokenizer.from_dir(write_model(tmp_path))


def keys_of(tok: HfChatTokenizer) -> KeyBuilder:
    return key_builder(KeySpec(mode="tokens", block_size=BS), tok)


def body(messages: list[dict[str, Any]] = USER, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **fields}


def key_of_text(
    keys: KeyBuilder, tok: HfChatTokenizer, text: str, special: bool = False
) -> RoutingKey:
    """The key of exactly ``text`` (encoded with or without the tokenizer's special tokens)."""
    ids = tok.encode_prompt(text) if special else tok.encode_raw(text)
    return keys.from_token_ids(ids, keys.seed("m", None, None), 0, BS)


def assert_keys_text(tok: HfChatTokenizer, request: dict[str, Any], text: str) -> None:
    keys = keys_of(tok)
    key = keys.key(parse_chat(request))
    assert tok._tokenizer.decode(tok.encode_raw(text), skip_special_tokens=False) == text
    assert key == key_of_text(keys, tok, text)


def rendered(before_messages: str = "", tail: str = GEN) -> str:
    """The default prompt with ``before_messages`` after the BOS and ``tail`` at the end."""
    return "<s>" + before_messages + HEAD.removeprefix("<s>") + tail


def test_defaults_render_the_generation_prompt(tok: HfChatTokenizer) -> None:
    assert_keys_text(tok, body(), HEAD + GEN)


def test_add_generation_prompt_false(tok: HfChatTokenizer) -> None:
    assert_keys_text(tok, body(add_generation_prompt=False), HEAD)


def test_chat_template_kwargs_become_template_variables(tok: HfChatTokenizer) -> None:
    """Qwen3's ``enable_thinking: false`` (the common case) changes the prompt's tail."""
    request = body(chat_template_kwargs={"enable_thinking": False})
    assert_keys_text(tok, request, HEAD + GEN + "<think>\n\n</think>\n\n")


def test_request_fields_win_over_kwargs_of_the_same_name(tok: HfChatTokenizer) -> None:
    """``merge_kwargs(chat_template_kwargs, fields)``: a field wins unless it is null."""
    # add_generation_prompt is always set (default true), so the kwarg never applies
    assert_keys_text(tok, body(chat_template_kwargs={"add_generation_prompt": False}), HEAD + GEN)
    docs_kwarg = {"documents": [{"title": "k", "text": "v"}]}
    assert_keys_text(tok, body(chat_template_kwargs=docs_kwarg), rendered("<docs>[k|v]</docs>"))
    both = body(documents=[{"title": "a", "text": "b"}], chat_template_kwargs=docs_kwarg)
    assert_keys_text(tok, both, rendered("<docs>[a|b]</docs>"))
    effort = body(reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"})
    assert_keys_text(tok, effort, rendered("<effort>low</effort>"))
    kwarg_effort = body(chat_template_kwargs={"reasoning_effort": "high"})
    assert_keys_text(tok, kwarg_effort, rendered("<effort>high</effort>"))


def test_unset_kwargs_are_dropped_and_unknown_ones_ignored(tok: HfChatTokenizer) -> None:
    """Entries valued null or "auto" are vLLM's "unset" (merge_kwargs): the template sees no
    ``enable_thinking``. Names the template never reads are dropped, as vLLM drops them."""
    for value in (None, "auto"):
        assert_keys_text(tok, body(chat_template_kwargs={"enable_thinking": value}), HEAD + GEN)
    assert_keys_text(tok, body(chat_template_kwargs={"not_in_template": [1, 2]}), HEAD + GEN)
    assert_keys_text(tok, body(chat_template_kwargs=None), HEAD + GEN)


def test_kwargs_override_special_tokens(tok: HfChatTokenizer) -> None:
    """transformers: ``{**special_tokens_map, **kwargs}``."""
    request = body(chat_template_kwargs={"bos_token": "<|im_end|>"})
    assert_keys_text(tok, request, "<|im_end|>" + HEAD.removeprefix("<s>") + GEN)


def test_kwargs_tools_replace_the_request_tools(tok: HfChatTokenizer) -> None:
    """``ChatParams.with_defaults``: a ``tools`` kwarg wins over the request's tools, as is."""
    tool = {"type": "function", "function": {"name": "f"}}
    raw = {"name": "g"}
    request = body(tools=[tool], chat_template_kwargs={"tools": [raw]})
    assert_keys_text(tok, request, rendered("<tools>" + json.dumps(raw) + "</tools>"))


def test_documents_reach_the_template(tok: HfChatTokenizer) -> None:
    docs = [{"title": "t1", "text": "x"}, {"title": "t2", "text": "y"}]
    assert_keys_text(tok, body(documents=docs), rendered("<docs>[t1|x][t2|y]</docs>"))


def test_continue_final_message_cuts_after_the_final_content(tok: HfChatTokenizer) -> None:
    """The assistant prefill is left open (no end-of-turn), as transformers cuts it; trailing
    whitespace the template trimmed is not expected back."""
    for content in ("The cache is", "The cache is  "):
        messages = [*USER, {"role": "assistant", "content": content}]
        request = body(messages, add_generation_prompt=False, continue_final_message=True)
        assert_keys_text(tok, request, HEAD + GEN + "The cache is")


def test_continue_final_message_needs_add_generation_prompt_false(tok: HfChatTokenizer) -> None:
    """vLLM refuses both (its validator, or transformers when only the default is true)."""
    messages = [*USER, {"role": "assistant", "content": "The"}]
    for extra in ({}, {"add_generation_prompt": True}):
        with pytest.raises(BadRequestError) as err:
            keys_of(tok).key(parse_chat(body(messages, continue_final_message=True, **extra)))
        assert err.value.param == "continue_final_message"


def test_cut_after_final_message_mirrors_transformers() -> None:
    from warmfleet.gateway.tokenizer import cut_after_final_message  # noqa: PLC0415

    assert cut_after_final_message("a<x>hi there</x>", "hi") == "a<x>hi"
    assert cut_after_final_message("<x>hi</x><x>hi</x>", "hi") == "<x>hi</x><x>hi"
    assert cut_after_final_message("<x>hi</x>", " hi ") == "<x>hi"  # template trimmed it
    assert cut_after_final_message("<x> hi </x>", "hi ") == "<x> hi "  # template kept it
    assert cut_after_final_message("<x></x>", "") == "<x></x>"
    with pytest.raises(BadRequestError):
        cut_after_final_message("<x>other</x>", "hi")


def test_add_special_tokens_adds_them_to_the_rendered_text(tok: HfChatTokenizer) -> None:
    """vLLM's chat default is false; true adds the tokenizer's BOS on top of the template's."""
    keys = keys_of(tok)
    text = HEAD + GEN
    key = keys.key(parse_chat(body(add_special_tokens=True)))
    assert key == key_of_text(keys, tok, text, special=True)
    assert key.prompt_tokens == len(tok.encode_raw(text)) + 1
    assert keys.key(parse_chat(body(add_special_tokens=False))) == key_of_text(keys, tok, text)
    # a truthy tokenize kwarg: the template encodes the text itself, without special tokens
    tokenized = body(add_special_tokens=True, chat_template_kwargs={"tokenize": True})
    assert keys.key(parse_chat(tokenized)) == key_of_text(keys, tok, text)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"chat_template_kwargs": {"chat_template": "x"}}, "chat_template_kwargs.chat_template"),
        ({"add_generation_prompt": "no"}, "add_generation_prompt"),
        ({"continue_final_message": 1}, "continue_final_message"),
        ({"add_special_tokens": "true"}, "add_special_tokens"),
        ({"documents": "doc"}, "documents"),
        ({"documents": [1]}, "documents"),
        ({"documents": [{"title": 1}]}, "documents"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tools": "x"}}, "chat_template_kwargs.tools"),
        ({"chat_template_kwargs": {"documents": [1]}}, "chat_template_kwargs.documents"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
        ({"chat_template_kwargs": {"conversation": []}}, "chat_template_kwargs.conversation"),
    ],
)
def test_malformed_fields_are_bad_requests(
    tok: HfChatTokenizer, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequestError) as err:
        keys_of(tok).key(parse_chat(body(**fields)))
    assert err.value.param == param


def test_null_request_template_is_no_template(tok: HfChatTokenizer) -> None:
    plain = keys_of(tok).key(parse_chat(body()))
    request = body(chat_template=None, chat_template_kwargs={"chat_template": None})
    assert keys_of(tok).key(parse_chat(request)) == plain


def test_template_failures_on_kwarg_values_are_bad_requests(tmp_path: Path) -> None:
    """A kwarg the template computes with (here a number) can make it raise a plain TypeError;
    vLLM answers that with a 400, and so must the key builder (never a 500)."""
    template = "{{ messages[0].content }}{{ budget + 1 }}"
    tok = HfChatTokenizer.from_dir(write_model(tmp_path, template))
    keys = keys_of(tok)
    assert keys.key(parse_chat(body(chat_template_kwargs={"budget": 1}))).units > 0
    with pytest.raises(BadRequestError):
        keys.key(parse_chat(body(chat_template_kwargs={"budget": "x"})))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
names = st.sampled_from(
    ["enable_thinking", "tools", "documents", "bos_token", "messages", "tokenize", "x", "budget"]
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "add_generation_prompt": json_values,
        "continue_final_message": json_values,
        "add_special_tokens": json_values,
        "documents": json_values,
        "reasoning_effort": json_values,
        "chat_template": json_values,
        "chat_template_kwargs": st.dictionaries(names, json_values, max_size=4) | json_values,
    },
)


@pytest.fixture(scope="module")
def shared_tok(tmp_path_factory: pytest.TempPathFactory) -> HfChatTokenizer:
    """One tokenizer for every hypothesis example; its template also computes with a kwarg."""
    template = TEMPLATE + "{% if budget is defined %}{{ budget * 2 }}{% endif %}"
    return HfChatTokenizer.from_dir(write_model(tmp_path_factory.mktemp("tok"), template))


@settings(max_examples=150, deadline=None)
@given(extra=fields)
def test_arbitrary_fields_only_ever_raise_bad_request(
    shared_tok: HfChatTokenizer, extra: Any
) -> None:
    messages = [*USER, {"role": "assistant", "content": "so"}]
    try:
        key = keys_of(shared_tok).key(parse_chat(body(messages, **extra)))
    except BadRequestError as err:
        param = err.param
    else:
        param = "ok" if isinstance(key, RoutingKey) else None
    assert param  # every refusal names the field


def test_emulator_tokenizer_keys_what_the_emulator_renders() -> None:
    """The emulator's server reads ``add_generation_prompt`` only; its tokenizer, used as the
    gateway's, must key the same ids for the same body."""
    tok = EmulatorTokenizer()
    keys = key_builder(KeySpec(mode="tokens", block_size=BS), tok)
    for request in (body(), body(add_generation_prompt=False)):
        ids = chat_prompt_ids(request, tok)
        assert keys.key(parse_chat(request)).prompt_tokens == len(ids)
    assert len(chat_prompt_ids(body(add_generation_prompt=False), tok)) < len(
        chat_prompt_ids(body(), tok)
    )
