"""Passive outlier detection: the pure policy (``gateway.outlier``, fake clock) and how a
variant applies it (healthy and routable sets, the router, probes that do not readmit)."""

from __future__ import annotations

import math

import pytest
from gateway_support import FakeRouterFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.errors import ConfigError
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.outlier import (
    EJECTED,
    IN,
    PROBATION,
    Change,
    FailureCause,
    OutlierPolicy,
    OutlierRecord,
    PromptAvoidance,
    max_ejected,
)
from warmfleet.gateway.server_config import OutlierConfig
from warmfleet.gateway.world import GatewayState

TIMEOUT = FailureCause.TIMEOUT


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _policy(**config: float) -> tuple[OutlierPolicy, Clock]:
    clock = Clock()
    return OutlierPolicy(OutlierConfig.model_validate(config), clock), clock


def _fleet(n: int) -> list[OutlierRecord]:
    return [OutlierRecord(f"i{k}") for k in range(n)]


def test_defaults_suit_a_small_fleet() -> None:
    config = OutlierConfig()
    assert config.consecutive_failures == 3
    assert (config.base_ejection_time_s, config.max_ejection_time_s) == (30.0, 300.0)
    assert config.max_ejection_percent == 50
    assert [max_ejected(n, 50) for n in (1, 2, 3, 4, 10)] == [1, 1, 1, 2, 5]


@pytest.mark.parametrize(
    ("instances", "percent", "expected"),
    [(2, 10, 1), (20, 10, 2), (5, 0, 0), (0, 50, 0), (4, 100, 4), (7, 99, 6)],
)
def test_max_ejected(instances: int, percent: int, expected: int) -> None:
    assert max_ejected(instances, percent) == expected


def test_config_is_strict_and_consistent() -> None:
    base = {"endpoints": [{"name": "e", "variants": [{"name": "v"}]}]}

    def parse(outlier: dict[str, object]) -> None:
        spec = {**base, "health": {"outlier": outlier}}
        parse_gateway_config(
            {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}
        )

    parse({"consecutive_failures": 5, "max_ejection_percent": 100})
    with pytest.raises(ConfigError, match=r"outlier\.consecutive_errors"):
        parse({"consecutive_errors": 5})
    with pytest.raises(ConfigError, match="maxEjectionTimeS must not be below"):
        parse({"base_ejection_time_s": 60, "max_ejection_time_s": 30})
    with pytest.raises(ConfigError, match="maxEjectionPercent"):
        parse({"max_ejection_percent": 101})


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    policy, _ = _policy(consecutive_failures=3)
    fleet = _fleet(2)
    a = fleet[0]
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.NONE
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.NONE
    assert policy.on_success(a) is Change.NONE
    assert a.consecutive_failures == 0
    for _ in range(2):
        assert policy.on_failure(a, FailureCause.STATUS, fleet) is Change.NONE
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.EJECTED
    assert (a.standing, a.times_ejected, a.last_cause) == (EJECTED, 1, TIMEOUT)
    assert not a.routable


def test_a_refused_connection_ejects_at_once() -> None:
    policy, _ = _policy(consecutive_failures=5)
    fleet = _fleet(2)
    assert policy.on_failure(fleet[0], FailureCause.CONNECT, fleet) is Change.EJECTED


def test_ejection_time_grows_with_each_ejection_up_to_the_max() -> None:
    policy, clock = _policy(consecutive_failures=1, base_ejection_time_s=10, max_ejection_time_s=25)
    fleet = _fleet(2)
    a = fleet[0]
    for times, duration in ((1, 10.0), (2, 20.0), (3, 25.0), (4, 25.0)):
        assert policy.on_failure(a, TIMEOUT, fleet) is Change.EJECTED
        assert a.times_ejected == times
        assert a.ejected_until_s == clock.now_s + duration
        assert policy.next_ejection_end(fleet) == a.ejected_until_s
        clock.now_s += duration - 0.001
        assert policy.expire(fleet) == ([], a.ejected_until_s)  # not a moment early
        clock.now_s += 0.001
        assert policy.expire(fleet) == ([a], math.inf)
        assert a.standing is PROBATION
        assert a.routable


def test_outcomes_while_ejected_change_nothing() -> None:
    policy, _ = _policy(consecutive_failures=1)
    fleet = _fleet(2)
    a = fleet[0]
    policy.on_failure(a, TIMEOUT, fleet)
    until = a.ejected_until_s
    assert policy.on_success(a) is Change.NONE  # a request sent before the ejection
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.NONE
    assert (a.standing, a.times_ejected, a.ejected_until_s) == (EJECTED, 1, until)


