"""Prometheus metrics of one gateway app, in a per-app ``CollectorRegistry`` (no global state).

Names (all prefixed ``warmfleet_gateway_``; the engine instance is ``instance_id``: a scraped
``instance`` label would collide with the one Prometheus gives every target):

- ``requests_total{endpoint,variant,instance_id,reason,status}``: finished proxied requests;
  ``status`` is the HTTP status sent, or ``stream_error`` when a stream ended with an error event,
  or ``client_disconnect``.
- ``rejected_requests_total{status}``: requests answered with an error before routing.
- ``in_flight_requests{endpoint,variant,instance_id}``,
  ``instance_healthy{endpoint,variant,instance_id}``,
  ``instance_kv_capacity_blocks{endpoint,variant,instance_id}`` (the engine's KV capacity read
  from its metrics, in routing-key blocks; 0: unknown, ``defaultCapacityBlocks`` used)
- ``decision_seconds{endpoint,variant}``: time inside ``Router.choose``.
- ``overhead_seconds{endpoint,variant}``: request handler entered -> upstream request issued
  (body read, JSON parse, key, decision, bookkeeping; on a pooled connection the router learns
  the decision after the write).
- ``ttft_seconds{endpoint,variant,stream}``: request handler entered -> first upstream body byte.
- ``spills_total{endpoint,variant,instance_id}``, ``predicted_prefix_hits_total{endpoint,variant}``,
  ``predicted_cached_blocks_total{endpoint,variant}``
- ``retries_total{endpoint,variant}``, ``ejections_total{endpoint,variant,instance_id,cause}``,
  ``readmissions_total{endpoint,variant,instance_id}``, ``config_reloads_total{source,result}``.
- Flow control (``gateway.flow``): ``flow_wait_seconds{endpoint,variant,band,tenant,outcome}``
  (arrival to dispatch or shed; ``outcome`` dispatched|shed), ``flow_ttft_seconds{endpoint,
  variant,kind}`` (``kind`` predicted|observed, both for each streamed request flow control
  dispatched: the predictor's error); the queue depth, shed, served-token, cancellation and
  calibration series come from ``gateway.flow``'s collector.
- Passive outlier detection: ``attempt_failures_total{endpoint,variant,instance_id,cause}``,
  ``ejections_overflow_total{endpoint,variant,instance_id}`` (refused by
  ``max_ejection_percent``), ``instance_ejected`` and ``instance_on_probation`` (gauges).

- ``models_answers_dropped_total{instance_id,reason}``: instances' ``/v1/models`` answers left
  out of ``GET /v1/models`` (``gateway.openai.models``).

The series above with an ``instance_id`` go when their instance leaves its variant: the gauges
at once, the counters once no request is in flight to it (``gateway.departures``);
``models_answers_dropped_total``, labelled with the id alone, once no variant has that id (at
the next health round). A removed variant's series (``endpoint,variant``) go once its last
request has ended (``gateway.departures.forget_variant``).

The metrics updated on every proxied request (requests, in-flight, decision/overhead/TTFT
histograms, predicted hits, retries) are ``FastCounter`` / ``FastGauge`` / ``FastHistogram``:
plain attributes updated without a lock (every update happens on the event loop, and so does
the scrape), exposed through the same registry as the ``prometheus_client`` ones. Rarely updated
metrics stay ``prometheus_client`` objects.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

_PREFIX = "warmfleet_gateway"
_FAST_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _go_float(value: float) -> str:
    """A bucket bound as ``prometheus_client`` writes it (``le`` label)."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


class FastValue:
    """A counter or gauge child: a float updated in place (event-loop only, no lock)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class FastHistogramChild:
    """Per-bucket (non-cumulative) counts plus the sum; cumulated at scrape time."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # bucket "le": amount <= bound
        self.total += amount


C = TypeVar("C", "FastValue", "FastHistogramChild")


