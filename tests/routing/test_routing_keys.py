"""Routing keys: parsing, canonical text, tenants, modes and 4xx errors."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.config import parse_document
from warmfleet.core.errors import BadRequestError, ConfigError
from warmfleet.core.hashing import chain_blocks, chain_seed
from warmfleet.routing.chat_options import ChatTemplateOptions
from warmfleet.routing.config import PrefixHashConfig, RoutingConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.keys import key_from_blocks
from warmfleet.routing.parse import parse_chat, parse_completions, parse_native
from warmfleet.routing.router import Router


class FakeTokenizer:
    """One token per character (no special tokens), chat rendered as 'role: content' lines."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.encode(text)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> list[int]:
        head = f"tools: {tools}\n" if tools else ""
        text = head + "".join(f"{m['role']}: {m.get('content')}\n" for m in messages)
        if options is None or options.add_generation_prompt:
            text += "assistant: "
        return self.encode(text)


def router(**key: Any) -> Router:
    """A router whose strategy reads block hashes (keys are built in full)."""
    config = RoutingConfig(key=KeySpec(**key), strategy=strategy_config("prefix_affinity"))
    return Router(config, random.Random(0))


def chat(content: Any = "hello " * 100, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


LONG = "x" * 1000


def test_canonical_text_ignores_json_whitespace_and_key_order() -> None:
    a = json.loads(
        '{"model":"m","messages":[{"role":"system","content":"' + LONG + '"},'
        '{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",'
        '"function":{"name":"f","arguments":"{\\"b\\": 1, \\"a\\": [1, 2]}"}}]}]}'
    )
    b = json.loads(
        '{ "messages" : [ { "content" : "' + LONG + '" , "role" : "system" } ,\n'
        ' {"tool_calls": [{"type": "function", "function": '
        '{"arguments": "{\\"a\\":[1,2],\\"b\\":1}", "name": "f"}, "id": "c1"}],'
        ' "role": "assistant"} ],\n "model" : "m" }'
    )
    r = router()
    assert r.key(parse_chat(a)) == r.key(parse_chat(b))


def test_content_parts_and_images_are_keyed() -> None:
    r = router(block_size=8)
    tail = {"type": "text", "text": "and more text " * 4}

    def parts_with(url: str) -> list[dict[str, Any]]:
        text = {"type": "text", "text": "describe " * 10}
        return [text, {"type": "image_url", "image_url": {"url": url}}, tail]

    parts, same, other = parts_with("u1"), parts_with("u1"), parts_with("u2")
    k1, k2, k3 = (r.key(parse_chat(chat(p))) for p in (parts, same, other))
    assert k1 == k2
    assert k1.block_hashes != k3.block_hashes
    assert k1.block_hashes[:5] == k3.block_hashes[:5]  # shared text prefix still shared


def test_roles_names_and_tool_messages_change_the_key() -> None:
    r = router(block_size=4)
    base = {"model": "m", "messages": [{"role": "user", "content": "hi there you"}]}
    named = {"model": "m", "messages": [{"role": "user", "name": "bob", "content": "hi there you"}]}
    tool = {
        "model": "m",
        "messages": [{"role": "tool", "tool_call_id": "c1", "content": "hi there you"}],
    }
    keys = [r.key(parse_chat(b)).block_hashes for b in (base, named, tool)]
    assert len(set(keys)) == 3


def test_shared_prefix_shares_leading_blocks() -> None:
    r = router()
    system = {"role": "system", "content": "s" * 1280}
    a = r.key(
        parse_chat({"model": "m", "messages": [system, {"role": "user", "content": "a" * 300}]})
    )
    b = r.key(
        parse_chat({"model": "m", "messages": [system, {"role": "user", "content": "b" * 300}]})
    )
    assert a.block_hashes[:10] == b.block_hashes[:10]
    assert a.block_hashes[11:] != b.block_hashes[11:]
    assert a.block_size == 128
    assert a.prompt_tokens == (a.units + 3) // 4


def test_tenants_and_models_do_not_share() -> None:
    r = router()
    plain = r.key(parse_chat(chat()))
    t1 = r.key(parse_chat(chat(), "tenant-1"))
    t2 = r.key(parse_chat(chat(), "tenant-2"))
    body_wins = r.key(parse_chat(chat(prompt_cache_key="tenant-2"), "tenant-1"))
    other_model = r.key(parse_chat({**chat(), "model": "m2"}))
    # the body's prompt_cache_key is the tenant (and the session, which the header is not)
    assert replace(body_wins, session=None) == t2
    assert body_wins.session is not None
    hashes = [plain, t1, t2, other_model]
    assert len({k.block_hashes[0] for k in hashes}) == 4
    assert len({k.prefix_hash for k in hashes}) == 4


@pytest.mark.parametrize("bad", ["", "x" * 65, "caf\u00e9", "tab\there", 12, None])
def test_invalid_tenant_keys_are_rejected(bad: object) -> None:
    r = router()
    with pytest.raises(BadRequestError) as err:
        r.key(parse_chat({**chat(), "prompt_cache_key": bad} if bad is not None else chat(), ""))
    assert err.value.param in {"prompt_cache_key", "x-prefix-aware-id"}


def test_tenant_of_64_chars_is_fine() -> None:
    assert router().key(parse_chat(chat(prompt_cache_key="k" * 64))).block_hashes


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], "body"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [1]}, "messages[0]"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            },
            "messages[0].content[0].text",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "name": 3, "content": "x"}]},
            "messages[0].name",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": {"id": 1}}]},
            "messages[0].tool_calls",
        ),
        ({**chat(), "max_tokens": -1}, "max_tokens"),
        ({**chat(), "max_completion_tokens": "9"}, "max_completion_tokens"),
        ({**chat(), "tools": "f"}, "tools"),
    ],
)
def test_malformed_chat_bodies_raise_bad_request(body: Any, param: str) -> None:
    with pytest.raises(BadRequestError) as err:
        router().key(parse_chat(body))
    assert err.value.param == param


