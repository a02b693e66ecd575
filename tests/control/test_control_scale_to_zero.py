"""Scale to zero and back (``autoscaling.minReplicas: 0``): pure, on an injected clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.api.resources import AutoscalingSpec
from warmfleet.control.autoscaler import AutoscalerState, recommend
from warmfleet.control.load import in_flight_by_variant

ZERO = AutoscalingSpec(
    enabled=True,
    min_replicas=0,
    max_replicas=8,
    target_in_flight_per_replica=4.0,
    scale_to_zero_after_s=60.0,
    scale_up_stabilization_s=30.0,  # would delay an ordinary scale-up; not an activation
    scale_up_cooldown_s=30.0,
    scale_down_stabilization_s=300.0,
)


def test_min_replicas_zero_is_accepted() -> None:
    spec = AutoscalingSpec.model_validate(
        {"enabled": True, "minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfterS": 5}
    )
    assert (spec.min_replicas, spec.scale_to_zero_after_s) == (0, 5.0)


def test_idle_variant_goes_to_zero_only_after_the_idle_time() -> None:
    rec = recommend(ZERO, current=1, in_flight_total=2.0, now_s=0.0)
    assert rec.replicas == 1
    state = rec.state
    for t in (10.0, 30.0, 69.0):  # idle from t=10: not yet 60 s
        rec = recommend(ZERO, current=1, in_flight_total=0.0, now_s=t, state=state)
        state = rec.state
        assert rec.replicas == 1, t  # floor 1 while not idle long enough
    rec = recommend(ZERO, current=1, in_flight_total=0.0, now_s=70.0, state=state)
    assert (rec.replicas, rec.reason) == (0, "idle")


def test_a_request_restarts_the_idle_clock() -> None:
    state = recommend(ZERO, current=1, in_flight_total=0.0, now_s=0.0).state
    state = recommend(ZERO, current=1, in_flight_total=1.0, now_s=50.0, state=state).state
    rec = recommend(ZERO, current=1, in_flight_total=0.0, now_s=70.0, state=state)
    assert rec.replicas == 1
    rec = recommend(ZERO, current=1, in_flight_total=0.0, now_s=130.0, state=rec.state)
    assert rec.replicas == 0


def test_demand_at_zero_activates_at_once() -> None:
    """Held requests at zero: back to >= 1 without stabilisation or cooldown, sized on the
    demand and the step limit."""
    zero = AutoscalerState(last_scale_up_s=0.0, idle_since_s=0.0)  # a scale-up 0 s ago
    rec = recommend(ZERO, current=0, in_flight_total=1.0, now_s=1.0, state=zero)
    assert (rec.replicas, rec.reason) == (1, "activation")
    rec = recommend(ZERO, current=0, in_flight_total=13.0, now_s=1.0, state=zero)
    assert rec.replicas == 4  # ceil(13 / 4)
    rec = recommend(ZERO, current=0, in_flight_total=400.0, now_s=1.0, state=zero)
    assert rec.replicas == ZERO.scale_up_max_step


def test_no_demand_at_zero_stays_at_zero() -> None:
    rec = recommend(ZERO, current=0, in_flight_total=0.0, now_s=0.0)
    assert (rec.replicas, rec.reason) == (0, "scaled to zero")


def test_held_requests_count_as_load() -> None:
    text = (
        'warmfleet_gateway_in_flight_requests{endpoint="e",variant="v",instance_id="a"} 2\n'
        'warmfleet_gateway_held_requests{endpoint="e",variant="v"} 3\n'
        'warmfleet_gateway_held_requests{endpoint="e",variant="w"} 0\n'
    )
    assert in_flight_by_variant([text]) == {("e", "v"): 5.0, ("e", "w"): 0.0}


def test_flow_queued_requests_count_as_load_over_bands_and_tenants() -> None:
    text = (
        'warmfleet_gateway_in_flight_requests{endpoint="e",variant="v",instance_id="a"} 1\n'
        'warmfleet_gateway_flow_queued_requests{endpoint="e",variant="v",band="high",'
        'tenant="acme"} 2\n'
        'warmfleet_gateway_flow_queued_requests{endpoint="e",variant="v",band="low",'
        'tenant="other"} 4\n'
        'warmfleet_gateway_flow_queued_requests{endpoint="e",variant="z",band="low",'
        'tenant="other"} 1\n'
    )
    assert in_flight_by_variant([text]) == {("e", "v"): 7.0, ("e", "z"): 1.0}


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 8),
    st.lists(
        st.tuples(st.floats(0.5, 40.0), st.sampled_from([0.0, 0.0, 1.0, 3.0, 30.0])),
        min_size=1,
        max_size=40,
    ),
)
def test_zero_only_when_idle_and_demand_always_served(
    current: int, steps: list[tuple[float, float]]
) -> None:
    """Invariants: within [0, max]; demand at zero gives >= 1 at once; a running variant goes
    to zero only after ``scaleToZeroAfterS`` without load."""
    state, replicas, now_s, idle_since_s = AutoscalerState(), current, 0.0, None
    for dt, load in steps:
        now_s += dt
        idle_since_s = None if load > 0 else (now_s if idle_since_s is None else idle_since_s)
        rec = recommend(ZERO, replicas, load, now_s, state)
        assert 0 <= rec.replicas <= ZERO.max_replicas
        if load > 0:
            assert rec.replicas >= 1
        if replicas > 0 and rec.replicas == 0:
            assert idle_since_s is not None
            assert now_s - idle_since_s >= ZERO.scale_to_zero_after_s
        replicas, state = rec.replicas, rec.state
