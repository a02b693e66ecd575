"""Engine specification: the parameters of one simulated vLLM-like instance.

All costs are in seconds. A step's duration is

    step_overhead_s
    + decode_s_per_seq * decoding sequences
    + kv_read_s_per_token * context tokens of the decoding sequences (KV read)
    + sum over prefill chunks of
        chunk_tokens * prefill_s_per_token
        + chunk_tokens * (context before the chunk + chunk_tokens / 2)
          * prefill_attn_s_per_token_pair

so prefill cost per token grows with context (attention), and decode step time grows with the
batch size and the KV cache it reads. ``step_overhead_s`` is the part every step pays (reading the
weights once, kernel launches, scheduler).

Sleep mode (vLLM's ``/sleep`` and ``/wake_up``): ``wake_from_host_s`` is a level-1 wake (the
weights copied back from host memory, where level 1 offloaded them) and ``wake_from_disk_s`` a
level-2 wake (level 2 discarded them: read again from the node's disk). Both are engine seconds.
"""

from __future__ import annotations

from pydantic import Field

from warmfleet.core.config import StrictModel


class EngineSpec(StrictModel):
    """One engine instance's capacities and cost coefficients (YAML-overridable)."""

    name: str = "custom"
    block_tokens: int = Field(16, ge=1, le=65_536)
    kv_capacity_tokens: int = Field(ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_model_len: int = Field(131_072, ge=1)
    step_overhead_s: float = Field(ge=0.0)
    prefill_s_per_token: float = Field(ge=0.0)
    prefill_attn_s_per_token_pair: float = Field(0.0, ge=0.0)
    decode_s_per_seq: float = Field(0.0, ge=0.0)
    kv_read_s_per_token: float = Field(0.0, ge=0.0)
    wake_from_host_s: float = Field(0.0, ge=0.0)
    wake_from_disk_s: float = Field(0.0, ge=0.0)

    def wake_s(self, level: int) -> float:
        """Engine seconds a ``/wake_up`` of the weights costs after ``/sleep?level=level``."""
        return self.wake_from_host_s if level == 1 else self.wake_from_disk_s

    @property
    def capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_tokens

    def with_block_tokens(self, block_tokens: int) -> EngineSpec:
        """The same engine with another cache block size (same capacity in tokens)."""
        return self.model_copy(update={"block_tokens": block_tokens})

    def prefill_s(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """Time of one request's prefill alone on an idle engine (for docs and sanity checks)."""
        spent = 0.0
        done = cached_tokens
        while done < prompt_tokens:
            chunk = min(self.max_num_batched_tokens, prompt_tokens - done)
            spent += self.step_overhead_s + chunk * self.prefill_s_per_token
            spent += chunk * (done + chunk / 2) * self.prefill_attn_s_per_token_pair
            done += chunk
        return spent
