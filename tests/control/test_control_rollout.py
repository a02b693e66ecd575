"""Rolling rollouts across revisions (``rollout: {type: Rolling}``): Kubernetes' RollingUpdate
bounds hold at every step, the rollout finishes, and BlueGreen stays the default."""

from __future__ import annotations

from dataclasses import replace

import pytest
from control_support import endpoint, nodes, run, spec
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from warmfleet.api import names
from warmfleet.api.resources import (
    AutoscalingSpec,
    InferenceEndpointSpec,
    ProductionVariant,
    RolloutPolicy,
)
from warmfleet.control.actions import (
    ApplyDeployment,
    DeleteDeployment,
    ScaleDeployment,
)
from warmfleet.control.autoscaler import AutoscalerState
from warmfleet.control.load import autoscale
from warmfleet.control.observed import ObservedDeployment, ObservedReplica
from warmfleet.control.reconciler import deployment_plan, plan
from warmfleet.control.rollout import bounds, rolling_step
from warmfleet.control.world import World
from warmfleet.operator import render


def rolling(surge: int | str | None, unavailable: int | str | None) -> RolloutPolicy:
    return RolloutPolicy(type="Rolling", max_surge=surge, max_unavailable=unavailable)


def with_rollout(s: InferenceEndpointSpec, policy: RolloutPolicy) -> InferenceEndpointSpec:
    return s.model_copy(update={"rollout": policy})


