"""Scenario tests of the reconciler on the in-memory world, a spec changing under a running
endpoint: a new revision rolls over in order with no downtime (and stays Available throughout),
a routing change leaves the engines alone, turning the weights cache on goes through the gate,
a presigned source signed again updates the cache without a rollover, and moving to other nodes
waits for the weights there."""

from __future__ import annotations

from dataclasses import replace

from control_support import DOWNLOADING, READY, Trace, endpoint, nodes, run, spec

from warmfleet.api import names
from warmfleet.api.resources import EndpointPhase
from warmfleet.control.actions import (
    ApplyDeployment,
    ApplyModelCache,
    DeleteDeployment,
    DeleteModelCache,
)
from warmfleet.control.observed import NodeCacheReport, ObservedNode
from warmfleet.control.reconciler import plan
from warmfleet.control.world import World
from warmfleet.routing.config import RoutingConfig


def test_rollover_order_and_zero_downtime() -> None:
    world = World(nodes(3))
    world.put_endpoint(endpoint("e"))
    end = run(world)
    old_cache = names.model_cache_name("e", spec())
    old_deploys = set(world.deployments)
    world.put_endpoint(endpoint("e", spec(revision="v2")))
    new_cache = names.model_cache_name("e", spec(revision="v2"))
    trace = Trace()
    ready_seen: list[int] = []

    def check(w: World, _actions: object) -> None:
        ready_seen.append(sum(d.ready_replicas for d in w.deployments.values()))

    run(world, start_s=end, trace=trace, on_plan=check)
    events = trace.all()

    def first(pred: object) -> int:
        return next(i for i, (_, a) in enumerate(events) if pred(a))  # type: ignore[operator]

    new_cache_at = first(lambda a: isinstance(a, ApplyModelCache) and a.name == new_cache)
    new_deploy_at = first(
        lambda a: isinstance(a, ApplyDeployment) and a.plan.model_cache == new_cache
    )
    old_delete_at = first(lambda a: isinstance(a, DeleteDeployment) and a.name in old_deploys)
    old_cache_gone_at = first(lambda a: isinstance(a, DeleteModelCache) and a.name == old_cache)
    assert new_cache_at < new_deploy_at < old_delete_at < old_cache_gone_at
    assert min(ready_seen) >= 2, "the endpoint never lost its ready replicas"
    assert set(world.model_caches) == {new_cache}
    assert all(old_cache not in n.weights for n in world.nodes.values())


def test_available_counts_serving_replicas_of_every_revision_during_a_rollover() -> None:
    """Like a Deployment's ``Available`` (minimum availability): the old revision's ready
    replicas keep the endpoint available while the new one is gated and rolled out; the
    phase and ``readyReplicas`` (the current revision's) still show the rollover's progress."""
    world = World(nodes(3))
    world.put_endpoint(endpoint("e"))
    end = run(world)
    world.put_endpoint(endpoint("e", spec(revision="v2")))
    seen: list[tuple[EndpointPhase, int, str]] = []

    def check(w: World, _actions: object) -> None:
        status = w.endpoints["e"].status
        assert status is not None
        available = next(c for c in status.conditions if c.type == "Available")
        seen.append((status.phase, status.ready_replicas, available.status))

    run(world, start_s=end, on_plan=check)
    assert all(avail == "True" for _, _, avail in seen), seen
    phases = {phase for phase, _, _ in seen}
    assert {EndpointPhase.GATED, EndpointPhase.ROLLING} <= phases
    assert any(ready < 2 for phase, ready, _ in seen if phase != EndpointPhase.READY)
    assert seen[-1][:2] == (EndpointPhase.READY, 2)


def test_a_routing_change_leaves_the_engines_alone() -> None:
    """Routing is the gateway's (read from the InferenceEndpoint): changing a variant's strategy
    must not re-apply its Deployment nor restart a replica (their KV caches are the point)."""
    world = World(nodes(3))
    world.put_endpoint(endpoint("e"))
    end = run(world)
    pods = {name: d.pods for name, d in world.deployments.items()}
    assert all(pods.values())
    changed = spec()
    variant = changed.variants[0]
    routing = RoutingConfig.model_validate({"strategy": {"type": "least_outstanding_requests"}})
    assert variant.routing != routing
    variants = [variant.model_copy(update={"routing": routing})]
    changed = changed.model_copy(update={"variants": variants})
    world.put_endpoint(endpoint("e", changed))
    trace = Trace()
    run(world, start_s=end, trace=trace)
    assert not [a for _, a in trace.all() if isinstance(a, ApplyDeployment | DeleteDeployment)]
    assert {name: d.pods for name, d in world.deployments.items()} == pods


