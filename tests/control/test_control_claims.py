"""Names two endpoints both derive (endpoint ``chat`` variant ``prod-a`` and endpoint
``chat-prod`` variant ``a`` name the same Deployment): the first to hold one keeps it, the
other reports a ``NameConflict`` condition, keeps serving what it has, and takes the name once
it is free; a backend's other objects (Services, ModelCaches, objects it does not manage)
count too."""

from __future__ import annotations

from dataclasses import replace

from control_support import endpoint, nodes, run, spec

from warmfleet.api import names
from warmfleet.api.resources import (
    Condition,
    ImageCacheSpec,
    InferenceEndpointSpec,
    ModelCacheSpec,
    ModelSource,
    ProductionVariant,
)
from warmfleet.control.actions import (
    ApplyDeployment,
    ApplyImageCache,
    ApplyImagePuller,
    ApplyModelCache,
    AssignNodeCaches,
    DeleteDeployment,
    DeleteImageCache,
    DeleteImagePuller,
    DeleteModelCache,
    ReleaseEndpoint,
    ScaleDeployment,
    UpdateEndpointStatus,
    UpdateImageCacheStatus,
    UpdateModelCacheStatus,
)
from warmfleet.control.claims import (
    CONDITION,
    IMAGE_CACHE,
    MODEL_CACHE,
    PULLER,
    NameConflict,
    name_conflicts,
)
from warmfleet.control.observed import (
    DesiredEndpoint,
    HeldName,
    ObservedImageCache,
    ObservedModelCache,
    ObservedState,
)
from warmfleet.control.reconciler import plan
from warmfleet.control.world import World

SHARED = "chat-prod-a"  # chat + prod-a, and chat-prod + a


def _variant(name: str, uri: str = "s3://models/llama") -> InferenceEndpointSpec:
    variants = (ProductionVariant(name=name, replicas=1),)
    return spec(uri=uri).model_copy(update={"variants": variants})


def _conflict(world: World, name: str) -> Condition | None:
    status = world.endpoints[name].status
    assert status is not None
    return next((c for c in status.conditions if c.type == CONDITION), None)


def test_the_first_endpoint_by_name_gets_a_contested_deployment_the_other_waits() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("chat-prod", _variant("a")))
    world.put_endpoint(endpoint("chat", _variant("prod-a")))
    end = run(world)
    (dep,) = world.deployments.values()
    assert dep.name == f"{SHARED}-{names.revision(_variant('a'))}"
    assert (dep.endpoint, dep.variant) == ("chat", "prod-a")
    assert _conflict(world, "chat") is None
    conflict = _conflict(world, "chat-prod")
    assert conflict is not None
    assert conflict.status == "True"
    assert f"Deployment {dep.name} belongs to InferenceEndpoint chat" in conflict.message

    world.delete_endpoint("chat")  # the name is free once chat's Deployment is gone
    run(world, start_s=end)
    (dep,) = world.deployments.values()
    assert (dep.endpoint, dep.variant) == ("chat-prod", "a")
    assert _conflict(world, "chat-prod") is None


def test_a_held_name_stays_with_its_holder_whatever_the_names_order() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("chat-prod", _variant("a")))
    end = run(world)
    (before,) = world.deployments.values()
    world.put_endpoint(endpoint("chat", _variant("prod-a")))
    actions = plan(world.desired(), world.observed(end))
    touched = (ApplyDeployment, ScaleDeployment, DeleteDeployment)
    assert not [a for a in actions if isinstance(a, touched)]
    run(world, start_s=end)
    assert list(world.deployments.values()) == [before]  # same pods: never re-applied
    conflict = _conflict(world, "chat")
    assert conflict is not None
    assert "belongs to InferenceEndpoint chat-prod" in conflict.message


