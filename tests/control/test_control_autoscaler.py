from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from warmfleet.api.resources import AutoscalingSpec
from warmfleet.control.autoscaler import AutoscalerState, recommend

SPEC = AutoscalingSpec(
    enabled=True,
    min_replicas=1,
    max_replicas=20,
    target_in_flight_per_replica=10.0,
    scale_down_stabilization_s=300.0,
    scale_down_cooldown_s=60.0,
)


def test_scale_up_is_proportional_and_rate_limited() -> None:
    rec = recommend(SPEC, current=2, in_flight_total=200.0, now_s=0.0)
    assert rec.raw == 20
    assert rec.replicas == 6  # +max(4 pods, 100 %) per decision
    rec = recommend(SPEC, current=6, in_flight_total=200.0, now_s=15.0, state=rec.state)
    assert rec.replicas == 12
    rec = recommend(SPEC, current=12, in_flight_total=200.0, now_s=30.0, state=rec.state)
    assert rec.replicas == 20


def test_tolerance_band_keeps_count() -> None:
    assert recommend(SPEC, current=4, in_flight_total=43.0, now_s=0.0).replicas == 4
    assert recommend(SPEC, current=4, in_flight_total=45.0, now_s=0.0).replicas == 5


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    state = AutoscalerState()
    rec = recommend(SPEC, current=8, in_flight_total=80.0, now_s=0.0, state=state)
    state = rec.state
    for t in range(15, 300, 15):
        rec = recommend(SPEC, current=8, in_flight_total=10.0, now_s=float(t), state=state)
        state = rec.state
        assert rec.replicas == 8, t  # the 8 recommended at t=0 is still in the window
    rec = recommend(SPEC, current=8, in_flight_total=10.0, now_s=315.0, state=state)
    assert rec.replicas == 1


def test_cooldown_after_scale_up_blocks_scale_down() -> None:
    rec = recommend(SPEC, current=1, in_flight_total=30.0, now_s=0.0)
    assert rec.replicas == 3
    spec = SPEC.model_copy(update={"scale_down_stabilization_s": 0.0})
    rec2 = recommend(spec, current=3, in_flight_total=0.0, now_s=30.0, state=rec.state)
    assert rec2.replicas == 3
    assert rec2.reason == "scale-down cooldown"
    rec3 = recommend(spec, current=3, in_flight_total=0.0, now_s=61.0, state=rec.state)
    assert rec3.replicas == 1


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 30),
    st.lists(st.floats(0.0, 1000.0, allow_nan=False), min_size=1, max_size=30),
)
def test_always_within_bounds_and_steps(current: int, loads: list[float]) -> None:
    state = AutoscalerState()
    replicas = current
    for i, load in enumerate(loads):
        rec = recommend(SPEC, replicas, load, float(i * 15), state)
        assert SPEC.min_replicas <= rec.replicas <= SPEC.max_replicas
        if SPEC.min_replicas <= replicas <= SPEC.max_replicas and rec.replicas > replicas:
            assert rec.replicas - replicas <= max(SPEC.scale_up_max_step, replicas)
            assert rec.raw > replicas
        if SPEC.min_replicas <= replicas <= SPEC.max_replicas and rec.replicas < replicas:
            assert rec.raw < replicas
        replicas, state = rec.replicas, rec.state


def test_negative_min_replicas_is_rejected() -> None:
    """``minReplicas: 0`` is scale to zero (test_control_scale_to_zero); below is an error."""
    with pytest.raises(ValidationError, match="minReplicas"):
        AutoscalingSpec.model_validate({"enabled": True, "minReplicas": -1, "maxReplicas": 3})
