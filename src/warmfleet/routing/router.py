"""The routing facade used by the live gateway (and, for choose/on_routed, by the simulator)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey
from warmfleet.routing.base import KvEventSink, LearnsFromRouting, Strategy
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.factory import build_strategy
from warmfleet.routing.keys import KeyBuilder, Tokenizer


class Router:
    """One variant's router: key building (``config.key``) plus one strategy.

    The caller tracks load and passes it in ``FleetSnapshot``; it calls ``on_routed`` once it
    commits to a decision, before its next ``choose`` (the gateway: before it may wait for an
    upstream connection, so a concurrent request's decision sees this one), and
    ``on_instances_changed`` when the healthy set changes.
    Every ``key_for_*`` raises ``core.errors.BadRequestError`` (never another exception) on a
    malformed body.
    """

    def __init__(
        self, config: RoutingConfig, rng: random.Random, tokenizer: Tokenizer | None = None
    ) -> None:
        self.config = config
        self.strategy: Strategy = build_strategy(config.strategy, rng)
        self.keys = KeyBuilder(
            config.key,
            tokenizer,
            prefix_length=config.prefix_length,
            hash_blocks=self.strategy.reads_block_hashes,
        )

    def key_for_chat(self, body: Mapping[str, Any], tenant: str | None) -> RoutingKey:
        """Key of an OpenAI chat-completions body; ``tenant`` is the tenant header (if any),
        overridden by the body's ``prompt_cache_key``."""
        return self.keys.for_chat(body, tenant)

    def key_for_completions(self, body: Mapping[str, Any], tenant: str | None) -> RoutingKey:
        return self.keys.for_completions(body, tenant)

    def key_for_bytes(self, raw: bytes, tenant: str | None, model: str) -> RoutingKey:
        """Key of a native invocations body (raw bytes)."""
        return self.keys.for_bytes(raw, tenant, model)

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        return self.strategy.choose(key, fleet)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.strategy.on_routed(key, decision)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.strategy.on_instances_changed(instance_ids)

    def adopt(self, previous: object) -> None:
        """This router replaces ``previous``: keep what it learnt of the engines' caches when
        both build keys the same way (same key settings and tokenizer, so a block hash names
        the same tokens) and the strategy can use it (``LearnsFromRouting``)."""
        if (
            isinstance(previous, Router)
            and previous.config.key == self.config.key
            and previous.keys.tokenizer is self.keys.tokenizer
            and isinstance(self.strategy, LearnsFromRouting)
        ):
            self.strategy.adopt(previous.strategy)

    @property
    def kv_event_sink(self) -> KvEventSink | None:
        """Where engine KV events go, if the strategy can use exact cache knowledge."""
        sink = getattr(self.strategy, "exact_index", None)
        return sink if isinstance(sink, KvEventSink) else None
