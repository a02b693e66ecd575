"""The conformance check against a small fake of vLLM's OpenAI server (real vLLM: e2e test)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from e2e_tokenizer_helpers import TEMPLATE, write_model

from support.servers import app_serving
from warmfleet.bench.conformance import predicted_cached, run_conformance
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat

ENGINE_BS = 16


def test_predicted_cached_follows_vllm_rules() -> None:
    assert predicted_cached((1, 2, 3), {1, 2}, 100, 16) == 32
    assert predicted_cached((1, 2, 3), {1, 2, 3}, 48, 16) == 32  # last token recomputed
    assert predicted_cached((1, 2, 3), {2, 3}, 100, 16) == 0  # a chain breaks at the head
    assert predicted_cached((), set(), 0, 16) == 0


def fake_vllm(model_dir: Path) -> web.Application:
    """/v1/models, /metrics, /tokenize and a chat endpoint with a block prefix cache whose
    ``cached_tokens`` follow vLLM's rules (full blocks, last prompt token recomputed)."""
    tok = HfChatTokenizer.from_dir(model_dir)
    keys = key_builder(KeySpec(mode="tokens", block_size=ENGINE_BS), tok)
    cache: set[int] = set()

    async def models(_r: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake", "root": str(model_dir)}]})

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(text=f'vllm:cache_config_info{{block_size="{ENGINE_BS}"}} 1.0\n')

    async def tokenize(r: web.Request) -> web.Response:
        body = await r.json()
        ids = (
            tok.encode_chat(body["messages"])
            if "messages" in body
            else tok.encode_raw(body["prompt"])
        )
        return web.json_response({"tokens": ids, "count": len(ids)})

    async def chat(r: web.Request) -> web.Response:
        body = await r.json()
        key = keys.key(parse_chat(body))
        cached = predicted_cached(key.block_hashes, cache, key.prompt_tokens, ENGINE_BS)
        cache.update(key.block_hashes)
        usage = {
            "prompt_tokens": key.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return web.json_response({"usage": usage})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "engine-model").mkdir()
    app = fake_vllm(write_model(tmp_path / "engine-model"))
    async with app_serving(app, access_log=None) as (url, _):
        yield url


async def test_conformance_agrees(engine: str) -> None:
    report = await run_conformance(engine, turns=3)
    assert report.ok, report.to_json()
    assert report.tokens_match
    assert report.engine_cached_tokens > 0
    assert report.predicted_cached_tokens == report.engine_cached_tokens


async def test_conformance_names_block_size(engine: str) -> None:
    report = await run_conformance(engine, block_size=ENGINE_BS * 2, turns=3)
    assert not report.ok
    assert any(c.startswith("block size") for c in report.causes)


async def test_conformance_names_template(engine: str, tmp_path: Path) -> None:
    gateway_dir = tmp_path / "gateway-model"
    shutil.copytree(tmp_path / "engine-model", gateway_dir)
    config = json.loads((gateway_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE.replace("assistant\n", "assistant: ")
    (gateway_dir / "tokenizer_config.json").write_text(json.dumps(config))
    report = await run_conformance(engine, str(gateway_dir), turns=2)
    assert not report.ok
    assert any(c.startswith("template") for c in report.causes)
