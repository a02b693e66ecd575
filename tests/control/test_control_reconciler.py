"""Scenario tests of the reconciler on the in-memory world."""

from __future__ import annotations

from dataclasses import replace

from control_support import DOWNLOADING, FAILED, READY, Trace, endpoint, nodes, run, spec

from warmfleet.api import names
from warmfleet.api.resources import EndpointPhase, GatePolicy
from warmfleet.control.actions import (
    ApplyDeployment,
    ApplyImageCache,
    ApplyModelCache,
    AssignNodeCaches,
    DeleteDeployment,
    DeleteImageCache,
    DeleteModelCache,
    ReleaseEndpoint,
    SetNodeLabels,
)
from warmfleet.control.observed import NodeCacheReport, NodeCacheState, ObservedNode
from warmfleet.control.reconciler import plan
from warmfleet.control.world import World
from warmfleet.routing.config import RoutingConfig


def test_create_gates_on_all_nodes_then_deploys() -> None:
    world = World(nodes(3))
    world.put_endpoint(endpoint("llama"))
    first = plan(world.desired(), world.observed(0.0))
    assert any(isinstance(a, ApplyModelCache) for a in first)
    assert not any(isinstance(a, ApplyDeployment) for a in first)
    world.apply(first, 0.0)
    # two nodes ready, one still downloading: the 'all' gate stays closed
    world.agents_step(lambda node, cache: DOWNLOADING if node == "n2" else READY)
    second = plan(world.desired(), world.observed(10.0))
    assert not any(isinstance(a, ApplyDeployment) for a in second)
    world.apply(second, 10.0)
    assert world.endpoints["llama"].status is not None
    assert world.endpoints["llama"].status.phase == EndpointPhase.GATED
    node = world.nodes["n2"]
    cache = next(iter(node.assigned))
    world.nodes["n2"] = replace(node, weights={cache: READY})
    third = plan(world.desired(), world.observed(20.0))
    deploys = [a for a in third if isinstance(a, ApplyDeployment)]
    assert len(deploys) == 1
    assert deploys[0].plan.preferences[0].label == names.weights_label(cache)
    run(world, start_s=20.0)
    status = world.endpoints["llama"].status
    assert status is not None
    assert status.phase == EndpointPhase.READY
    assert status.unprepared_replica_share == 0.0
    assert all(r.prepared for r in status.replica_status)


def test_min_ready_gate_and_timeout() -> None:
    gate = GatePolicy(mode="minReady", min_ready_percent=50.0)
    world = World(nodes(4))
    world.put_endpoint(endpoint("e", spec(gate=gate)))
    world.apply(plan(world.desired(), world.observed(0.0)), 0.0)
    world.agents_step(lambda node, cache: READY if node in {"n0", "n1"} else DOWNLOADING)
    assert any(isinstance(a, ApplyDeployment) for a in plan(world.desired(), world.observed(1.0)))

    timed = GatePolicy(mode="all", timeout_s=600.0)
    world = World(nodes(2))
    world.put_endpoint(endpoint("e", spec(gate=timed)))
    world.apply(plan(world.desired(), world.observed(0.0)), 0.0)
    world.agents_step(lambda node, cache: FAILED)
    assert not any(
        isinstance(a, ApplyDeployment) for a in plan(world.desired(), world.observed(599.0))
    )
    after = plan(world.desired(), world.observed(600.0))
    assert any(isinstance(a, ApplyDeployment) for a in after)
    world.apply(after, 600.0)
    world.schedule(600.0)
    world.mark_ready(700.0)
    world.apply(plan(world.desired(), world.observed(700.0)), 700.0)
    status = world.endpoints["e"].status
    assert status is not None
    assert status.unprepared_replica_share == 1.0  # every replica loads from the origin
    assert [r.time_to_ready_s for r in status.replica_status] == [100.0, 100.0]


def test_images_never_block() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("e"))

    def fill(node: str, cache: str) -> NodeCacheReport:
        return FAILED if cache.startswith("img-") else READY

    run(world, fill=fill)
    assert world.deployments, "image pull failures must not block the deployment"
    assert not any(
        k.startswith(names.LABEL_PREFIX_IMAGE) for n in world.nodes.values() for k in n.labels
    )


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


def test_shared_image_cache_refcount() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("a", spec(uri="s3://a")))
    world.put_endpoint(endpoint("b", spec(uri="s3://b")))
    end = run(world)
    assert len(world.image_caches) == 1
    (image,) = world.image_caches.values()
    assert [p.name for p in image.spec.parent_references] == ["a", "b"]
    world.delete_endpoint("a")
    end = run(world, start_s=end)
    (image,) = world.image_caches.values()
    assert [p.name for p in image.spec.parent_references] == ["b"]
    assert image.status is not None
    assert image.status.references == 1
    world.delete_endpoint("b")
    run(world, start_s=end)
    assert world.image_caches == {}
    assert world.released == ["a", "b"]


