"""Prometheus metrics of one gateway app, in a per-app ``CollectorRegistry`` (no global state).

Names (all prefixed ``warmfleet_gateway_``):

- ``requests_total{endpoint,variant,instance,reason,status}``: finished proxied requests;
  ``status`` is the HTTP status sent, or ``stream_error`` when a stream ended with an error event,
  or ``client_disconnect``.
- ``rejected_requests_total{status}``: requests answered with an error before routing.
- ``in_flight_requests{endpoint,variant,instance}``, ``instance_healthy{endpoint,variant,instance}``
- ``decision_seconds{endpoint,variant}``: time inside ``Router.choose``.
- ``overhead_seconds{endpoint,variant}``: request handler entered -> upstream request issued
  (body read, JSON parse, key, decision, bookkeeping).
- ``ttft_seconds{endpoint,variant,stream}``: request handler entered -> first upstream body byte.
- ``spills_total{endpoint,variant,instance}``, ``predicted_prefix_hits_total{endpoint,variant}``,
  ``predicted_cached_blocks_total{endpoint,variant}``
- ``retries_total{endpoint,variant}``, ``ejections_total{endpoint,variant,instance,cause}``,
  ``readmissions_total{endpoint,variant,instance}``, ``config_reloads_total{source,result}``.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

_PREFIX = "warmfleet_gateway"
_FAST_BUCKETS = (
    0.00005,
    0.0001,
    0.0002,
    0.0003,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.05,
)
_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """All gateway metrics; one instance per app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        variant = ("endpoint", "variant")
        instance = ("endpoint", "variant", "instance")
        self.requests = Counter(
            f"{_PREFIX}_requests",
            "Proxied requests by outcome",
            (*instance, "reason", "status"),
            registry=reg,
        )
        self.rejected = Counter(
            f"{_PREFIX}_rejected_requests",
            "Requests refused before routing",
            ("status",),
            registry=reg,
        )
        self.in_flight = Gauge(
            f"{_PREFIX}_in_flight_requests",
            "Requests in flight per instance",
            instance,
            registry=reg,
        )
        self.healthy = Gauge(
            f"{_PREFIX}_instance_healthy", "1 if the instance takes traffic", instance, registry=reg
        )
        self.decision = Histogram(
            f"{_PREFIX}_decision_seconds",
            "Time spent choosing an instance",
            variant,
            buckets=_FAST_BUCKETS,
            registry=reg,
        )
        self.overhead = Histogram(
            f"{_PREFIX}_overhead_seconds",
            "Request received to upstream request issued",
            variant,
            buckets=_FAST_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            f"{_PREFIX}_ttft_seconds",
            "Request received to first upstream body byte",
            (*variant, "stream"),
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        self.spills = Counter(
            f"{_PREFIX}_spills",
            "Decisions that spilled off the preferred instance",
            instance,
            registry=reg,
        )
        self.prefix_hits = Counter(
            f"{_PREFIX}_predicted_prefix_hits",
            "Decisions predicting cached prefix blocks on the chosen instance",
            variant,
            registry=reg,
        )
        self.cached_blocks = Counter(
            f"{_PREFIX}_predicted_cached_blocks",
            "Sum of predicted cached blocks over decisions",
            variant,
            registry=reg,
        )
        self.retries = Counter(
            f"{_PREFIX}_retries", "Attempts retried on another instance", variant, registry=reg
        )
        self.ejections = Counter(
            f"{_PREFIX}_ejections", "Instances ejected", (*instance, "cause"), registry=reg
        )
        self.readmissions = Counter(
            f"{_PREFIX}_readmissions", "Instances readmitted", instance, registry=reg
        )
        self.reloads = Counter(
            f"{_PREFIX}_config_reloads", "Configuration changes", ("source", "result"), registry=reg
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def forget_instance(self, endpoint: str, variant: str, instance: str) -> None:
        """Drop the per-instance gauges of a removed instance (counters keep their history)."""
        for gauge in (self.in_flight, self.healthy):
            with contextlib.suppress(KeyError):
                gauge.remove(endpoint, variant, instance)
