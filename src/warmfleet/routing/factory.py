"""Build a strategy object from its typed configuration (a plain match, no registry)."""

from __future__ import annotations

import random

from pydantic import TypeAdapter, ValidationError

from warmfleet.core.config import format_validation_error
from warmfleet.core.errors import ConfigError
from warmfleet.routing.base import Strategy
from warmfleet.routing.config import (
    STRATEGY_NAMES,
    LeastOutstandingConfig,
    LlmdApproxConfig,
    PowerOfTwoConfig,
    PrefixAffinityConfig,
    PrefixHashConfig,
    RandomConfig,
    RoundRobinConfig,
    SglangCacheAwareConfig,
    StrategyConfig,
)
from warmfleet.routing.strategies.peers import LlmdApproxStrategy, SglangCacheAwareStrategy
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy
from warmfleet.routing.strategies.prefix_hash import PrefixHashStrategy
from warmfleet.routing.strategies.simple import (
    LeastOutstandingStrategy,
    PowerOfTwoStrategy,
    RandomStrategy,
    RoundRobinStrategy,
)


def build_strategy(config: StrategyConfig, rng: random.Random) -> Strategy:
    """A fresh strategy for ``config``; ``rng`` is its only source of randomness."""
    match config:
        case RandomConfig():
            return RandomStrategy(rng)
        case RoundRobinConfig():
            return RoundRobinStrategy()
        case LeastOutstandingConfig():
            return LeastOutstandingStrategy(rng)
        case PowerOfTwoConfig():
            return PowerOfTwoStrategy(rng)
        case PrefixHashConfig():
            return PrefixHashStrategy(config)
        case PrefixAffinityConfig():
            return PrefixAffinityStrategy(config)
        case SglangCacheAwareConfig():
            return SglangCacheAwareStrategy(config)
        case LlmdApproxConfig():
            return LlmdApproxStrategy(config, rng)
    raise ConfigError(f"strategy.type: unknown strategy {config!r}")


def strategy_config(name: str, **overrides: object) -> StrategyConfig:
    """The configuration of strategy ``name`` with its defaults, plus ``overrides``."""
    if name not in STRATEGY_NAMES:
        raise ConfigError(
            f"strategy.type: unknown strategy {name!r}; known: {', '.join(STRATEGY_NAMES)}"
        )
    adapter: TypeAdapter[StrategyConfig] = TypeAdapter(StrategyConfig)
    try:
        return adapter.validate_python({"type": name, **overrides})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "strategy", StrategyConfig)) from err
