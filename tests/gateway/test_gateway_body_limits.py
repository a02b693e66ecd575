"""Expensive bodies, bounded: each work limit (messages, content parts, JSON depth, prompts,
key body bytes per key mode) one over is a 400 naming the param, inline and on the worker, and
one at it is routed; the limits' validation; ``tokens`` mode's own size limit, its 400 for a lone
surrogate, and the same ids for long texts tokenized without holding the GIL."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from gateway_support import (
    CHAT,
    MODEL,
    backends_running,
    chat,
    gateway_config,
    gateway_doc,
    gateway_running,
    nested,
    post,
)

from support.tokenizers import write_model
from warmfleet.core.errors import ConfigError
from warmfleet.gateway import tokenizer as tokenizer_module
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.server_config import LimitsConfig
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.config import RoutingConfig

# --------------------------------------------------------------------------------------------
# Each limit: one over it is a 400 naming the param; one at it is routed.

LIMITS = {
    "max_messages": 3,
    "max_content_parts": 5,
    "max_json_depth": 8,
    "max_prompts": 4,
    "max_key_body_bytes": {"text": 3000, "bytes": 100},
}
PARTS = [{"type": "text", "text": f"part {i}"} for i in range(6)]
CASES = [
    # (name, path, body at the limit, body over it, param)
    (
        "messages",
        CHAT,
        chat([{"role": "user", "content": "hi"}] * 3),
        chat([{"role": "user", "content": "hi"}] * 4),
        "messages",
    ),
    (
        "content parts",
        CHAT,
        chat([{"role": "user", "content": PARTS[:3]}, {"role": "user", "content": PARTS[3:5]}]),
        chat([{"role": "user", "content": PARTS[:3]}, {"role": "user", "content": PARTS[3:]}]),
        "messages",
    ),
    (
        "json depth",  # the body is level 1: 7 nested arrays reach level 8
        CHAT,
        chat([{"role": "user", "content": "hi"}], metadata={"x": nested(6)}),
        chat([{"role": "user", "content": "hi"}], metadata={"x": nested(7)}),
        "metadata",
    ),
    (
        "prompts",
        "/v1/completions",
        {"model": MODEL, "prompt": ["a", "b", "c", "d"]},
        {"model": MODEL, "prompt": ["a", "b", "c", "d", "e"]},
        "prompt",
    ),
    (
        "key body bytes (text mode: 3000)",
        CHAT,
        chat([{"role": "user", "content": "x" * 2800}]),
        chat([{"role": "user", "content": "x" * 3000}]),
        "body",
    ),
]


@pytest.mark.parametrize("offload_bytes", [1 << 20, 0], ids=["inline", "worker"])
async def test_each_limit_is_a_400_naming_the_param_and_the_limit_itself_is_routed(
    offload_bytes: int,
) -> None:
    limits = {**LIMITS, "offload_body_bytes": offload_bytes}
    async with backends_running("a") as backends:
        config = gateway_config(backends, strategy={"type": "prefix_affinity"}, limits=limits)
        async with gateway_running(config) as gw:
            for name, path, ok_body, bad_body, param in CASES:
                status, answer = await post(gw.url, path, ok_body)
                assert status == 200, (name, answer)
                status, answer = await post(gw.url, path, bad_body)
                assert status == 400, (name, answer)
                assert answer["error"]["param"] == param, (name, answer)
                assert answer["error"]["type"] == "invalid_request_error", answer
                assert "limits." in answer["error"]["message"], answer
            assert backends[0].stats.requests == len(CASES)


async def test_key_body_bytes_apply_per_key_mode_and_to_invocations() -> None:
    async with backends_running("a") as backends:
        config = gateway_config(backends, limits={"max_key_body_bytes": {"bytes": 100}})
        async with gateway_running(config) as gw:
            body = chat([{"role": "user", "content": "x" * 200}])
            assert (await post(gw.url, CHAT, body))[0] == 200  # text mode: 8 MiB
            bytes_mode = RoutingConfig.model_validate({"key": {"mode": "bytes"}})
            gw.gateway.state.endpoints["main"].variants["v1"].set_routing(bytes_mode)
            status, answer = await post(gw.url, CHAT, body)
            assert (status, answer["error"]["param"]) == (400, "body")
            assert "max_key_body_bytes.bytes" in answer["error"]["message"]
            status, answer = await post(gw.url, "/endpoints/main/invocations", b"y" * 101)
            assert (status, answer["error"]["param"]) == (400, "body")
            status, _ = await post(gw.url, "/endpoints/main/invocations", b"y" * 100)
            assert status == 200


def test_limits_are_validated_naming_the_field() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_json_depth": 1}, "spec.limits.maxJsonDepth"),
        ({"max_messages": 0}, "spec.limits.maxMessages"),
        ({"offload_body_bytes": -1}, "spec.limits.offloadBodyBytes"),
        ({"max_key_body_bytes": {"tokens": 0}}, "spec.limits.maxKeyBodyBytes.tokens"),
        ({"max_key_body_bytes": {"token": 5}}, "spec.limits.maxKeyBodyBytes.token"),
    ]
    for limits, field in cases:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            parse_gateway_config(gateway_doc([], limits=limits))
    defaults = LimitsConfig()
    assert (defaults.max_messages, defaults.max_content_parts) == (20_000, 50_000)
    assert defaults.offload_body_bytes == 64 << 10


# --------------------------------------------------------------------------------------------
# Tokens mode: its own size limit, and long texts tokenized without holding the GIL (same ids)


async def test_tokens_mode_keys_up_to_its_own_body_limit(tmp_path: Path) -> None:
    write_model(tmp_path)
    async with backends_running("a") as backends:
        doc = gateway_doc(backends, limits={"max_key_body_bytes": {"tokens": 30_000}})
        doc["spec"]["tokenizer_path"] = str(tmp_path)
        doc["spec"]["endpoints"][0]["variants"][0]["routing"]["key"] = {"mode": "tokens"}
        async with gateway_running(parse_gateway_config(doc)) as gw:
            status, answer = await post(
                gw.url, CHAT, chat([{"role": "user", "content": "x" * 29_000}])
            )
            assert status == 200, answer
            status, answer = await post(
                gw.url, CHAT, chat([{"role": "user", "content": "x" * 30_000}])
            )
            assert (status, answer["error"]["param"]) == (400, "body")
            assert "max_key_body_bytes.tokens" in answer["error"]["message"]


@pytest.mark.parametrize("filler", [1, 20_000], ids=["short", "gil-free"])
async def test_tokens_mode_names_a_lone_surrogate_in_its_400(tmp_path: Path, filler: int) -> None:
    """JSON's ``\\ud800`` escape parses to a lone surrogate, which ``tokenizers`` cannot take:
    a 400 that says so (it was "request body not understood: TypeError")."""
    write_model(tmp_path)
    text = "x" * filler + "\ud800 tail"
    async with backends_running("a") as backends:
        doc = gateway_doc(backends)
        doc["spec"]["tokenizer_path"] = str(tmp_path)
        doc["spec"]["endpoints"][0]["variants"][0]["routing"]["key"] = {"mode": "tokens"}
        async with gateway_running(parse_gateway_config(doc)) as gw:
            for path, body in (
                (CHAT, chat([{"role": "user", "content": text}])),
                ("/v1/completions", {"model": MODEL, "prompt": text}),
            ):
                status, answer = await post(gw.url, path, json.dumps(body).encode())
                assert status == 400, answer
                message = answer["error"]["message"]
                assert "lone surrogate (U+D800 at character" in message, message
            assert backends[0].stats.requests == 0


def test_long_texts_get_the_same_ids_on_the_gil_free_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = HfChatTokenizer.from_dir(write_model(tmp_path))
    rng = random.Random(3)
    text = "".join(rng.choice(["ab", " cd", "\n", "é", "<s>", "<|im_end|>"]) for _ in range(20_000))
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": text[:999]}]
    long_path = (tok.encode_prompt(text), tok.encode_prompt(text, False), tok.encode_chat(messages))
    monkeypatch.setattr(tokenizer_module, "_GIL_FREE_ENCODE_CHARS", 1 << 30)
    assert long_path == (
        tok.encode_prompt(text),
        tok.encode_prompt(text, False),
        tok.encode_chat(messages),
    )
