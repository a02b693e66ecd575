from __future__ import annotations

from control_support import endpoint, spec

from warmfleet.api import names
from warmfleet.api.resources import AutoscalingSpec, ProductionVariant
from warmfleet.control.load import autoscale, in_flight_by_variant
from warmfleet.control.observed import DesiredEndpoint, ObservedDeployment

TEXT = """# HELP warmfleet_gateway_in_flight_requests In-flight requests
# TYPE warmfleet_gateway_in_flight_requests gauge
warmfleet_gateway_in_flight_requests{endpoint="llama",instance_id="a",variant="main"} 12.0
warmfleet_gateway_in_flight_requests{endpoint="llama",instance_id="b",variant="main"} 8.0
warmfleet_gateway_in_flight_requests{endpoint="other",instance_id="c",variant="main"} 1.0
warmfleet_gateway_requests_total{endpoint="llama",instance_id="a",variant="main"} 99.0
"""


def test_in_flight_sums_instances_and_gateways() -> None:
    totals = in_flight_by_variant([TEXT, TEXT.replace("12.0", "30.0")])
    assert totals == {("llama", "main"): 58.0, ("other", "main"): 2.0}
    assert in_flight_by_variant(["garbage\n{}", ""]) == {}


def _autoscaled_llama(replicas: int) -> tuple[DesiredEndpoint, ObservedDeployment]:
    """Endpoint llama, variant main autoscaled (1-10, 5 in flight per replica), running
    ``replicas`` of its current revision."""
    scaling = AutoscalingSpec(
        enabled=True, min_replicas=1, max_replicas=10, target_in_flight_per_replica=5
    )
    s = spec(replicas=replicas).model_copy(
        update={
            "variants": (ProductionVariant(name="main", replicas=replicas, autoscaling=scaling),)
        }
    )
    dep = ObservedDeployment("d", "llama", "main", names.revision(s), replicas, None, None)
    return endpoint("llama", s), dep


def test_autoscale_uses_the_current_deployment_and_keeps_state() -> None:
    e, dep = _autoscaled_llama(replicas=2)
    decisions, states = autoscale([e], [dep], {("llama", "main"): 58.0}, 0.0, {})
    assert decisions == {"llama": {"main": 6}}  # 12 wanted, +4 pods per decision at most
    decisions, states = autoscale([e], [dep], {}, 15.0, states)
    assert decisions == {"llama": {"main": 2}}  # no sample: keep the count
    assert ("llama", "main") in states
    fixed = endpoint("fixed", spec())
    assert autoscale([fixed], [], {("fixed", "main"): 100.0}, 0.0, {}) == ({}, {})


def test_a_non_finite_or_negative_sample_is_no_data_and_keeps_the_count() -> None:
    """Prometheus text may carry NaN/+Inf; a negative gauge is an accounting bug. Either one
    makes the variant's total unknown: it must neither crash the pass (math.ceil(nan) raises)
    nor scale on garbage, so the variant keeps its count like one without a sample."""
    e, dep = _autoscaled_llama(replicas=3)
    for bad in ("NaN", "+Inf", "-Inf", "-4.0"):
        text = TEXT.replace("8.0", bad)
        totals = in_flight_by_variant([text])
        assert totals == {("other", "main"): 1.0}, bad
        decisions, _ = autoscale([e], [dep], totals, 0.0, {})
        assert decisions == {"llama": {"main": 3}}, bad


def test_a_partial_sample_may_scale_up_but_never_down() -> None:
    """With a gateway unreachable the total is only a lower bound of the load: enough to scale
    up on, never to scale down on (that would shed capacity under load)."""
    e, dep = _autoscaled_llama(replicas=4)
    low = {("llama", "main"): 2.0}  # 1 replica's worth, from the gateways that answered
    decisions, states = autoscale([e], [dep], low, 0.0, {}, partial=True)
    assert (decisions, states) == ({"llama": {"main": 4}}, {})
    assert autoscale([e], [dep], low, 0.0, {})[0] == {"llama": {"main": 1}}  # complete: down
    high = {("llama", "main"): 40.0}
    assert autoscale([e], [dep], high, 0.0, {}, partial=True)[0] == {"llama": {"main": 8}}
