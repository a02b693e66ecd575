"""Helpers for the emulator tests: fast fleets, scraping, prompts."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from support.engines import engine_spec
from warmfleet.emulator.config import EmulatorSpec, build_spec
from warmfleet.emulator.tokenizer import EmulatorTokenizer

MODEL = "warmfleet-emulated"
BLOCK = 16
# A small engine for driver-level tests: 4-token blocks, 10 ms steps.
DRIVER_SPEC = engine_spec(
    block_tokens=4,
    kv_capacity_tokens=4096,
    max_num_batched_tokens=64,
    max_model_len=131_072,
    prefill_s_per_token=1e-4,
    prefill_attn_s_per_token_pair=0.0,
    decode_s_per_seq=1e-3,
)


def fast_spec(**fields: Any) -> EmulatorSpec:
    """tiny-cpu timings 20x faster than real time, 16-token blocks, a small KV cache."""
    base: dict[str, Any] = {
        "instances": 1,
        "preset": "tiny-cpu",
        "block_size": BLOCK,
        "kv_capacity_tokens": 4096,
        "speedup": 20.0,
    }
    base.update(fields)
    return build_spec(**base)


def words(seed: int, count: int) -> str:
    """``count`` distinct-ish short words (each one emulator token)."""
    return " ".join(f"w{(seed * 7919 + i * 104729) % 9973:x}"[:4] for i in range(count))


def chat_body(system: str, user: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def expected_cached_tokens(earlier: list[int], later: list[int], block: int = BLOCK) -> int:
    """What a prefix cache holding ``earlier``'s full blocks serves of ``later``."""
    common = 0
    for a, b in zip(earlier, later, strict=False):
        if a != b:
            break
        common += 1
    full_earlier = len(earlier) // block
    blocks = min(common // block, full_earlier, (len(later) - 1) // block)
    return blocks * block


def chat_ids(body: dict[str, Any]) -> list[int]:
    return EmulatorTokenizer().encode_chat(body["messages"])


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Samples summed over label sets, by sample name (``..._total``, ``..._count``)."""
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def metric_labels(session: aiohttp.ClientSession, url: str, name: str) -> dict[str, str]:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return dict(sample.labels)
    raise AssertionError(f"{name} not exposed")


async def post_json(
    session: aiohttp.ClientSession, url: str, body: Any, path: str = "/v1/chat/completions"
) -> tuple[int, Any]:
    async with session.post(url + path, json=body) as resp:
        return resp.status, await resp.json()


async def sse_events(session: aiohttp.ClientSession, url: str, path: str, body: Any) -> list[Any]:
    """POST ``body`` streamed; the parsed ``data:`` events before ``[DONE]`` (asserted last)."""
    async with session.post(url + path, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        raw = (await resp.read()).decode()
    events = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]
