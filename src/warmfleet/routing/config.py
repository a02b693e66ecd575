"""Typed routing configuration: one model per strategy (discriminated on ``type``) + key spec."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from warmfleet.core.config import StrictModel
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH, KeySpec


class RandomConfig(StrictModel):
    type: Literal["random"] = "random"


class RoundRobinConfig(StrictModel):
    type: Literal["round_robin"] = "round_robin"


class LeastOutstandingConfig(StrictModel):
    type: Literal["least_outstanding_requests"] = "least_outstanding_requests"


class PowerOfTwoConfig(StrictModel):
    type: Literal["power_of_two"] = "power_of_two"


class PrefixHashConfig(StrictModel):
    """AWS ``PREFIX_AWARE`` parity (same validation ranges as ``PrefixAwareRoutingConfig``)."""

    type: Literal["prefix_hash"] = "prefix_hash"
    prefix_length: int = Field(default=4096, ge=1024, le=65536)
    concurrency_threshold: int = Field(default=10, ge=1, le=1024)


class PrefixAffinityConfig(StrictModel):
    """warmfleet's flagship strategy; every knob is documented in docs/routing.md.

    Defaults were chosen with the simulator (aws-long-context, mooncake, gsp, multi-round-qa).
    """

    type: Literal["prefix_affinity"] = "prefix_affinity"
    epsilon: float = Field(default=1.0, gt=0.0, le=10.0)
    load_floor_requests: float = Field(default=2.0, ge=0.0)
    min_match_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    shared_prefix_fanout: int = Field(default=2, ge=0)
    placement_choices: int = Field(default=8, ge=1, le=64)
    placement_by: Literal["recency", "load", "cost", "occupancy"] = "recency"
    session_placement: Literal["groups", "hash"] = "groups"
    default_capacity_blocks: int = Field(default=65536, gt=0)
    load_weight: float = Field(default=0.02, ge=0.0)
    prefill_linear_coeff: float = Field(default=1.0, gt=0.0)
    prefill_attention_coeff: float = Field(default=2e-5, ge=0.0)
    use_exact_index: bool = True
    claim_ttl_s: float = Field(default=2.0, ge=0.0, le=60.0)


class SglangCacheAwareConfig(StrictModel):
    """Reproduction of SGLang's ``cache_aware`` policy with its current defaults."""

    type: Literal["sglang_cache_aware"] = "sglang_cache_aware"
    cache_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1.0)
    max_tree_blocks: int = Field(default=(1 << 26) // 128, gt=0)


class LlmdApproxConfig(StrictModel):
    """Reproduction of the llm-d approximate scorer mix (prefix 3, queue 2, KV utilisation 2)."""

    type: Literal["llmd_approx"] = "llmd_approx"
    prefix_weight: float = Field(default=3.0, ge=0.0)
    queue_weight: float = Field(default=2.0, ge=0.0)
    kv_utilization_weight: float = Field(default=2.0, ge=0.0)
    lru_capacity_per_server: int = Field(default=31250, gt=0)
    max_prefix_blocks_to_match: int = Field(default=256, gt=0)
    # How often the engines' queue and KV usage are read from their ``/metrics`` (llm-d's
    # ``--refresh-metrics-interval``, 50 ms): the gateway polls at this interval, and the
    # simulator shows the strategy the engines' state as of the latest poll.
    refresh_metrics_interval_ms: float = Field(default=50.0, ge=10.0, le=60_000.0)


StrategyConfig = Annotated[
    RandomConfig
    | RoundRobinConfig
    | LeastOutstandingConfig
    | PowerOfTwoConfig
    | PrefixHashConfig
    | PrefixAffinityConfig
    | SglangCacheAwareConfig
    | LlmdApproxConfig,
    Field(discriminator="type"),
]

STRATEGY_NAMES: tuple[str, ...] = (
    "random",
    "round_robin",
    "least_outstanding_requests",
    "power_of_two",
    "prefix_hash",
    "prefix_affinity",
    "sglang_cache_aware",
    "llmd_approx",
)


class RoutingConfig(StrictModel):
    strategy: StrategyConfig = Field(default_factory=RandomConfig)
    key: KeySpec = Field(default_factory=KeySpec)
    flow: FlowControlConfig | None = None  # flow control (docs/flow-control.md); None = off

    @model_validator(mode="after")
    def _prefix_lengths_agree(self) -> RoutingConfig:
        strategy = self.strategy
        if (
            isinstance(strategy, PrefixHashConfig)
            and self.key.prefix_length is not None
            and self.key.prefix_length != strategy.prefix_length
        ):
            raise ValueError(
                "key.prefixLength must be unset or equal strategy.prefixLength for prefix_hash"
            )
        return self

    @property
    def prefix_length(self) -> int:
        """Units hashed into ``RoutingKey.prefix_hash``."""
        if isinstance(self.strategy, PrefixHashConfig):
            return self.strategy.prefix_length
        return self.key.prefix_length or DEFAULT_PREFIX_LENGTH