class _FastFamily(Generic[C]):
    """Children by label values, created on first use (like ``prometheus_client``'s)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        registry.register(self)

    def _new_child(self) -> C:
        raise NotImplementedError

    def labels(self, *values: str) -> C:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
            child = self._children[key] = self._new_child()
        return child

    def remove(self, *values: str) -> None:
        del self._children[tuple(str(v) for v in values)]

    def label_sets(self) -> list[tuple[str, ...]]:
        return list(self._children)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for key, child in list(self._children.items()):
            self._add(family, list(key), child)
        yield family

    def _family(self) -> Metric:
        raise NotImplementedError

    def _add(self, family: Metric, labels: list[str], child: C) -> None:
        raise NotImplementedError


class FastCounter(_FastFamily[FastValue]):
    def _new_child(self) -> FastValue:
        return FastValue()

    def _family(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: FastValue) -> None:
        assert isinstance(family, CounterMetricFamily)
        family.add_metric(labels, child.value)


class FastGauge(_FastFamily[FastValue]):
    def _new_child(self) -> FastValue:
        return FastValue()

    def _family(self) -> Metric:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: FastValue) -> None:
        assert isinstance(family, GaugeMetricFamily)
        family.add_metric(labels, child.value)


class FastHistogram(_FastFamily[FastHistogramChild]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self._les = [*(_go_float(b) for b in self.bounds), "+Inf"]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> FastHistogramChild:
        return FastHistogramChild(self.bounds)

    def _family(self) -> Metric:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: FastHistogramChild) -> None:
        assert isinstance(family, HistogramMetricFamily)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for le, count in zip(self._les, child.counts, strict=True):
            cumulative += count
            buckets.append((le, float(cumulative)))
        family.add_metric(labels, buckets, child.total)


_VARIANT = ("endpoint", "variant")
_INSTANCE = ("endpoint", "variant", "instance_id")


class GatewayMetrics:
    """All gateway metrics; one instance per app."""

    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=True)
        self._traffic(reg)
        self._decisions(reg)
        self._outliers(reg)
        self._flow(reg)
        self.reloads, self.models_dropped = _control_counters(reg)

    def _traffic(self, reg: CollectorRegistry) -> None:
        """Requests by outcome, in flight, and the instances' health and KV capacity."""
        self.requests = FastCounter(
            f"{_PREFIX}_requests",
            "Proxied requests by outcome",
            (*_INSTANCE, "reason", "status"),
            reg,
        )
        self.rejected = Counter(
            f"{_PREFIX}_rejected_requests",
            "Requests refused before routing",
            ("status",),
            registry=reg,
        )
        self.in_flight = FastGauge(
            f"{_PREFIX}_in_flight_requests", "Requests in flight per instance", _INSTANCE, reg
        )
        self.healthy = FastGauge(
            f"{_PREFIX}_instance_healthy", "1 if the instance takes traffic", _INSTANCE, reg
        )
        self.kv_capacity = FastGauge(
            f"{_PREFIX}_instance_kv_capacity_blocks",
            "KV capacity read from the engine's metrics, in routing-key blocks (0: unknown)",
            _INSTANCE,
            reg,
        )

    def _decisions(self, reg: CollectorRegistry) -> None:
        """Decision and relay timings, what the decisions predicted, spills and retries."""
        self.decision = FastHistogram(
            f"{_PREFIX}_decision_seconds",
            "Time spent choosing an instance",
            _VARIANT,
            buckets=_FAST_BUCKETS,
            registry=reg,
        )
        self.overhead = FastHistogram(
            f"{_PREFIX}_overhead_seconds",
            "Request received to upstream request issued",
            _VARIANT,
            buckets=_FAST_BUCKETS,
            registry=reg,
        )
        self.ttft = FastHistogram(
            f"{_PREFIX}_ttft_seconds",
            "Request received to first upstream body byte",
            (*_VARIANT, "stream"),
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        self.spills = Counter(
            f"{_PREFIX}_spills",
            "Decisions that spilled off the preferred instance",
            _INSTANCE,
            registry=reg,
        )
        self.prefix_hits = FastCounter(
            f"{_PREFIX}_predicted_prefix_hits",
            "Decisions predicting cached prefix blocks on the chosen instance",
            _VARIANT,
            reg,
        )
        self.cached_blocks = FastCounter(
            f"{_PREFIX}_predicted_cached_blocks",
            "Sum of predicted cached blocks over decisions",
            _VARIANT,
            reg,
        )
        self.retries = FastCounter(
            f"{_PREFIX}_retries", "Attempts retried on another instance", _VARIANT, reg
        )

    def _outliers(self, reg: CollectorRegistry) -> None:
        """Passive outlier detection: failures, ejections, probation, readmissions."""
        self.ejections = Counter(
            f"{_PREFIX}_ejections", "Instances ejected", (*_INSTANCE, "cause"), registry=reg
        )
        self.attempt_failures = Counter(
            f"{_PREFIX}_attempt_failures",
            "Attempts that failed on an instance (gateway failures: connect, timeout, "
            "disconnect, 502/503/504 status, broken stream)",
            (*_INSTANCE, "cause"),
            registry=reg,
        )
        self.ejections_overflow = Counter(
            f"{_PREFIX}_ejections_overflow",
            "Passive ejections refused by max_ejection_percent",
            _INSTANCE,
            registry=reg,
        )
        self.ejected = FastGauge(
            f"{_PREFIX}_instance_ejected", "1 while passively ejected", _INSTANCE, reg
        )
        self.probation = FastGauge(
            f"{_PREFIX}_instance_on_probation",
            "1 while on probation after a passive ejection",
            _INSTANCE,
            reg,
        )
        self.readmissions = Counter(
            f"{_PREFIX}_readmissions", "Instances readmitted", _INSTANCE, registry=reg
        )

    def _flow(self, reg: CollectorRegistry) -> None:
        """Flow control: queue waits, predicted and observed TTFT."""
        self.flow_wait = FastHistogram(
            f"{_PREFIX}_flow_wait_seconds",
            "Time a request waited in the flow-control queue (to its dispatch or shed)",
            (*_VARIANT, "band", "tenant", "outcome"),
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        self.flow_ttft = FastHistogram(
            f"{_PREFIX}_flow_ttft_seconds",
            "Engine-side TTFT of flow-controlled streamed requests: predicted and observed",
            (*_VARIANT, "kind"),
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def forget_instance(self, endpoint: str, variant: str, instance: str) -> None:
        """Drop the per-instance gauges of a removed instance (its counters go once no request
        is in flight to it: ``forget_counters``, ``gateway.departures``)."""
        for gauge in (self.in_flight, self.healthy, self.kv_capacity, self.ejected, self.probation):
            with contextlib.suppress(KeyError):
                gauge.remove(endpoint, variant, instance)

    def forget_counters(self, endpoint: str, variant: str, instances: set[str]) -> None:
        """Drop every per-instance counter series of ``instances`` (removed, and no request in
        flight to them any more)."""
        for key in self.requests.label_sets():
            if key[0] == endpoint and key[1] == variant and key[2] in instances:
                self.requests.remove(*key)
        for counter in (self.spills, self.readmissions, self.ejections_overflow):
            for instance in instances:
                with contextlib.suppress(KeyError):  # never counted (before 0.21: KeyError)
                    counter.remove(endpoint, variant, instance)
        for by_cause in (self.ejections, self.attempt_failures):
            for labels in label_sets(by_cause, ("endpoint", "variant", "instance_id", "cause")):
                if labels[0] == endpoint and labels[1] == variant and labels[2] in instances:
                    by_cause.remove(*labels)


def _control_counters(reg: CollectorRegistry) -> tuple[Counter, Counter]:
    """The configuration reloads and the models cache's dropped answers (off the request path)."""
    reloads = Counter(
        f"{_PREFIX}_config_reloads", "Configuration changes", ("source", "result"), registry=reg
    )
    models_dropped = Counter(
        f"{_PREFIX}_models_answers_dropped",
        "Instances' /v1/models answers left out of GET /v1/models (malformed, too large "
        "or too deep)",
        ("instance_id", "reason"),
        registry=reg,
    )
    return reloads, models_dropped


def label_sets(counter: Counter, names: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The label values of each child of ``counter`` (labels ``names``), read from its samples
    (``remove_by_labels`` needs prometheus-client 0.22)."""
    found: set[tuple[str, ...]] = set()
    for family in counter.collect():
        for sample in family.samples:
            found.add(tuple(sample.labels[name] for name in names))
    return found