def test_enabling_the_weights_cache_switches_running_replicas_only_through_the_gate() -> None:
    """The revision does not change when caching is turned on, so the running Deployment is
    updated in place: it must keep loading from the origin (and keep scaling) until the new
    cache passes the gate, instead of restarting every replica cold onto an empty cache."""
    world = World(nodes(2))
    world.put_endpoint(endpoint("e", spec(weights=False)))
    end = run(world)
    (name,) = world.deployments
    world.put_endpoint(endpoint("e", spec(weights=True, replicas=3)))
    cache = names.model_cache_name("e", spec())
    first = plan(world.desired(), world.observed(end))
    applied = [a.plan for a in first if isinstance(a, ApplyDeployment)]
    assert [(p.name, p.model_cache, p.replicas) for p in applied] == [(name, None, 3)]
    world.apply(first, end)
    world.agents_step(lambda node, cache: DOWNLOADING)
    waiting = plan(world.desired(), world.observed(end + 1))
    assert not any(isinstance(a, ApplyDeployment) for a in waiting)
    world.apply(waiting, end + 1)
    assert world.deployments[name].ready_replicas == 2  # still serving, not restarted
    status = world.endpoints["e"].status
    assert status is not None
    assert status.phase == EndpointPhase.GATED
    gate = next(c for c in status.conditions if c.type == "WeightsGateOpen")
    assert (gate.status, gate.reason) == ("False", "WaitingForCache")
    world.schedule(end + 1)
    world.mark_ready(end + 1)
    for node in list(world.nodes.values()):  # the downloads finish
        world.nodes[node.name] = replace(node, weights={cache: READY})
    run(world, start_s=end + 2)
    (dep,) = world.deployments.values()
    assert dep.model_cache == cache
    assert [p.prepared for p in dep.pods] == [True, True, True]
    status = world.endpoints["e"].status
    assert status is not None
    assert status.phase == EndpointPhase.READY


def test_signing_a_presigned_source_again_updates_the_cache_without_a_rollover() -> None:
    """A presigned URL's signature changes each time it is issued; the object does not. The
    cache and the Deployment keep their names (no new cache, no rollover); the ModelCache is
    updated in place so new downloads use the fresh signature."""
    signed = (
        "https://b.s3.amazonaws.com/w.bin?X-Amz-Date={d}&X-Amz-Expires=3600&X-Amz-Signature={d}"
    )
    first, second = signed.format(d="1"), signed.format(d="2")
    world = World(nodes(3))
    world.put_endpoint(endpoint("e", spec(uri=first)))
    end = run(world)
    cache = names.model_cache_name("e", spec(uri=first))
    assert cache == names.model_cache_name("e", spec(uri=second))
    deployments = set(world.deployments)
    world.put_endpoint(endpoint("e", spec(uri=second)))
    trace = Trace()
    run(world, start_s=end, trace=trace)
    assert set(world.deployments) == deployments
    assert set(world.model_caches) == {cache}
    assert world.model_caches[cache].spec.model_source.uri == second
    # and the nodes are told the new signature (they compared cache names only before)
    told = [t for node in world.nodes.values() for t in node.told]
    assert told
    assert {t[1] for t in told} == {second}
    assert not any(isinstance(a, DeleteModelCache | DeleteDeployment) for _, a in trace.all())
    # A different object (another path) is a new model: a new cache.
    assert names.model_cache_name("e", spec(uri=signed.replace("w.bin", "v.bin"))) != cache


def test_moving_to_other_nodes_waits_for_the_weights_there() -> None:
    """A new node selector is a new revision: the Deployment on the new nodes is created only
    once the weights are on them (the gate), and the old one serves until it is ready. It used
    to be an in-place update that restarted every replica cold on nodes without the cache."""
    pool = [ObservedNode(f"n{i}", labels={"zone": "a" if i < 2 else "b"}) for i in range(4)]
    world = World(pool)
    world.put_endpoint(endpoint("e", spec(selector={"zone": "a"})))
    end = run(world)
    (old,) = world.deployments
    old_cache = names.model_cache_name("e", spec(selector={"zone": "a"}))
    cache = names.model_cache_name("e", spec(selector={"zone": "b"}))
    assert cache != old_cache  # other nodes, another cache: the old nodes keep theirs
    world.put_endpoint(endpoint("e", spec(selector={"zone": "b"})))

    def slow(node: str, name: str) -> NodeCacheReport:
        return DOWNLOADING if node in ("n2", "n3") and name == cache else READY

    for step in range(3):  # n2 and n3 are still downloading: the gate holds
        world.agents_step(slow)
        world.schedule(end + step)
        world.mark_ready(end + step)
        actions = plan(world.desired(), world.observed(end + step))
        assert not any(isinstance(a, ApplyDeployment) and a.plan.name != old for a in actions)
        assert not any(isinstance(a, DeleteDeployment) for a in actions)
        world.apply(actions, end + step)
        for name in ("n0", "n1"):  # the serving revision's nodes keep their weights
            assert world.nodes[name].assigned == {old_cache}
            assert world.nodes[name].labels.get(names.weights_label(old_cache)) == "ready"
    assert world.deployments[old].ready_replicas == 2
    for name in ("n2", "n3"):  # the downloads finish
        world.nodes[name] = replace(world.nodes[name], weights={cache: READY})
    run(world, start_s=end + 3)
    (new,) = world.deployments.values()
    assert new.name != old
    assert {p.node for p in new.pods} <= {"n2", "n3"}
    assert all(p.prepared for p in new.pods)
    # No selector: the hash is the one revisions had before the selector counted, so existing
    # endpoints keep their Deployment names.
    plain = spec()
    weights = plain.model_cache_config.weights_cache
    before = names.short_hash(
        plain.model_source.uri, plain.model_source.revision, plain.image, weights.host_path
    )
    assert names.revision(plain) == before
