"""The metric series of the instances that left a variant, and of the variants removed.

An instance that leaves (a pod replaced by a rollout, a reload, an admin change) takes every
series labelled with it along, so that a fleet whose pods churn does not grow ``/metrics`` and
the process for ever: its gauges at once (``in_flight_requests``, ``instance_healthy``, ...),
its counters (``requests_total``, ``spills_total``, ``ejections_total``,
``attempt_failures_total``, ``ejections_overflow_total``, ``readmissions_total``) and the
variant's cached ``requests_total`` children once no request is in flight to it any more.

A request still in flight when its instance left ends later and counts into those series (no
count is lost); they go at the first ``sweep`` after the last such request ended (each change of
the variant's instance set, and each health round). Nothing re-creates them afterwards: a request
counts its outcome before it gives its load back, so an instance with no load has no count to
come. None of this runs per request.

A variant removed (a reload, an admin or InferenceEndpoint change) takes its series along too
(``forget_variant``: ``requests_total`` with ``instance_id="none"``, ``decision_seconds``,
``overhead_seconds``, ``ttft_seconds``, the predicted hits, ``retries_total``,
``flow_wait_seconds``, ``flow_ttft_seconds``; flow control's and the hold's own series by their
``forget_variant``), at the first health round after its last request ended: none on its
instances, none parked in its flow gate, none held (``GatewayState.forget_departed``). A
request that picked the variant before it went but held none of that (keying a large body off
the loop) and counts later counts into a series of its own, never exported
(``VariantRuntime.series_gone``, read per request; such a variant is neither queued nor held
any more): nothing re-creates them.
A variant of that name added again before then keeps them (they are its own).

The models cache's ``models_answers_dropped_total{instance_id,reason}`` is labelled with the id
alone (one id may be in several variants): its series go once no variant has the id any more
(``forget_models_answers``, each health round). No request counts into it: an answer the cache
reads after its instance left is logged, not counted (``gateway.openai.models``).
"""

from __future__ import annotations

from collections.abc import Mapping

from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.metrics import FastValue, GatewayMetrics, label_sets


class Departures:
    """Those of one variant: ``left`` when an instance object leaves its instance set, ``sweep``
    to forget the counters of those whose requests have all ended."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        endpoint: str,
        variant: str,
        cache: dict[tuple[str, str, str], FastValue],
    ) -> None:
        self.metrics = metrics
        self.endpoint = endpoint
        self.variant = variant
        self.cache = cache  # the variant's request counters by (instance, reason, status)
        self.draining: list[InstanceRuntime] = []

    def left(self, inst: InstanceRuntime, *, gone: bool) -> None:
        """``inst`` is no longer in the instance set: ``gone`` (its id too) or replaced by
        another object of that id (a new URL: the series are the new one's)."""
        if gone:
            self.metrics.forget_instance(self.endpoint, self.variant, inst.instance_id)
        self.draining.append(inst)

    def sweep(self, live: Mapping[str, InstanceRuntime]) -> bool:
        """Forget the counters of each departed id that is not ``live`` again and has no
        request in flight on any of its objects. True while some object still has one."""
        if not self.draining:
            return False
        busy = [inst for inst in self.draining if inst.in_flight_requests > 0]
        waiting = {inst.instance_id for inst in busy}
        done = {i.instance_id for i in self.draining} - waiting - live.keys()
        self.draining = busy
        if done:
            self.metrics.forget_counters(self.endpoint, self.variant, done)
            for key in [key for key in self.cache if key[0] in done]:
                del self.cache[key]
        return bool(busy)


def forget_models_answers(metrics: GatewayMetrics, live: set[str]) -> None:
    """Drop the ``models_answers_dropped_total`` series of every instance id not in ``live``
    (the ids in some variant)."""
    dropped = metrics.models_dropped
    for labels in label_sets(dropped, ("instance_id", "reason")):
        if labels[0] not in live:
            dropped.remove(*labels)


def forget_variant(metrics: GatewayMetrics, endpoint: str, variant: str) -> None:
    """Drop every series labelled with the variant (removed, and no request left to it): the
    request counters (``instance_id="none"`` too), the decision, overhead and TTFT histograms,
    predicted hits, retries and flow control's histograms (the per-instance ones went with its
    instances)."""
    where = (endpoint, variant)
    families = (metrics.requests, metrics.decision, metrics.overhead, metrics.ttft,
                metrics.prefix_hits, metrics.cached_blocks, metrics.retries, metrics.flow_wait,
                metrics.flow_ttft)  # fmt: skip
    for family in families:
        for key in family.label_sets():
            if key[:2] == where:
                family.remove(*key)
