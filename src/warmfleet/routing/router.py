"""The routing facade used by the live gateway (and, for choose/on_routed, by the simulator)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey
from warmfleet.routing.base import (
    KvEventSink,
    LearnsFromRouting,
    Strategy,
    engine_stats_interval_of,
    kv_event_sink_of,
)
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.factory import build_strategy
from warmfleet.routing.key_modes import KeyBuilder, key_builder
from warmfleet.routing.keys import Tokenizer
from warmfleet.routing.request import KeyRequest


class Router:
    """One variant's router: key building (``config.key``: the key builder of its mode) plus one
    strategy.

    The caller parses a request once (``routing.parse``), and ``key`` builds its key: it raises
    ``core.errors.BadRequestError`` (never another exception) on what only its mode reads (the
    ``tokens`` mode's rendering options, a chat its template cannot render). The caller tracks
    load and passes it in ``FleetSnapshot``; it calls ``on_routed`` once it commits to a
    decision, before its next ``choose`` (the gateway: before it may wait for an upstream
    connection, so a concurrent request's decision sees this one), and ``on_instances_changed``
    when the healthy set changes.
    """

    def __init__(
        self, config: RoutingConfig, rng: random.Random, tokenizer: Tokenizer | None = None
    ) -> None:
        self.config = config
        self.strategy: Strategy = build_strategy(config.strategy, rng)
        self.keys: KeyBuilder = key_builder(
            config.key,
            tokenizer,
            prefix_length=config.prefix_length,
            hash_blocks=self.strategy.reads_block_hashes,
        )

    def key(self, request: KeyRequest) -> RoutingKey:
        """The routing key of a parsed request."""
        return self.keys.key(request)

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
        return kv_event_sink_of(self.strategy)

    @property
    def engine_stats_interval_s(self) -> float | None:
        """How often the strategy wants the engines' queues and KV usage read from their
        metrics (``routing.base.engine_stats_interval_of``; None: never)."""
        return engine_stats_interval_of(self.strategy)
