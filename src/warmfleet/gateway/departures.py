"""The per-instance metric series of the instances that left a variant.

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