def test_delete_collects_everything() -> None:
    world = World(nodes(3))
    world.put_endpoint(endpoint("e"))
    end = run(world)
    world.delete_endpoint("e")
    trace = Trace()
    run(world, start_s=end, trace=trace)
    kinds = [type(a) for _, a in trace.all()]
    assert DeleteDeployment in kinds
    assert DeleteModelCache in kinds
    assert DeleteImageCache in kinds
    assert ReleaseEndpoint in kinds
    assert world.deployments == {}
    assert world.model_caches == {}
    assert world.image_caches == {}
    for node in world.nodes.values():
        assert not node.assigned
        assert not node.weights
        assert not node.images
        assert not any(names.is_managed_label(k) for k in node.labels)


def test_unhealthy_cache_loses_its_label_and_new_node_is_warmed() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("e"))
    end = run(world)
    cache = names.model_cache_name("e", spec())
    label = names.weights_label(cache)
    assert all(n.labels.get(label) == "ready" for n in world.nodes.values())
    sick = world.nodes["n1"]
    world.nodes["n1"] = replace(sick, weights={cache: replace(READY, healthy=False)})
    actions = plan(world.desired(), world.observed(end))
    assert SetNodeLabels("n1", {}, (label,)) in actions
    status_of = world.model_caches[cache]
    world.apply(actions, end)
    assert world.model_caches[cache].status != status_of.status
    status = world.model_caches[cache].status
    assert status is not None
    assert any(p.state == "Unhealthy" for p in status.nodes)

    world.nodes["n9"] = ObservedNode("n9", labels={"pool": "gpu"})
    actions = plan(world.desired(), world.observed(end + 1))
    assigned = [a for a in actions if isinstance(a, AssignNodeCaches) and a.node == "n9"]
    assert assigned
    assert assigned[0].caches[0].cache == cache
    world.apply(actions, end + 1)
    world.agents_step()
    labels = [
        a for a in plan(world.desired(), world.observed(end + 2)) if isinstance(a, SetNodeLabels)
    ]
    assert (
        SetNodeLabels(
            "n9", {label: "ready", names.image_label(next(iter(world.image_caches))): "ready"}
        )
        in labels
    )


def test_node_loss_reschedules_on_a_warm_node() -> None:
    world = World(nodes(3))
    world.put_endpoint(endpoint("e", spec(replicas=2)))
    end = run(world)
    (dep,) = world.deployments.values()
    lost = dep.pods[0].node
    world.nodes[lost] = replace(world.nodes[lost], ready=False)
    run(world, start_s=end)
    (dep,) = world.deployments.values()
    assert all(p.node != lost for p in dep.pods)
    assert all(p.prepared for p in dep.pods)
    assert not any(names.is_managed_label(k) for k in world.nodes[lost].labels)


def test_replaying_a_plan_is_harmless() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("e"))
    actions = plan(world.desired(), world.observed(0.0))
    world.apply(actions, 0.0)
    once = world.observed(0.0)
    world.apply(actions, 0.0)
    assert world.observed(0.0) == once
    assert not any(isinstance(a, ApplyImageCache) for a in plan(world.desired(), once))


def test_failed_cache_state() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("e", spec(images=False)))
    world.apply(plan(world.desired(), world.observed(0.0)), 0.0)
    world.agents_step(lambda node, cache: FAILED if node == "n0" else READY)
    world.apply(plan(world.desired(), world.observed(1.0)), 1.0)
    (cache,) = world.model_caches.values()
    assert cache.status is not None
    assert cache.status.state.value == "PartiallyReady"
    assert [c.type for c in cache.status.conditions] == ["Ready", "NodeFailures"]
    world.agents_step()
    assert world.nodes["n0"].weights[cache.name].state == NodeCacheState.FAILED


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


def test_an_unlisted_endpoint_keeps_the_caches_its_deployments_load_from() -> None:
    """A backend may fail to list an endpoint (the operator skips one whose spec no longer
    validates) while its Deployments still run. Only a deleting endpoint gives its caches up:
    the caches and image reference of such orphaned Deployments stay until they are gone."""
    world = World(nodes(2))
    world.put_endpoint(endpoint("a", spec(uri="s3://a")))
    world.put_endpoint(endpoint("b", spec(uri="s3://b")))
    end = run(world)
    caches, images = dict(world.model_caches), dict(world.image_caches)
    labels = {n.name: dict(n.labels) for n in world.nodes.values()}
    hidden = world.endpoints.pop("a")
    run(world, start_s=end)
    assert set(world.model_caches) == set(caches)
    assert {n: c.spec for n, c in world.image_caches.items()} == {
        n: c.spec for n, c in images.items()
    }
    assert {n.name: dict(n.labels) for n in world.nodes.values()} == labels
    assert all(n.assigned == set(caches) for n in world.nodes.values())
    world.endpoints["a"] = replace(hidden, deleting=True)  # listed again, and deleted
    run(world, start_s=end + 1000)
    assert set(world.model_caches) == {names.model_cache_name("b", spec(uri="s3://b"))}
    (image,) = world.image_caches.values()
    assert [p.name for p in image.spec.parent_references] == ["b"]


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
    cache = names.model_cache_name("e", spec(selector={"zone": "b"}))
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
