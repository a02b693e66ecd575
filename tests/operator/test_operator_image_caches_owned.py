"""ImageCaches against kmock, as ModelCaches: one warmfleet does not manage (a user's own) is
never written, pulled for, given a status nor deleted, whatever its name; one of the name an
endpoint derives puts a ``NameConflict`` in that endpoint's status until it is gone, then the
endpoint takes the name. warmfleet's own ImageCaches stay shared by the endpoints that pull
the image (test_operator_kmock.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kmock_cluster import (
    NS,
    Env,
    FakeCluster,
    conflict_message,
    converge,
    create_endpoint,
    endpoint_body,
    get_object,
    server_controller,
    server_env,
    taken_once_free,
)

from warmfleet.api import names
from warmfleet.api.resources import InferenceEndpointSpec
from warmfleet.kube import client as kube

Obj = dict[str, Any]


@pytest.fixture
async def env(kmock: Any) -> AsyncIterator[Env]:
    async with server_env(kmock) as made:
        yield made


def _image_name(body: Obj) -> str:
    spec = InferenceEndpointSpec.model_validate(body["spec"])
    return names.image_cache_name(spec.image, spec.node_selector)


def _theirs(name: str, **meta: Any) -> Obj:
    """An ImageCache someone else made (of the endpoint's image even: warmfleet's label says
    who made it)."""
    spec = {"image": "vllm/vllm-openai:v0.9", "nodeSelector": {}}
    metadata = {"name": name, "namespace": NS, "uid": "uid-theirs", **meta}
    kind = {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "ImageCache"}
    return {**kind, "metadata": metadata, "spec": spec}


async def _assert_untouched(cluster: FakeCluster, cache: Obj) -> None:
    found = await get_object(cluster, kube.IMAGE_CACHES, cache["metadata"]["name"])
    assert found is not None  # before: the one no node was labelled for was deleted
    assert found["spec"] == cache["spec"]  # before: the endpoint's overwrote it
    assert "status" not in found
    assert (found["metadata"].get("labels") or {}).get(names.LABEL_MANAGED_BY) is None


async def test_an_image_cache_warmfleet_does_not_manage_is_left_alone(env: Env) -> None:
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    name = _image_name(body)
    controlled = {"kind": "Rollout", "name": "r", "uid": "u", "controller": True}
    theirs = _theirs(name)
    other = _theirs("their-images", ownerReferences=[{"apiVersion": "x/v1", **controlled}])
    await c.create(kube.IMAGE_CACHES, NS, theirs)
    await c.create(kube.IMAGE_CACHES, NS, other)
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    await converge(cluster, controller)
    for cache in (other, theirs):  # before: the other deleted, theirs overwritten
        await _assert_untouched(cluster, cache)
    assert await get_object(cluster, kube.DAEMONSETS, names.puller_name(name)) is None
    labels = await cluster.managed_labels()
    assert names.image_label(name) not in set().union(*labels.values())
    message = await conflict_message(cluster)
    assert message is not None
    assert f"ImageCache {name} exists and is not managed by warmfleet" in message
    endpoint = await get_object(cluster, kube.ENDPOINTS, "llama")
    assert endpoint is not None
    assert endpoint["status"]["phase"] == "Ready"  # images never gate

    mine = await taken_once_free(cluster, controller, kube.IMAGE_CACHES, name)
    assert mine["metadata"]["labels"][names.LABEL_MANAGED_BY] == names.MANAGER
    assert await get_object(cluster, kube.DAEMONSETS, names.puller_name(name)) is not None
    await _assert_untouched(cluster, other)


async def test_an_image_cache_made_after_the_read_is_not_written(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass planned to create the cache (it read none); one made meanwhile is left alone:
    the check is made on the object as the write finds it."""
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    theirs = _theirs(_image_name(body))
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    read = controller.snapshot

    async def snapshot_then_theirs() -> Any:
        snap = await read()
        await c.create(kube.IMAGE_CACHES, NS, theirs)
        return snap

    controller.snapshot = snapshot_then_theirs  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator"):
        await controller.reconcile()
    found = await get_object(cluster, kube.IMAGE_CACHES, theirs["metadata"]["name"])
    assert found is not None
    assert found["spec"] == theirs["spec"]  # before: patched to the endpoint's
    said = f"ImageCache {theirs['metadata']['name']} exists and is not managed by warmfleet"
    assert f"{said}: left alone" in caplog.messages