def test_bounds_round_like_kubernetes() -> None:
    assert bounds(rolling(None, None), 10) == (3, 2)  # 25 %: surge up, unavailable down
    assert bounds(rolling("50%", "50%"), 3) == (2, 1)
    assert bounds(rolling(0, "10%"), 4) == (0, 1)  # both 0 after rounding: one may go
    assert bounds(rolling(2, 0), 4) == (2, 0)
    assert bounds(RolloutPolicy(), 4) == (1, 0)  # BlueGreen's in-place update strategy


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"type": "Rolling", "maxSurge": 0, "maxUnavailable": 0}, "both be 0"),
        ({"type": "Rolling", "maxSurge": "0%", "maxUnavailable": 0}, "both be 0"),
        ({"type": "Rolling", "maxSurge": -1}, "maxSurge"),
        ({"type": "Rolling", "maxUnavailable": "150%"}, "over 100%"),
        ({"type": "Rolling", "maxSurge": "ten"}, "maxSurge"),
        ({"type": "BlueGreen", "maxSurge": 1}, "only apply to type Rolling"),
        ({"type": "Canary"}, "type"),
    ],
)
def test_invalid_rollouts_are_rejected_with_the_field_named(
    doc: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        RolloutPolicy.model_validate(doc)


def _dep(name: str, replicas: int, ready: int, rev: str = "old") -> ObservedDeployment:
    pods = tuple(
        ObservedReplica(f"{name}-{i}", "n0", 0.0, 1.0 if i < ready else None, True)
        for i in range(replicas)
    )
    return ObservedDeployment(name, "e", "main", rev, replicas, None, None, pods=pods)


def test_rolling_step_without_surge_frees_a_slot_first() -> None:
    policy = rolling(0, 1)
    step = rolling_step(4, policy, None, [_dep("a", 4, 4)])
    assert (step.new_replicas, step.old_replicas) == (0, {"a": 4})  # nothing before the new one
    step = rolling_step(4, policy, _dep("b", 0, 0, "new"), [_dep("a", 4, 4)])
    assert (step.new_replicas, step.old_replicas) == (0, {"a": 3})
    step = rolling_step(4, policy, _dep("b", 0, 0, "new"), [_dep("a", 3, 3)])
    assert (step.new_replicas, step.old_replicas) == (1, {"a": 3})  # the freed slot
    step = rolling_step(4, policy, _dep("b", 1, 0, "new"), [_dep("a", 3, 3)])
    assert step.old_replicas == {"a": 3}, "the new replica is not ready: nothing else may go"
    step = rolling_step(4, policy, _dep("b", 1, 1, "new"), [_dep("a", 3, 3)])
    assert step.old_replicas == {"a": 2}


def test_old_replicas_that_are_not_ready_go_first() -> None:
    # As Kubernetes: a replica that is not ready is no availability to keep, but it may become
    # ready, so the cut is the same (declared - floor); the ReplicaSet drops unready ones first.
    step = rolling_step(4, rolling(0, 1), _dep("b", 0, 0, "new"), [_dep("a", 4, 3)])
    assert step.old_replicas == {"a": 3}
    world = World(nodes(1))
    world.deployments["a"] = _dep("a", 4, 3)
    world.plans["a"] = ApplyDeployment(replace(deployment_plan(endpoint("e"), spec().variants[0])))
    world.apply([ScaleDeployment("a", 3)], 0.0)
    world.schedule(0.0)
    assert world.deployments["a"].ready_replicas == 3, "the unready replica went"
    # two old Deployments (a rollover during a rollover): the least ready shrinks first
    step = rolling_step(
        4, rolling(0, 1), _dep("c", 0, 0, "new"), [_dep("a", 2, 2), _dep("b", 2, 0)]
    )
    assert step.old_replicas == {"a": 2, "b": 1}


def _ready_after(world: World, now: float, delay_s: float) -> None:
    """Pods become ready ``delay_s`` after they started (weights load, warm-up)."""
    for name, dep in list(world.deployments.items()):
        pods = tuple(
            p if p.ready or now - p.started_s < delay_s else replace(p, ready_s=now)
            for p in dep.pods
        )
        world.deployments[name] = replace(dep, pods=pods)


def _roll(policy: RolloutPolicy, replicas: int, delay_rounds: int) -> list[tuple[int, int]]:
    """Roll an endpoint from v1 to v2; (declared replicas, ready replicas) after every step."""
    world = World(nodes(3))
    world.put_endpoint(endpoint("e", with_rollout(spec(replicas=replicas), policy)))
    now = run(world)
    world.put_endpoint(endpoint("e", with_rollout(spec(revision="v2", replicas=replicas), policy)))
    seen: list[tuple[int, int]] = []
    for _ in range(200):
        now += 10.0
        world.agents_step()
        world.schedule(now)
        _ready_after(world, now, 10.0 * delay_rounds)
        deps = world.deployments.values()
        seen.append((sum(d.replicas for d in deps), sum(d.ready_replicas for d in deps)))
        actions = plan(world.desired(), world.observed(now))
        if not actions and len(world.deployments) == 1 and seen[-1] == (replicas, replicas):
            break  # (an empty plan alone may just wait for replicas to become ready)
        world.apply(actions, now)
    else:
        raise AssertionError("the rollout did not finish")
    new_rev = names.revision(spec(revision="v2", replicas=replicas))
    (dep,) = world.deployments.values()
    assert dep.revision == new_rev
    assert dep.replicas == dep.ready_replicas == replicas
    return seen


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.integers(1, 6),
    surge=st.sampled_from([0, 1, 2, "25%", "50%", "100%"]),
    unavailable=st.sampled_from([0, 1, 2, "25%", "50%"]),
    delay_rounds=st.integers(0, 3),
)
def test_a_rolling_rollout_stays_within_its_bounds_and_finishes(
    replicas: int, surge: int | str, unavailable: int | str, delay_rounds: int
) -> None:
    if surge in (0, "0%") and unavailable in (0, "0%"):
        return
    policy = rolling(surge, unavailable)
    max_surge, max_unavailable = bounds(policy, replicas)
    for declared, ready in _roll(policy, replicas, delay_rounds):
        assert declared <= replicas + max_surge
        assert ready >= replicas - max_unavailable


def test_no_spare_capacity_is_needed_with_max_surge_0() -> None:
    seen = _roll(rolling(0, 1), replicas=4, delay_rounds=2)
    assert max(declared for declared, _ in seen) == 4
    assert min(ready for _, ready in seen) == 3


def test_blue_green_stays_the_default_and_doubles_the_replicas() -> None:
    assert spec().rollout == RolloutPolicy()
    seen = _roll(RolloutPolicy(), replicas=4, delay_rounds=2)
    assert max(declared for declared, _ in seen) == 8
    assert min(ready for _, ready in seen) == 4