def test_probation_one_trial_then_readmitted_or_ejected_for_longer() -> None:
    policy, clock = _policy(
        consecutive_failures=2, base_ejection_time_s=10, max_ejection_time_s=100
    )
    fleet = _fleet(2)
    a = fleet[0]
    policy.on_failure(a, FailureCause.CONNECT, fleet)
    clock.now_s += 10
    policy.expire(fleet)
    first, second = object(), object()
    assert policy.begin_trial(a, first)
    assert not a.routable  # one request at a time
    assert not policy.begin_trial(a, second)
    assert not policy.end_trial(a, second)
    assert policy.end_trial(a, first)  # no verdict (the client left): the next one may try
    assert a.routable
    assert policy.begin_trial(a, second)
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.EJECTED  # one failure is enough
    assert (a.times_ejected, a.ejected_until_s, a.trial) == (2, clock.now_s + 20, None)
    clock.now_s += 20
    policy.expire(fleet)
    assert policy.on_success(a) is Change.READMITTED
    assert (a.standing, a.consecutive_failures, a.decay_from_s) == (IN, 0, clock.now_s)


def test_the_multiplier_decays_while_readmitted() -> None:
    policy, clock = _policy(
        consecutive_failures=1, base_ejection_time_s=10, max_ejection_time_s=1000
    )
    fleet = _fleet(2)
    a = fleet[0]
    for _ in range(3):  # ejected 3 times in a row
        policy.on_failure(a, TIMEOUT, fleet)
        clock.now_s = a.ejected_until_s
        policy.expire(fleet)
    policy.on_success(a)
    clock.now_s += 25  # two decay steps of 10 s
    policy.on_failure(a, TIMEOUT, fleet)
    assert a.times_ejected == 3 - 2 + 1
    assert a.ejected_until_s == clock.now_s + 20


def test_max_ejection_percent_refuses_and_the_count_stays() -> None:
    policy, clock = _policy(consecutive_failures=1, max_ejection_percent=50)
    fleet = _fleet(2)
    a, b = fleet
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.EJECTED
    assert policy.on_failure(b, TIMEOUT, fleet) is Change.OVERFLOW  # the fleet is failing
    assert b.standing is IN
    assert b.routable
    clock.now_s = a.ejected_until_s
    policy.expire(fleet)
    assert policy.on_failure(b, TIMEOUT, fleet) is Change.EJECTED  # room again


def test_probation_failure_over_the_limit_stays_on_probation() -> None:
    policy, clock = _policy(consecutive_failures=1, max_ejection_percent=50)
    fleet = _fleet(2)
    a, b = fleet
    policy.on_failure(a, TIMEOUT, fleet)
    clock.now_s = a.ejected_until_s
    policy.expire(fleet)
    policy.on_failure(b, TIMEOUT, fleet)
    assert policy.begin_trial(a, "trial")
    assert policy.on_failure(a, TIMEOUT, fleet) is Change.OVERFLOW
    assert (a.standing, a.trial) == (PROBATION, None)


def test_instances_leaving_release_the_ejections_over_the_limit() -> None:
    policy, clock = _policy(consecutive_failures=1, max_ejection_percent=50)
    fleet = _fleet(4)
    policy.on_failure(fleet[0], TIMEOUT, fleet)
    clock.now_s += 1
    policy.on_failure(fleet[1], TIMEOUT, fleet)
    left = fleet[:2]  # the two good ones were removed
    assert policy.release_excess(left) == [fleet[0]]  # the one whose ejection ends first
    assert [r.standing for r in left] == [PROBATION, EJECTED]
    assert policy.release_all(left) == left
    assert all(r.standing is IN for r in left)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["fail", "connect", "ok", "tick", "trial", "end"]),
        st.integers(0, 9),
        st.floats(0, 50),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 10),
    percent=st.integers(0, 100),
    threshold=st.integers(1, 4),
    ops=_OPS,
)
def test_invariants(
    n: int, percent: int, threshold: int, ops: list[tuple[str, int, float]]
) -> None:
    """Whatever happens: never more than max_ejection_percent ejected (so, below 100 %, never
    every instance of a fleet of two or more); an ejection never outlasts the max; an ejected
    instance is not routable and has no trial; a probation instance has at most one."""
    policy, clock = _policy(
        consecutive_failures=threshold,
        base_ejection_time_s=10,
        max_ejection_time_s=35,
        max_ejection_percent=percent,
    )
    fleet = _fleet(n)
    for op, index, seconds in ops:
        rec = fleet[index % n]
        if op == "fail":
            policy.on_failure(rec, TIMEOUT, fleet)
        elif op == "connect":
            policy.on_failure(rec, FailureCause.CONNECT, fleet)
        elif op == "ok":
            policy.on_success(rec)
        elif op == "tick":
            clock.now_s += seconds
            policy.expire(fleet)
        elif op == "trial":
            policy.begin_trial(rec, op)
        else:
            policy.end_trial(rec, "trial")
        ejected = [r for r in fleet if r.standing is EJECTED]
        assert len(ejected) <= max_ejected(n, percent)
        if n >= 2 and percent < 100:
            assert len(ejected) < n
        for r in ejected:
            assert r.times_ejected >= 1
            assert r.trial is None
            assert not r.routable
            assert r.ejected_until_s - clock.now_s <= 35
        assert all(r.trial is None for r in fleet if r.standing is not PROBATION)