def _their_daemonset(name: str) -> Obj:
    labels = {"app": "theirs"}
    pod = {"containers": [{"name": "theirs", "image": "theirs:1"}]}
    template: Obj = {"metadata": {"labels": labels}, "spec": pod}
    spec = {"selector": {"matchLabels": labels}, "template": template}
    theirs: Obj = {"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": spec}
    theirs["metadata"] = {"name": name, "namespace": NS, "uid": "uid-theirs"}
    return theirs


async def test_a_daemonset_of_the_puller_name_warmfleet_did_not_make_is_reported_not_written(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """A user's DaemonSet of the puller's name: never written, the endpoint's status names it
    (before: a refused write and a warning every pass, and nothing in any status); once it is
    gone the puller is made."""
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    name = names.puller_name(_image_name(body))
    theirs = _their_daemonset(name)
    await c.create(kube.DAEMONSETS, NS, theirs)
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator"):
        for _ in range(3):
            await cluster.kubelet()
            await controller.reconcile()
    found = await get_object(cluster, kube.DAEMONSETS, name)
    assert found is not None
    assert found["spec"] == theirs["spec"]  # before: made warmfleet's puller
    assert "labels" not in found["metadata"]
    assert not [m for m in caplog.messages if m.endswith(": left alone")]  # no write tried
    message = await conflict_message(cluster)
    assert message is not None
    assert f"DaemonSet {name} exists and is not managed by warmfleet" in message

    mine = await taken_once_free(cluster, controller, kube.DAEMONSETS, name)  # the puller
    assert mine["metadata"]["labels"][names.LABEL_MANAGED_BY] == names.MANAGER


async def test_a_puller_daemonset_made_after_the_read_is_not_written(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass planned the puller (it read none); a user's made meanwhile is left alone."""
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    name = names.puller_name(_image_name(body))
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    read = controller.snapshot

    async def snapshot_then_theirs() -> Any:
        snap = await read()
        await c.create(kube.DAEMONSETS, NS, _their_daemonset(name))
        return snap

    controller.snapshot = snapshot_then_theirs  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator"):
        await controller.reconcile()
    found = await get_object(cluster, kube.DAEMONSETS, name)
    assert found is not None
    assert "labels" not in found["metadata"]
    said = f"DaemonSet {name} exists and is not managed by warmfleet: left alone"
    assert said in caplog.messages


async def test_the_puller_of_an_image_cache_replaced_by_a_users_is_deleted(env: Env) -> None:
    """warmfleet's ImageCache deleted and a user's made under its name: warmfleet's puller,
    which kept the old image pulled, goes (before: it stayed for good)."""
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    cache = _image_name(body)
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    await converge(cluster, controller)
    assert await get_object(cluster, kube.DAEMONSETS, names.puller_name(cache)) is not None
    await c.delete(kube.IMAGE_CACHES, NS, cache)
    await c.create(kube.IMAGE_CACHES, NS, _theirs(cache))
    await converge(cluster, controller)
    assert await get_object(cluster, kube.DAEMONSETS, names.puller_name(cache)) is None
    found = await get_object(cluster, kube.IMAGE_CACHES, cache)
    assert found is not None
    assert found["metadata"]["uid"] == "uid-theirs"
    message = await conflict_message(cluster)
    assert message is not None
    assert f"ImageCache {cache} exists and is not managed by warmfleet" in message
