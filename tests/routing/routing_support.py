"""Helpers for the prefix_affinity tests: instance ids and an idle fleet, random block chains
and the routing keys over them, a caller-side in-flight tracker (as the gateway and the
simulator keep it), and the strategy built with overrides."""

from __future__ import annotations

import random

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, RoutingKey
from warmfleet.routing.base import Strategy
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy

BLOCK = 16


def ids(n: int) -> list[str]:
    return [f"pod-{i}" for i in range(n)]


def idle(n: int) -> FleetSnapshot:
    return FleetSnapshot(tuple(InstanceState(i) for i in ids(n)))


def chain(rng: random.Random, n: int, prefix: tuple[int, ...] = ()) -> tuple[int, ...]:
    return prefix + tuple(rng.getrandbits(64) for _ in range(n))


def key(blocks: tuple[int, ...], tail_units: int = 5, output: int = 0) -> RoutingKey:
    units = len(blocks) * BLOCK + tail_units
    prefix = blocks[0] if blocks else units
    return RoutingKey(blocks, BLOCK, units, units, prefix, output)


class LoadTracker:
    """Caller-side in-flight accounting, as the gateway and the simulator keep it."""

    def __init__(self, n: int) -> None:
        self.ids = ids(n)
        self.tokens = dict.fromkeys(self.ids, 0)
        self.requests = dict.fromkeys(self.ids, 0)
        self.sent: dict[str, list[int]] = {i: [] for i in self.ids}

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(
            tuple(InstanceState(i, self.requests[i], self.tokens[i]) for i in self.ids)
        )

    def add(self, pod: str, tokens: int, requests: int = 1) -> None:
        """In-flight work starts (positive) or ends (negative) on ``pod``."""
        self.tokens[pod] += tokens
        self.requests[pod] += requests

    def route(self, strategy: Strategy, k: RoutingKey) -> Decision:
        d = strategy.choose(k, self.snapshot())
        strategy.on_routed(k, d)
        self.add(d.instance_id, k.prompt_tokens + k.output_tokens_hint)
        return d


def affinity(**overrides: object) -> PrefixAffinityStrategy:
    s = build_strategy(strategy_config("prefix_affinity", **overrides), random.Random(0))
    assert isinstance(s, PrefixAffinityStrategy)
    return s