def test_a_revision_whose_name_is_held_keeps_the_running_one() -> None:
    world = World(nodes(2))
    world.put_endpoint(endpoint("chat-prod", _variant("a")))
    world.put_endpoint(endpoint("chat", _variant("prod-a", uri="s3://models/other")))
    end = run(world)
    assert len(world.deployments) == 2  # different models: different revisions, no conflict
    old = next(d for d in world.deployments.values() if d.endpoint == "chat")
    # chat moves to chat-prod's model: its new Deployment's name is chat-prod's
    world.put_endpoint(endpoint("chat", _variant("prod-a")))
    run(world, start_s=end)
    mine = [d for d in world.deployments.values() if d.endpoint == "chat"]
    assert [d.name for d in mine] == [old.name]  # not rolled over: still serving
    assert all(p.ready for p in mine[0].pods)
    assert _conflict(world, "chat") is not None


def _held(kind: str, name: str, endpoint: str | None, uid: str = "") -> HeldName:
    return HeldName(kind, name, endpoint, uid, owner="" if endpoint else "Rollout r")


def test_services_and_objects_it_does_not_manage_are_contested_as_the_backend_reports() -> None:
    chat = DesiredEndpoint("chat", _variant("prod"), uid="u-chat")
    other = DesiredEndpoint("chat-prod", _variant("main"), uid="u-chat-prod")
    dep = names.deployment_name("chat-prod", "main", names.revision(other.spec))
    kinds = frozenset({names.DEPLOYMENT, names.SERVICE})
    observed = ObservedState(0.0, named_kinds=kinds)
    # nothing exists: the Service chat-prod goes to chat (first by name)
    assert name_conflicts([other, chat], observed) == {
        "chat-prod": (NameConflict(names.SERVICE, "chat-prod", "InferenceEndpoint chat"),)
    }
    held = (
        _held(names.SERVICE, "chat-prod", "chat-prod", "u-chat-prod"),
        _held(names.DEPLOYMENT, dep, None),
        _held(names.SERVICE, "chat", "chat", "u-old-chat"),  # a deleted chat's, not collected
    )
    observed = ObservedState(0.0, held=held, named_kinds=kinds)
    assert name_conflicts([other, chat], observed) == {
        "chat": (
            NameConflict(
                names.SERVICE, "chat", "an earlier InferenceEndpoint chat (uid u-old-chat)"
            ),
            NameConflict(names.SERVICE, "chat-prod", "InferenceEndpoint chat-prod"),
        ),
        "chat-prod": (NameConflict(names.DEPLOYMENT, dep, "Rollout r"),),
    }
    unmanaged = NameConflict(names.SERVICE, "chat", "")  # no owner at all
    assert unmanaged.message() == "Service chat exists and is not managed by warmfleet"
    # a backend without Services (the default) contests Deployments only
    assert name_conflicts([other, chat], ObservedState(0.0, held=held)) == {
        "chat-prod": (NameConflict(names.DEPLOYMENT, dep, "Rollout r"),)
    }


def test_a_model_cache_no_endpoint_holds_is_neither_written_deleted_nor_waited_for() -> None:
    llama = endpoint("llama")
    name = names.model_cache_name("llama", llama.spec)
    source = ModelSource(uri="s3://theirs/model")
    theirs = ModelCacheSpec(model_source=source, owner="llama")  # the owner field alone
    caches = (ObservedModelCache(name, theirs, 0.0), ObservedModelCache("their-cache", theirs, 0.0))
    kinds = frozenset({names.DEPLOYMENT, names.SERVICE, MODEL_CACHE})
    held = tuple(_held(MODEL_CACHE, c.name, None) for c in caches)
    observed = ObservedState(
        0.0, nodes=tuple(nodes(2)), model_caches=caches, held=held, named_kinds=kinds
    )
    actions = plan([llama], observed)
    cache_actions = (ApplyModelCache, DeleteModelCache, UpdateModelCacheStatus, ApplyDeployment)
    assert [a for a in actions if isinstance(a, cache_actions)] == []
    told = {c.cache for a in actions if isinstance(a, AssignNodeCaches) for c in a.caches}
    assert name not in told  # its nodes are not filled under that name
    (status,) = [a.status for a in actions if isinstance(a, UpdateEndpointStatus)]
    conflict = next(c for c in status.conditions if c.type == CONDITION)
    assert f"ModelCache {name} belongs to Rollout r" in conflict.message
    deleting = replace(llama, deleting=True)  # not held up by a cache that is not its own
    assert ReleaseEndpoint("llama") in plan([deleting], observed)

    free = ObservedState(0.0, nodes=tuple(nodes(2)), named_kinds=kinds)
    assert [a.name for a in plan([llama], free) if isinstance(a, ApplyModelCache)] == [name]


