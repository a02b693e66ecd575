"""Multi-turn conversations whose turns reach random gateway replicas, against the emulator:
the engines' own prefix-cache counters give the hit rate."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from warmfleet.emulator.fleet import EmulatedFleet

MODEL = "warmfleet-emulated"
_WORDS = (
    "cache block prefix engine token route replica fleet warm cold gateway request answer "
    "session turn model weight shard queue batch decode prefill kernel tensor vector"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@dataclass
class Conversation:
    messages: list[dict[str, str]]

    def next_turn(self, rng: random.Random, answer: str | None) -> list[dict[str, str]]:
        if answer is not None:
            self.messages.append({"role": "assistant", "content": answer})
        self.messages.append({"role": "user", "content": _text(rng, 20)})
        return list(self.messages)


@dataclass
class Outcome:
    ok: int = 0
    failed: int = 0
    by_replica: dict[int, int] = field(default_factory=dict)


def hit_counters(fleet: EmulatedFleet) -> tuple[int, int]:
    """(hit tokens, query tokens) summed over the fleet's live instances."""
    stats = [s for s in fleet.stats() if s is not None]
    return (
        sum(s.prefix_cache_hits_tokens for s in stats),
        sum(s.prefix_cache_queries_tokens for s in stats),
    )


async def chat(session: aiohttp.ClientSession, url: str, messages: Any) -> str | None:
    """One streamed chat; its answer, None if it failed."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True}
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return None
            await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return None
    return "ok " + str(len(messages))


async def conversations(
    session: aiohttp.ClientSession,
    urls: Callable[[], Sequence[str | None]],
    *,
    seed: int,
    count: int = 8,
    turns: int = 4,
    context_words: int = 300,
    settle_s: float = 0.0,
) -> Outcome:
    """``count`` conversations of ``turns`` turns; each round sends every conversation's next
    turn at once, each to a random live replica of ``urls()`` (None: a replica down)."""
    rng = random.Random(seed)
    talks = [
        Conversation([{"role": "system", "content": f"chat {c}: " + _text(rng, context_words)}])
        for c in range(count)
    ]
    answers: list[str | None] = [None] * count
    outcome = Outcome()
    for _turn in range(turns):
        live = [(i, u) for i, u in enumerate(urls()) if u is not None]
        picks = [live[rng.randrange(len(live))] for _ in talks]
        messages = [t.next_turn(rng, a) for t, a in zip(talks, answers, strict=True)]
        results = await asyncio.gather(
            *(chat(session, url, m) for (_, url), m in zip(picks, messages, strict=True))
        )
        for (index, _), answer in zip(picks, results, strict=True):
            outcome.by_replica[index] = outcome.by_replica.get(index, 0) + 1
            if answer is None:
                outcome.failed += 1
            else:
                outcome.ok += 1
        answers = [a or "none" for a in results]
        if settle_s:
            await asyncio.sleep(settle_s)
    return outcome
