"""Hooking engine KV events and a local tokenizer into the gateway through its router factory.

``KvEventFeed.router_factory(tokenizer)`` is a ``gateway.state.RouterFactory``: every router it
builds is a routing-core ``Router`` (with the tokenizer, for the ``tokens`` key mode) wrapped in
``ExactModeRouter``, which binds, when it is built, the router's exact index to the chains the
feed's events translate into (the seed of the feed's model and the router's block size). The
router the gateway puts in service (the one told its instances: ``on_instances_changed``, before
its first ``choose``; throwaway routers built to validate a config never are) becomes the feed's
target, once: the feed's translator then feeds its exact index. A router swapped in by a reload
inherits the translator's view (same seed and block size), so a reload does not drop to
approximate mode; a replaced router that an in-flight request still holds keeps its own index.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from warmfleet.api.kv_events import EventBatch
from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey
from warmfleet.gateway.kv_events.metrics import CLAIM_OUTCOMES, FeedCollector, delay_histogram
from warmfleet.gateway.kv_events.translator import ExactIndex, KvEventTranslator
from warmfleet.gateway.kv_events.view import ReplayRequest
from warmfleet.gateway.metrics import FastHistogramChild
from warmfleet.routing.claims import Claims
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.exact_index import ExactPrefixIndex
from warmfleet.routing.keys import Tokenizer
from warmfleet.routing.request import KeyRequest
from warmfleet.routing.router import Router


class ExactModeRouter:
    """A ``Router`` whose exact index is fed by a ``KvEventFeed`` (a gateway ``RouterLike``).

    Built bound: ``chain_seed`` (where the feed's translated chains start: its model, no
    adapter, no tenant) and ``block_size`` are fixed here, and the exact index (if the strategy
    has one) matches only keys chained from that seed."""

    def __init__(self, router: Router, feed: KvEventFeed) -> None:
        self.router = router
        self._feed = feed
        sink = router.kv_event_sink
        self.exact_index: ExactIndex | None = sink if isinstance(sink, ExactIndex) else None
        self.chain_seed = router.keys.seed(feed.model, None, None)
        self.block_size = router.keys.block_size
        if self.exact_index is not None:
            self.exact_index.chain_seed = self.chain_seed

    def key(self, request: KeyRequest) -> RoutingKey:
        return self.router.key(request)

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        return self.router.choose(key, fleet)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.router.on_routed(key, decision)
        exact = self.exact_index
        # New blocks are due (a silent engine will be suspected) only for keys the exact view
        # can name: a tenant's prompt may be cached already under the engine's shared hashes.
        if (
            exact is not None
            and exact.comparable(key.chain_seed)
            and decision.predicted_cached_blocks < len(key.block_hashes)
        ):
            self._feed.expect_events(decision.instance_id)

    def adopt(self, previous: object) -> None:
        self.router.adopt(previous.router if isinstance(previous, ExactModeRouter) else previous)

    @property
    def engine_stats_interval_s(self) -> float | None:
        return self.router.engine_stats_interval_s

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self._feed.activate(self)  # in service (a no-op once it is the feed's target)
        self.router.on_instances_changed(instance_ids)
        self._feed.retain(instance_ids)


class KvEventFeed:
    """One gateway's KV-event state: the translator and the router it feeds.

    ``model`` is the served model name clients send (it seeds the router's hash chains).
    Implements the subscriber's consumer interface (``apply``, ``check_silence``).
    """

    def __init__(
        self,
        model: str,
        *,
        resync_batches: int = 3,
        silence_timeout_s: float = 10.0,
        replay: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.replay = replay
        self.resync_batches = resync_batches
        self.silence_timeout_s = silence_timeout_s
        self.clock = clock
        self.translator: KvEventTranslator | None = None
        self._active: ExactModeRouter | None = None
        # the routed instances (shown even if silent); None until ``retain`` is first called
        self._instances: tuple[InstanceId, ...] | None = None
        self._delay: FastHistogramChild | None = None  # set by ``register_metrics``
        self.recent_delays_s: deque[float] = deque(maxlen=4096)  # the last ones, for reports

    def router_factory(
        self, tokenizer: Tokenizer | None
    ) -> Callable[[RoutingConfig, random.Random], ExactModeRouter]:
        def factory(config: RoutingConfig, rng: random.Random) -> ExactModeRouter:
            return ExactModeRouter(Router(config, rng, tokenizer), self)

        return factory

    def activate(self, router: ExactModeRouter) -> None:
        """``router`` is the one in service: the events feed its exact index from now on."""
        if router is self._active:
            return
        self._active = router
        index = router.exact_index
        if index is None:  # the strategy has no exact index: events are not needed
            self.translator = None
            return
        seed, block_size = router.chain_seed, router.block_size
        old = self.translator
        if old is not None and old.seed == seed and old.block_size == block_size:
            old.rebind(index)
            return
        self.translator = KvEventTranslator(
            index,
            seed,
            block_size,
            resync_batches=self.resync_batches,
            silence_timeout_s=self.silence_timeout_s,
            replay=self.replay,
        )
        if self._instances is not None:
            self.translator.retain(self._instances)

    def apply(self, instance_id: InstanceId, seq: int, batch: EventBatch, now_s: float) -> None:
        if self.translator is not None:
            self.translator.apply(instance_id, seq, batch, now_s)

    def check_silence(self, now_s: float) -> list[InstanceId]:
        return self.translator.check_silence(now_s) if self.translator is not None else []

    def take_replay_requests(self) -> list[ReplayRequest]:
        return self.translator.take_replay_requests() if self.translator is not None else []

    def replay_steps(
        self,
        request: ReplayRequest,
        batches: Sequence[tuple[int, EventBatch]] | None,
        now_s: float,
    ) -> Iterator[None]:
        if self.translator is not None:
            yield from self.translator.replay_steps(request, batches, now_s)

    def expect_events(self, instance_id: InstanceId) -> None:
        if self.translator is not None:
            self.translator.expect_events(instance_id, self.clock())

    def retain(self, instance_ids: Sequence[InstanceId]) -> None:
        self._instances = tuple(instance_ids)
        if self.translator is not None:
            self.translator.retain(instance_ids)

    def modes(self) -> dict[InstanceId, str]:
        """Every routed instance (``approximate`` until its events are in sync) and every
        instance the events named."""
        out: dict[InstanceId, str] = dict.fromkeys(self._instances or (), "approximate")
        if self.translator is not None:
            out.update(self.translator.modes())
        return out

    def describe(self) -> dict[str, Any]:
        """The translator's view and, with an exact index in service, its claims: blocks held
        per instance (``claimed_blocks``) and the counts of ``kv_events.metrics``."""
        out = self.translator.describe() if self.translator is not None else {"instances": {}}
        claims = self.claims
        if claims is not None:
            now_s = self.clock()
            for iid, view in out["instances"].items():
                view["claimed_blocks"] = claims.count(iid, now_s)
            counts = {name: getattr(claims.counts, name) for name in ("claimed", *CLAIM_OUTCOMES)}
            out["claims"] = {"ttl_s": claims.ttl_s, "blocks": counts}
        return out

    @property
    def claims(self) -> Claims | None:
        """The claims of the exact index the events feed (None: no router in service has one)."""
        index = self._active.exact_index if self._active is not None else None
        return index.claims if isinstance(index, ExactPrefixIndex) else None

    def observe_delay(self, delay_s: float) -> None:
        """A batch arrived ``delay_s`` after its engine stamped it (the histogram of
        ``register_metrics``, and ``recent_delays_s``)."""
        self.recent_delays_s.append(delay_s)
        if self._delay is not None:
            self._delay.observe(delay_s)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """The feed's metrics on the gateway's registry (``kv_events.metrics``)."""
        registry.register(FeedCollector(self))
        self._delay = delay_histogram(registry)
