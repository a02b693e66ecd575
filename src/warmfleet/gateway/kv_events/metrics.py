"""The KV-event feed's metrics on the gateway's registry (docs/gateway.md, "Engine KV events").

- ``warmfleet_gateway_kv_events_exact{instance_id}``: 1 if the instance's cache view comes from
  its engine's events, 0 if approximate;
- ``warmfleet_gateway_kv_events_gaps_total`` and ``..._replays_total{result}``;
- ``warmfleet_gateway_kv_events_delay_seconds``: how long after its engine stamped a batch
  (``EventBatch.ts``, the engine's wall clock) the gateway received it: what ``claimTtlS``
  must cover;
- the exact index's claims (``routing.claims``): ``warmfleet_gateway_kv_claims_blocks_total``
  (blocks claimed), ``warmfleet_gateway_kv_claims_ended_blocks_total{outcome}`` (confirmed,
  late, lapsed, displaced) and ``warmfleet_gateway_kv_claims_held_blocks{instance_id}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from warmfleet.core.types import InstanceId
from warmfleet.gateway.kv_events.translator import KvEventTranslator
from warmfleet.gateway.metrics import FastHistogram, FastHistogramChild
from warmfleet.routing.claims import Claims

# From a same-host engine's few milliseconds to a loaded relay's seconds (``claimTtlS``: 2 s).
DELAY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
CLAIM_OUTCOMES = ("confirmed", "late", "lapsed", "displaced")


class FeedState(Protocol):
    """What the collector reads of a ``wiring.KvEventFeed``."""

    translator: KvEventTranslator | None
    clock: Callable[[], float]

    @property
    def claims(self) -> Claims | None: ...

    def modes(self) -> dict[InstanceId, str]: ...


def delay_histogram(registry: CollectorRegistry) -> FastHistogramChild:
    return FastHistogram(
        "warmfleet_gateway_kv_events_delay_seconds",
        "Time from an engine's KV event batch (its timestamp, the engine's clock) to its "
        "arrival at the gateway",
        [],
        buckets=DELAY_BUCKETS_S,
        registry=registry,
    ).labels()


class FeedCollector(Collector):
    def __init__(self, feed: FeedState) -> None:
        self._feed = feed

    def collect(self) -> Iterator[Metric]:
        exact = GaugeMetricFamily(
            "warmfleet_gateway_kv_events_exact",
            "1 if the instance's cache view comes from engine KV events, 0 if approximate",
            labels=["instance_id"],
        )
        for iid, mode in sorted(self._feed.modes().items()):
            exact.add_metric([iid], 1.0 if mode == "exact" else 0.0)
        yield exact
        yield from self._translator_counts()
        yield from self._claims()

    def _translator_counts(self) -> Iterator[Metric]:
        stats = self._feed.translator.stats if self._feed.translator is not None else None
        yield _counter(  # counts since the translator began (a reset: a restart)
            "warmfleet_gateway_kv_events_gaps",
            "KV event sequence gaps seen (resyncs needed)",
            {(): stats.gaps if stats is not None else 0},
        )
        yield _counter(
            "warmfleet_gateway_kv_events_replays",
            "Replays asked of the engines after a gap or a late join (asked), and those that "
            "delivered every missed batch (recovered)",
            {
                ("asked",): stats.replays if stats is not None else 0,
                ("recovered",): stats.replays_recovered if stats is not None else 0,
            },
            "result",
        )

    def _claims(self) -> Iterator[Metric]:
        """Counts of the claims of the router in service (a reload starts them again)."""
        claims = self._feed.claims
        yield _counter(
            "warmfleet_gateway_kv_claims_blocks",
            "Blocks routed to an instance that reports KV events, counted as cached there "
            "until its events arrive (claims)",
            {(): claims.counts.claimed if claims is not None else 0},
        )
        yield _counter(
            "warmfleet_gateway_kv_claims_ended_blocks",
            "How block claims ended: confirmed by the engine's BlockStored within claimTtlS, "
            "late (it came after), lapsed (no word), displaced (the bound on claimed blocks)",
            {
                (outcome,): getattr(claims.counts, outcome) if claims is not None else 0
                for outcome in CLAIM_OUTCOMES
            },
            "outcome",
        )
        held = GaugeMetricFamily(
            "warmfleet_gateway_kv_claims_held_blocks",
            "Blocks claimed at the instance and not confirmed or lapsed yet",
            labels=["instance_id"],
        )
        if claims is not None:
            now_s = self._feed.clock()
            for iid in sorted(claims.instances()):
                held.add_metric([iid], float(claims.count(iid, now_s)))
        yield held


def _counter(
    name: str, documentation: str, values: dict[tuple[str, ...], int], *labels: str
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    for label_values, value in values.items():
        family.add_metric(list(label_values), float(value))
    return family