# ---- a variant applying the policy --------------------------------------------------------


def _state(
    outlier: dict[str, object] | None = None,
) -> tuple[GatewayState, FakeRouterFactory, Clock]:
    instances = [{"id": i, "url": f"http://127.0.0.1:{k + 1}"} for k, i in enumerate("abc")]
    spec = {
        "health": {"outlier": outlier or {"consecutive_failures": 2, "base_ejection_time_s": 10}},
        "endpoints": [{"name": "e", "variants": [{"name": "v", "instances": instances}]}],
    }
    factory = FakeRouterFactory()
    clock = Clock()
    doc = {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}
    state = GatewayState(parse_gateway_config(doc), factory, GatewayMetrics(), clock=clock)
    return state, factory, clock


def test_variant_ejects_probes_do_not_readmit_probation_trial_readmits() -> None:
    state, factory, clock = _state()
    variant = state.default_endpoint().variant("v")
    a = variant.instances["a"]
    assert variant.passive_failure(a, TIMEOUT) is Change.NONE
    assert variant.passive_failure(a, TIMEOUT) is Change.EJECTED
    assert factory.routers[-1].instance_sets[-1] == ["b", "c"]  # its cache state is purged
    assert variant.snapshot().ids() == ("b", "c")
    for _ in range(5):  # its /health answers all along: nothing changes
        variant.record_success(a, 2)
    assert variant.snapshot().ids() == ("b", "c")
    assert variant.describe()["instances"][0]["outlier"]["standing"] == "ejected"
    rendered = state.metrics.render().decode()
    assert 'warmfleet_gateway_instance_ejected{endpoint="e",instance_id="a",variant="v"} 1.0' in (
        rendered
    )

    clock.now_s += 10  # the next request's snapshot ends the ejection: probation
    assert variant.snapshot().ids() == ("a", "b", "c")
    trial = object()
    variant.begin_trial(a, trial)
    assert variant.snapshot().ids() == ("b", "c")  # one request at a time
    assert [i.instance_id for i in variant.healthy] == ["a", "b", "c"]  # the router keeps it
    assert variant.passive_success(a) is Change.READMITTED
    assert variant.snapshot().ids() == ("a", "b", "c")
    variant.end_trial(a, trial)  # the verdict came first: nothing to undo
    assert variant.snapshot().ids() == ("a", "b", "c")


def test_variant_guard_and_switching_passive_ejection_off() -> None:
    state, _, _ = _state({"consecutive_failures": 1, "max_ejection_percent": 50})
    variant = state.default_endpoint().variant("v")
    a, b = variant.instances["a"], variant.instances["b"]
    assert variant.passive_failure(a, TIMEOUT) is Change.EJECTED
    assert variant.passive_failure(b, TIMEOUT) is Change.OVERFLOW  # 1 of 3 at 50 %
    rendered = state.metrics.render().decode()
    assert "warmfleet_gateway_ejections_overflow_total" in rendered
    config = state.config.model_dump()
    config["spec"]["health"]["passive_ejection"] = False
    state.apply(parse_gateway_config(config))
    assert variant.snapshot().ids() == ("a", "b", "c")
    assert variant.passive_failure(b, FailureCause.CONNECT) is Change.NONE  # off: counted only


def test_prompt_avoidance_expires_and_is_bounded() -> None:
    avoid = PromptAvoidance(max_entries=2)
    avoid.record(1, "a", until_s=10.0)
    assert avoid.avoid(1, now_s=9.9) == "a"
    assert avoid.avoid(1, now_s=10.0) is None
    assert avoid.entries == {}  # an expired entry is dropped when read
    for prompt in (1, 2, 3):
        avoid.record(prompt, "a", until_s=10.0)
    assert list(avoid.entries) == [2, 3]  # the oldest went first


def test_variant_avoids_a_failed_prompt_only_while_another_instance_is_routable() -> None:
    state, _, clock = _state({"consecutive_failures": 5, "base_ejection_time_s": 10})
    variant = state.default_endpoint().variant("v")
    a = variant.instances["a"]
    variant.passive_failure(a, TIMEOUT, prompt=42)
    assert variant.avoided(42) == {"a"}
    assert variant.avoided(43) is None
    variant.set_instances([variant.spec_of(a)])  # a alone: excluding it would leave nothing
    assert variant.avoided(42) is None
    clock.now_s += 10
    assert variant.avoidance.avoid(42, clock()) is None
