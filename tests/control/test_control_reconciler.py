"""Scenario tests of the reconciler on the in-memory world, one spec: the weights gate (all,
minReady, a timeout), images that never block, an image cache shared by two endpoints, deletion
collecting everything, an unhealthy cache and a new node, a lost node, a plan replayed, a failed
cache, and an endpoint the backend fails to list keeping its Deployments' caches."""

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
