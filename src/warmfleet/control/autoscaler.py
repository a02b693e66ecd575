"""HPA-like autoscaling policy on in-flight work per replica (pure; state passed in and out).

One decision (``recommend``) per sync period, as the Kubernetes HPA does:

1. raw = ceil(in_flight_total / target_in_flight_per_replica); inside the tolerance band around
   the current count (|ratio - 1| <= tolerance) the count is kept;
2. stabilisation: a scale-up uses the *lowest* raw recommendation of the last
   ``scale_up_stabilization_s``, a scale-down the *highest* of the last
   ``scale_down_stabilization_s`` (so a short dip does not remove replicas);
3. rate limit: one decision adds at most max(``scale_up_max_step``, current x
   ``scale_up_max_percent`` %) replicas;
4. cooldowns: no scale-up within ``scale_up_cooldown_s`` of the previous scale-up, no scale-down
   within ``scale_down_cooldown_s`` of the previous scaling of either direction;
5. clamp to [minReplicas, maxReplicas].

Scale to zero (``minReplicas: 0``, as Knative and KEDA do it): the floor stays 1 until the
variant has been idle (nothing in flight, nothing held at the gateway) for ``scaleToZeroAfterS``;
then it goes to 0 at once. At 0, any demand (requests held at the gateway for the variant, which
the gateway counts in the same load signal) is an activation: ``ceil(demand / target)``
replicas (at least 1, at most the step limit) without stabilisation or cooldown, since a client
is waiting.

The metric is the gateway's in-flight request count for the variant (requests admitted and not
finished), summed over its replicas; it counts queued work, so it keeps growing while replicas
are still starting, which is what makes scale-out pick up the load that is waiting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from warmfleet.api.resources import AutoscalingSpec


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    history: tuple[tuple[float, int], ...] = ()  # (time_s, raw recommendation)
    last_scale_up_s: float | None = None
    last_scale_down_s: float | None = None
    idle_since_s: float | None = None  # since when nothing was in flight or held


@dataclass(frozen=True, slots=True)
class Recommendation:
    replicas: int
    raw: int
    reason: str
    state: AutoscalerState


def _raw(spec: AutoscalingSpec, current: int, in_flight_total: float) -> int:
    desired = math.ceil(in_flight_total / spec.target_in_flight_per_replica - 1e-9)
    if current > 0:
        ratio = in_flight_total / (current * spec.target_in_flight_per_replica)
        if abs(ratio - 1.0) <= spec.tolerance:
            return current
    return desired


def _within(history: tuple[tuple[float, int], ...], now_s: float, window_s: float) -> list[int]:
    return [r for t, r in history if now_s - t <= window_s]


def _idle_since(state: AutoscalerState, in_flight_total: float, now_s: float) -> float | None:
    if in_flight_total > 0:
        return None
    return now_s if state.idle_since_s is None else state.idle_since_s


def _zero_scaling(
    spec: AutoscalingSpec, current: int, raw: int, idle_since_s: float | None, now_s: float
) -> tuple[int, str] | None:
    """The scale-to-zero decisions (``minReplicas: 0``), which bypass the HPA rules."""
    if spec.min_replicas > 0:
        return None
    if current == 0:
        if raw == 0:
            return 0, "scaled to zero"
        step = max(spec.scale_up_max_step, 1)
        return max(1, min(raw, step, spec.max_replicas)), "activation"
    if idle_since_s is not None and now_s - idle_since_s >= spec.scale_to_zero_after_s:
        return 0, "idle"
    return None


def recommend(
    spec: AutoscalingSpec,
    current: int,
    in_flight_total: float,
    now_s: float,
    state: AutoscalerState | None = None,
) -> Recommendation:
    state = state or AutoscalerState()
    raw = max(0, _raw(spec, current, in_flight_total))
    idle_since_s = _idle_since(state, in_flight_total, now_s)
    zero = _zero_scaling(spec, current, raw, idle_since_s, now_s)
    if zero is not None:
        target, reason = zero
        new_state = AutoscalerState(
            history=((now_s, raw),),
            last_scale_up_s=now_s if target > current else state.last_scale_up_s,
            last_scale_down_s=now_s if target < current else state.last_scale_down_s,
            idle_since_s=idle_since_s,
        )
        return Recommendation(replicas=target, raw=raw, reason=reason, state=new_state)
    keep_s = max(spec.scale_up_stabilization_s, spec.scale_down_stabilization_s)
    history = (*((t, r) for t, r in state.history if now_s - t <= keep_s), (now_s, raw))
    target, reason = current, "steady"
    if raw > current:
        target = max(current, min(_within(history, now_s, spec.scale_up_stabilization_s)))
        step = max(spec.scale_up_max_step, math.floor(current * spec.scale_up_max_percent / 100))
        target, reason = min(target, current + step), "load above target"
        last_up = state.last_scale_up_s
        if last_up is not None and now_s - last_up < spec.scale_up_cooldown_s:
            target, reason = current, "scale-up cooldown"
    elif raw < current:
        target = min(current, max(_within(history, now_s, spec.scale_down_stabilization_s)))
        reason = "load below target"
        last = max(
            (t for t in (state.last_scale_up_s, state.last_scale_down_s) if t is not None),
            default=None,
        )
        if last is not None and now_s - last < spec.scale_down_cooldown_s:
            target, reason = current, "scale-down cooldown"
    floor = max(spec.min_replicas, 1)  # below 1 only by ``_zero_scaling``
    clamped = max(floor, min(spec.max_replicas, target))
    if clamped != target:
        target, reason = clamped, "bounds"
    new_state = AutoscalerState(
        history=history,
        last_scale_up_s=now_s if target > current else state.last_scale_up_s,
        last_scale_down_s=now_s if target < current else state.last_scale_down_s,
        idle_since_s=idle_since_s,
    )
    return Recommendation(replicas=target, raw=raw, reason=reason, state=new_state)