def test_the_old_revision_is_scaled_then_deleted() -> None:
    world = World(nodes(3))
    policy = rolling(1, 0)
    world.put_endpoint(endpoint("e", with_rollout(spec(replicas=3), policy)))
    now = run(world)
    old = next(iter(world.deployments))
    world.put_endpoint(endpoint("e", with_rollout(spec(revision="v2", replicas=3), policy)))
    applied: list[object] = []
    run(world, start_s=now, on_plan=lambda _w, actions: applied.extend(actions))
    scales = [a.replicas for a in applied if isinstance(a, ScaleDeployment) and a.name == old]
    assert scales == [2, 1]
    assert any(isinstance(a, DeleteDeployment) and a.name == old for a in applied)
    assert old not in world.deployments


def test_the_rollout_bounds_are_the_deployments_update_strategy() -> None:
    """In-place changes (not a new revision) are rolled by Kubernetes with the same bounds, and
    changing only the bounds re-applies the Deployment without a new spec hash (no restart)."""
    world = World(nodes(3))
    world.put_endpoint(endpoint("e", spec()))
    now = run(world)
    (name,) = world.deployments
    plan_ = world.plans[name].plan
    strategy = render.deployment(plan_, "default", "uid")["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    world.put_endpoint(endpoint("e", with_rollout(spec(), rolling(0, "50%"))))
    actions = plan(world.desired(), world.observed(now))
    (apply,) = [a for a in actions if isinstance(a, ApplyDeployment)]
    assert apply.plan.name == name
    assert apply.plan.spec_hash() == plan_.spec_hash()
    strategy = render.deployment(apply.plan, "default", "uid")["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": "50%"}
    assert deployment_plan(world.endpoints["e"], world.endpoints["e"].spec.variants[0]) == (
        apply.plan
    )


@pytest.mark.parametrize(("surge", "unavailable", "floor"), [(0, 1, 9), ("25%", "25%", 8)])
def test_an_autoscaled_variant_keeps_its_capacity_through_a_rolling_rollout(
    surge: int | str, unavailable: int | str, floor: int
) -> None:
    """Load that needs 10 replicas, steady through the rollover: the decision stays 10 and ready
    replicas never fall below what the policy allows. The autoscaler used to start from the new
    revision's partial step (0-3 replicas), scale up from there under its step limit, and the
    rolling step then shrank the old revision to match (10 -> 3 ready with 0/1)."""

    def endpoint_spec(rev: str) -> InferenceEndpointSpec:
        autoscaling = AutoscalingSpec(enabled=True, min_replicas=1, max_replicas=20)
        variant = ProductionVariant(name="main", replicas=10, autoscaling=autoscaling)
        base = spec(revision=rev, images=False, replicas=10)
        update = {"variants": (variant,), "rollout": rolling(surge, unavailable)}
        return base.model_copy(update=update)

    world = World(nodes(12))
    world.put_endpoint(
        replace(endpoint("e", endpoint_spec("v1")), autoscaled_replicas={"main": 10})
    )
    states: dict[tuple[str, str], AutoscalerState] = {}
    ready: list[int] = []
    for step in range(40):
        now_s = step * 10.0
        if step == 8:
            previous = world.endpoints["e"].autoscaled_replicas
            world.put_endpoint(
                replace(endpoint("e", endpoint_spec("v2")), autoscaled_replicas=previous)
            )
        world.agents_step()
        world.schedule(now_s)
        world.mark_ready(now_s)
        load = {("e", "main"): 160.0}  # 10 replicas' worth at the default target
        decisions, states = autoscale(
            world.desired(), world.observed(now_s).deployments, load, now_s, states
        )
        assert decisions["e"]["main"] == 10
        world.endpoints["e"] = replace(world.endpoints["e"], autoscaled_replicas=decisions["e"])
        world.apply(plan(world.desired(), world.observed(now_s)), now_s)
        ready.append(sum(d.ready_replicas for d in world.deployments.values()))
    assert min(ready[9:]) >= floor
    (final,) = world.deployments.values()
    assert final.revision == names.revision(endpoint_spec("v2"))
    assert final.ready_replicas == 10
