"""The e2e's two workloads (deterministic) and their ideal reuse under the engine's rules."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from warmfleet.bench.conformance import filler_text, predicted_cached
from warmfleet.routing.key_modes import KeyBuilder
from warmfleet.routing.parse import parse_chat

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[Messages, ...]
    sessions: tuple[str | None, ...] = ()  # each request's session id (multi-turn chats)

    def session_of(self, index: int) -> str | None:
        return self.sessions[index] if index < len(self.sessions) else None


def multi_turn(
    seed: int, conversations: int = 10, turns: int = 4, context_words: int = 450
) -> Workload:
    """Chats with a long per-conversation context; each turn resends the whole history plus a
    short question (scripted assistant answers). Turns of different chats interleave."""
    rng = random.Random(f"multi_turn/{seed}")
    histories: list[Messages] = [
        [{"role": "system", "content": f"chat {c}: " + filler_text(rng, context_words)}]
        for c in range(conversations)
    ]
    requests: list[Messages] = []
    sessions: list[str | None] = []
    for turn in range(turns):
        for c, history in enumerate(histories):
            if turn:
                history.append({"role": "assistant", "content": filler_text(rng, 25)})
            history.append({"role": "user", "content": filler_text(rng, 30)})
            requests.append(list(history))
            sessions.append(f"chat-{seed}-{c}")
    return Workload("multi_turn", tuple(requests), tuple(sessions))


def shared_document(
    seed: int, documents: int = 10, questions: int = 4, document_words: int = 500
) -> Workload:
    """Several questions about each of several long documents, in a shuffled order."""
    rng = random.Random(f"shared_document/{seed}")
    docs = [f"document {d}: " + filler_text(rng, document_words) for d in range(documents)]
    requests: list[Messages] = [
        [
            {"role": "system", "content": docs[d]},
            {"role": "user", "content": f"question {q}: " + filler_text(rng, 20)},
        ]
        for d in range(documents)
        for q in range(questions)
    ]
    rng.shuffle(requests)
    return Workload("shared_document", tuple(requests))


def ideal_reuse(workload: Workload, keys: KeyBuilder, model: str) -> tuple[int, int]:
    """(cached tokens, prompt tokens) if every request met one infinite cache holding every
    earlier prompt: the most any router can get from the engines."""
    seen: set[int] = set()
    cached = prompt = 0
    for messages in workload.requests:
        key = keys.key(parse_chat({"model": model, "messages": messages}))
        cached += predicted_cached(key.block_hashes, seen, key.prompt_tokens, keys.block_size)
        prompt += key.prompt_tokens
        seen.update(key.block_hashes)
    return cached, prompt