def test_output_hint() -> None:
    r = router()
    assert r.key(parse_chat(chat(max_tokens=77))).output_tokens_hint == 77
    assert r.key(parse_chat(chat(max_completion_tokens=5, max_tokens=9))).output_tokens_hint == 5


def test_completions_prompt_forms() -> None:
    r = router(block_size=8)
    text = r.key(parse_completions({"model": "m", "prompt": "abc " * 50}))
    first = r.key(parse_completions({"model": "m", "prompt": ["abc " * 50, "zzz"]}))
    # A batch is keyed by its first prompt; its output hint and prompt tokens cover both prompts.
    assert first == replace(
        text, output_tokens_hint=2 * text.output_tokens_hint, prompt_tokens=50 + 1
    )
    ids = r.key(parse_completions({"model": "m", "prompt": list(range(40))}))
    nested = r.key(parse_completions({"model": "m", "prompt": [list(range(40)), [1]]}))
    assert nested == replace(ids, output_tokens_hint=2 * ids.output_tokens_hint, prompt_tokens=41)
    assert ids.prompt_tokens == 40
    assert ids.block_size == 2  # 8 chars / 4 chars per token
    assert len(ids.block_hashes) == 20


@pytest.mark.parametrize(
    "prompt", [None, 5, [], [1, "a"], ["a", 1], [[1], []], [[-1]], [True], [[1.5]], {"a": 1}]
)
def test_malformed_completions_prompts(prompt: Any) -> None:
    with pytest.raises(BadRequestError) as err:
        router().key(parse_completions({"model": "m", "prompt": prompt}))
    assert err.value.param == "prompt"


def test_tokens_mode_uses_the_tokenizer_and_engine_block_size() -> None:
    config = RoutingConfig(
        key=KeySpec(mode="tokens", block_size=16), strategy=strategy_config("prefix_affinity")
    )
    r = Router(config, random.Random(0), FakeTokenizer())
    key = r.key(parse_chat(chat("a" * 100)))
    tokens = len("user: " + "a" * 100 + "\n" + "assistant: ")
    assert key.prompt_tokens == tokens == key.units
    assert len(key.block_hashes) == tokens // 16
    comp = r.key(parse_completions({"model": "m", "prompt": "q" * 40}))
    assert comp.prompt_tokens == 40
    assert len(comp.block_hashes) == 2


def test_tokens_mode_needs_a_tokenizer() -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        Router(RoutingConfig(key=KeySpec(mode="tokens")), random.Random(0))


def test_bytes_mode_is_aws_parity_on_raw_bodies() -> None:
    r = router(mode="bytes", block_size=16)
    raw = b'{"inputs": "' + b"y" * 100 + b'"}'
    key = r.key(parse_native(raw, None, "m"))
    seed = chain_seed("warmfleet", "m", None, None)
    full = len(raw) // 16 * 16
    expected = chain_blocks([raw[i : i + 16] for i in range(0, full, 16)], seed)
    assert key.block_hashes == expected
    assert key.units == len(raw)
    # Whitespace in the raw body changes the route in bytes mode (the AWS caveat).
    assert r.key(parse_native(raw.replace(b": ", b":"), None, "m")).block_hashes[0] != expected[0]
    assert r.key(parse_native(raw, "t", "m")).block_hashes[0] != expected[0]


def test_text_mode_on_raw_bytes_decodes_text() -> None:
    r = router(block_size=4)
    assert r.key(parse_native("héllo wörld".encode(), None, "m")).units == len("héllo wörld")
    assert r.key(parse_native(b"\xff\xfe bad utf8 here", None, "m")).units > 0


