"""The small simulated engine of the unit tests: one literal, each test names what it changes."""

from __future__ import annotations

from typing import Any

from warmfleet.engine.spec import EngineSpec

BLOCK_TOKENS = 16

_SMALL_ENGINE: dict[str, Any] = {
    "name": "test",
    "block_tokens": BLOCK_TOKENS,
    "kv_capacity_tokens": 64 * BLOCK_TOKENS,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 256,
    "max_model_len": 4096,
    "step_overhead_s": 0.01,
    "prefill_s_per_token": 0.001,
    "prefill_attn_s_per_token_pair": 1e-7,
    "decode_s_per_seq": 0.002,
    "kv_read_s_per_token": 1e-6,
}


def engine_spec(**overrides: Any) -> EngineSpec:
    """A 64-block engine with 16-token blocks and millisecond steps, with ``overrides``
    (validated: a misspelt field fails, like in a YAML file)."""
    return EngineSpec.model_validate({**_SMALL_ENGINE, **overrides})