def test_an_image_cache_warmfleet_does_not_manage_is_neither_written_pulled_nor_deleted() -> None:
    """Its name the endpoint's or not, labelled on no node (what lets a cache of warmfleet's go):
    the plan leaves it be, and the endpoints whose image cache name it has report it.
    warmfleet's own image caches are shared: endpoints do not contest those."""
    llama, other = endpoint("llama"), endpoint("other")
    name = names.image_cache_name(llama.spec.image, llama.spec.node_selector)
    theirs = ImageCacheSpec(image=llama.spec.image)
    caches = (ObservedImageCache(name, theirs, 0.0), ObservedImageCache("their-img", theirs, 0.0))
    kinds = frozenset({names.DEPLOYMENT, names.SERVICE, MODEL_CACHE, IMAGE_CACHE})
    held = tuple(_held(IMAGE_CACHE, c.name, None) for c in caches)
    observed = ObservedState(
        0.0, tuple(nodes(2)), image_caches=caches, held=held, named_kinds=kinds
    )
    actions = plan([llama, other], observed)
    cache_actions = (
        ApplyImageCache,
        ApplyImagePuller,
        DeleteImageCache,
        DeleteImagePuller,
        UpdateImageCacheStatus,
    )
    assert [a for a in actions if isinstance(a, cache_actions)] == []
    statuses = {a.name: a.status for a in actions if isinstance(a, UpdateEndpointStatus)}
    for status in statuses.values():
        conflict = next(c for c in status.conditions if c.type == CONDITION)
        assert f"ImageCache {name} belongs to Rollout r" in conflict.message
    assert any(isinstance(a, ApplyModelCache) for a in actions)  # the weights cache is not

    free = ObservedState(0.0, tuple(nodes(2)), named_kinds=kinds)
    assert name_conflicts([llama, other], free) == {}  # one cache for both
    (made,) = [a for a in plan([llama, other], free) if isinstance(a, ApplyImageCache)]
    assert [p.name for p in made.spec.parent_references] == ["llama", "other"]


def test_a_puller_name_held_elsewhere_is_reported_and_orphan_pullers_are_deleted() -> None:
    """A DaemonSet of the puller's name warmfleet did not make: no puller is planned and every
    endpoint of that image reports it; warmfleet's pullers whose ImageCache is not warmfleet's
    (gone, or a user's now) are deleted, those of wanted caches kept."""
    llama, other = endpoint("llama"), endpoint("other")
    cache = names.image_cache_name(llama.spec.image, llama.spec.node_selector)
    puller = names.puller_name(cache)
    kinds = frozenset({names.DEPLOYMENT, IMAGE_CACHE, PULLER})
    held = (_held(PULLER, puller, None),)
    observed = ObservedState(0.0, tuple(nodes(2)), held=held, named_kinds=kinds)
    actions = plan([llama, other], observed)
    assert [a for a in actions if isinstance(a, ApplyImagePuller)] == []  # before: one a pass
    assert any(isinstance(a, ApplyImageCache) for a in actions)  # the cache itself is made
    statuses = [a.status for a in actions if isinstance(a, UpdateEndpointStatus)]
    assert len(statuses) == 2
    for status in statuses:
        conflict = next(c for c in status.conditions if c.type == CONDITION)
        assert f"DaemonSet {puller} belongs to Rollout r" in conflict.message

    mine = ObservedImageCache(cache, ImageCacheSpec(image=llama.spec.image), 0.0, puller=True)
    pullers = frozenset({cache, "img-gone", "img-theirs"})
    theirs = (_held(IMAGE_CACHE, "img-theirs", None),)
    observed = ObservedState(
        0.0, tuple(nodes(2)), image_caches=(mine,), held=theirs, named_kinds=kinds, pullers=pullers
    )
    deleted = [a.cache for a in plan([llama], observed) if isinstance(a, DeleteImagePuller)]
    assert deleted == ["img-gone", "img-theirs"]  # before: none