def test_prefix_hash_covers_only_the_prefix() -> None:
    config = RoutingConfig(strategy=PrefixHashConfig(prefix_length=1024))
    r = Router(config, random.Random(0))
    a = r.key(parse_chat(chat("p" * 1100 + "a")))
    b = r.key(parse_chat(chat("p" * 1100 + "b")))
    c = r.key(parse_chat(chat("q" + "p" * 1100)))
    assert a.prefix_hash == b.prefix_hash != c.prefix_hash
    assert a.block_hashes == b.block_hashes == ()  # prefix_hash reads only prefix_hash


def test_max_units_caps_hashed_blocks() -> None:
    key = router(max_units=256).key(parse_chat(chat("z" * 5000)))
    assert len(key.block_hashes) == 2
    assert key.units > 5000


def test_key_holds_only_integers() -> None:
    key = router().key(parse_chat(chat("secret " * 100)))
    assert all(isinstance(h, int) for h in key.block_hashes)
    assert "secret" not in repr(key)


def test_key_spec_validation() -> None:
    with pytest.raises(ConfigError, match="blockSize"):
        parse_document(RoutingConfig, {"key": {"block_size": 0}})
    with pytest.raises(ConfigError, match="unknown"):
        parse_document(RoutingConfig, {"key": {"unknown": 1}})
    assert KeySpec(mode="tokens").effective_block_size == 16
    assert KeySpec().effective_block_size == 128


def test_key_from_blocks_prefix_hash() -> None:
    blocks = tuple(range(1, 11))
    key = key_from_blocks(
        blocks, block_size=16, units=170, prompt_tokens=170, prefix_length=64, seed=1
    )
    assert key.prefix_hash == 4
    short = key_from_blocks((), block_size=16, units=5, prompt_tokens=5, prefix_length=64, seed=1)
    assert (
        short.prefix_hash
        != key_from_blocks(
            (), block_size=16, units=6, prompt_tokens=6, prefix_length=64, seed=1
        ).prefix_hash
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
message_like = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "tool"]) | json_values},
    optional={
        "content": json_values
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url", "input_audio"]) | json_values},
                optional={"text": json_values, "image_url": json_values},
            ),
            max_size=3,
        ),
        "name": json_values,
        "tool_calls": json_values,
        "tool_call_id": json_values,
    },
)
body_like = st.fixed_dictionaries(
    {},
    optional={
        "model": st.just("m") | json_values,
        "messages": st.lists(message_like, max_size=3) | json_values,
        "prompt": json_values,
        "prompt_cache_key": json_values,
        "max_tokens": json_values,
        "tools": json_values,
    },
)


@settings(max_examples=100, deadline=None)
@given(body=body_like | json_values, tenant=st.none() | st.text(max_size=70))
def test_arbitrary_json_only_ever_raises_bad_request(body: Any, tenant: str | None) -> None:
    r = router(block_size=4)
    for parse in (parse_chat, parse_completions):
        try:
            key = r.key(parse(body, tenant))
        except BadRequestError:
            continue
        assert all(isinstance(h, int) for h in key.block_hashes)


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=300), tenant=st.none() | st.text(max_size=70))
def test_arbitrary_bytes_only_ever_raise_bad_request(raw: bytes, tenant: str | None) -> None:
    for mode in ("text", "bytes"):
        with contextlib.suppress(BadRequestError):
            router(mode=mode, block_size=8).key(parse_native(raw, tenant, "m"))


def test_ascii_fast_path_and_unicode_path_agree_on_shared_blocks() -> None:
    r = router(block_size=16)
    shared = "plain ascii text " * 20
    ascii_only = r.key(parse_completions({"model": "m", "prompt": shared + "tail" * 20}))
    unicode = r.key(parse_completions({"model": "m", "prompt": shared + "tä𝄞l" * 20}))
    n = len(shared) // 16
    assert ascii_only.block_hashes[:n] == unicode.block_hashes[:n]
    assert ascii_only.block_hashes[n + 1 :] != unicode.block_hashes[n + 1 :]
    assert unicode.units == len(shared + "tä𝄞l" * 20)
    # a lone surrogate (valid in JSON) is hashed, not an error
    assert r.key(parse_completions({"model": "m", "prompt": "\ud800" * 40})).block_hashes


def test_keys_skip_block_hashes_for_strategies_that_never_read_them() -> None:
    body = chat("a shared system prompt " * 40)
    hashed = router().key(parse_chat(body))
    for strategy in ("random", "least_outstanding_requests"):
        config = RoutingConfig.model_validate({"strategy": {"type": strategy}})
        bare = Router(config, random.Random(0)).key(parse_chat(body))
        assert bare.block_hashes == ()
        assert hashed.block_hashes
        assert (bare.prefix_hash, bare.units, bare.prompt_tokens) == (
            hashed.prefix_hash,
            hashed.units,
            hashed.prompt_tokens,
        )
    config = RoutingConfig.model_validate({"strategy": {"type": "prefix_hash"}})
    assert Router(config, random.Random(0)).key(parse_chat(body)).block_hashes == ()
