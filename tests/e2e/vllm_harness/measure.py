"""One workload sent through the gateways and measured: streamed chats (the time to the first
event), the engines' own prefix-cache counters before and after (the hit rate), and a case's
summary, overall and per workload (hit rate beside the ideal reuse, TTFT percentiles)."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from vllm_harness.engines import MODEL_NAME, EngineSpec, prefix_counters
from vllm_harness.workloads import Workload


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]


async def send_chat(
    session: aiohttp.ClientSession, base_url: str, messages: Any, chat_session: str | None = None
) -> float:
    """Stream one chat request (``chat_session``: its ``x-warmfleet-session``); returns the time
    to the first streamed event (TTFT) in ms."""
    body = {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": 2,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }
    start = time.perf_counter()
    ttft_ms: float | None = None
    headers = {"x-warmfleet-session": chat_session} if chat_session else {}
    url = f"{base_url}/v1/chat/completions"
    async with session.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for chunk in resp.content.iter_any():
            if ttft_ms is None and chunk.strip():
                ttft_ms = (time.perf_counter() - start) * 1000.0
    return ttft_ms if ttft_ms is not None else (time.perf_counter() - start) * 1000.0


async def run_workload(
    session: aiohttp.ClientSession,
    gateways: Sequence[str],
    engines: Sequence[EngineSpec],
    workload: Workload,
    rng: random.Random | None = None,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Send the workload one request at a time (round-robin over ``gateways``; with ``rng``,
    each to a random one, so a session's turns reach random replicas, and each multi-turn
    request names its chat in ``x-warmfleet-session``), awaiting ``settle`` after each; hit
    rate from the engines' own prefix-cache counters."""
    before = [await prefix_counters(session, e.url) for e in engines]
    targets = itertools.cycle(gateways)
    ttfts = []
    for i, m in enumerate(workload.requests):
        target = rng.choice(gateways) if rng else next(targets)
        ttfts.append(await send_chat(session, target, m, workload.session_of(i) if rng else None))
        if settle is not None:
            await settle()
    after = [await prefix_counters(session, e.url) for e in engines]
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return {"hits": hits, "queries": queries, "ttfts_ms": ttfts}


def summarize(
    parts: dict[str, dict[str, Any]], ideal: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    hits = sum(p["hits"] for p in parts.values())
    queries = sum(p["queries"] for p in parts.values())
    ttfts = [t for p in parts.values() for t in p["ttfts_ms"]]
    cached = sum(ideal[name][0] for name in parts)
    prompt = sum(ideal[name][1] for name in parts)
    return {
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "ideal_reuse": round(cached / prompt, 4) if prompt else 0.0,
        "ttft_ms": {
            "p50": round(percentile(ttfts, 0.5), 1),
            "p90": round(percentile(ttfts, 0.9), 1),
        },
        "engine_hit_tokens": hits,
        "engine_query_tokens": queries,
        "workloads": {
            name: {
                "hit_rate": round(p["hits"] / p["queries"], 4) if p["queries"] else 0.0,
                "ideal_reuse": round(ideal[name][0] / ideal[name][1], 4),
                "ttft_ms": {
                    "p50": round(percentile(p["ttfts_ms"], 0.5), 1),
                    "p90": round(percentile(p["ttfts_ms"], 0.9), 1),
                },
                "requests": len(p["ttfts_ms"]),
            }
            for name, p in parts.items()
        },
    }


def progress(label: str, result: dict[str, Any], timings_s: dict[str, float]) -> None:
    events = result.get("kv_event_delay_ms") or {}
    late = f", KV events p50 {events['p50']} p99 {events['p99']} ms late" if events else ""
    waits = result.get("replica_sync", {}).get("delivery_wait_ms") or {}
    waited = f", notes delivered in p50 {waits['p50']} max {waits['max']} ms" if waits else ""
    print(
        f"e2e-vllm: {label}: hit {result['hit_rate']:.3f} (ideal {result['ideal_reuse']:.3f}), "
        f"TTFT p50 {result['ttft_ms']['p50']:.0f} ms, {timings_s[label]} s, "
        f"reasons {result['reasons']}{late}{waited}",
        flush=True,
    )
