"""What goes into and comes out of an ``EngineModel`` (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: int
    block_hashes: tuple[int, ...]  # chained hashes of the prompt's full blocks
    prompt_tokens: int
    output_tokens: int
    # chained hashes of the full blocks the generated tokens complete (continuing
    # ``block_hashes``), when the caller knows them (the next turn of a conversation
    # re-sends the answer); registered in the prefix cache when the request finishes
    output_block_hashes: tuple[int, ...] = ()
    # with ``emit_token_events``: False skips this request's TOKEN events (a caller that only
    # needs its first token and its end saves one event per output token)
    token_events: bool = True


class EngineEventKind(StrEnum):
    FIRST_TOKEN = "first_token"
    TOKEN = "token"  # every output token after the first (only with emit_token_events)
    FINISHED = "finished"
    REJECTED = "rejected"  # can never fit: longer than max_model_len or the whole KV cache


@dataclass(frozen=True, slots=True)
class EngineEvent:
    kind: EngineEventKind
    request_id: int
    time_s: float
    cached_tokens: int = 0  # FIRST_TOKEN: prompt tokens served from the prefix cache
    output_tokens: int = 0  # FIRST_TOKEN/TOKEN/FINISHED: output tokens produced so far


@dataclass(frozen=True, slots=True)
class EngineStats:
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    running: int
    waiting: int
    kv_usage_frac: float
    cached_blocks: int
    capacity_blocks: int
