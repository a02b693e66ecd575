"""ModelCaches and deletes against kmock: a ModelCache of the name an endpoint derives that
warmfleet does not manage (a user's own, an earlier endpoint's of the same name) is never
written, and one of any name is never deleted; what the operator deletes, it deletes as it read
it (uid precondition): an object deleted and created again meanwhile stays, the pass goes on."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kmock_cluster import (
    NS,
    Env,
    FakeCluster,
    ServerClient,
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
from warmfleet.operator import render

Obj = dict[str, Any]


@pytest.fixture
async def env(kmock: Any) -> AsyncIterator[Env]:
    async with server_env(kmock) as made:
        yield made


def _cache_name(body: Obj) -> str:
    return names.model_cache_name("llama", InferenceEndpointSpec.model_validate(body["spec"]))


async def _assigned(cluster: FakeCluster) -> set[str]:
    found = set()
    for node in (await cluster.nodes()).values():
        raw = (node["metadata"].get("annotations") or {}).get(render.ANN_ASSIGNED, "[]")
        found |= {a["cache"] for a in json.loads(raw)}
    return found


def _theirs(name: str, **meta: Any) -> Obj:
    """A ModelCache someone else made (its spec even names the endpoint as owner)."""
    spec = {"modelSource": {"uri": "s3://theirs/model"}, "hostPath": "/data", "owner": "llama"}
    metadata = {"name": name, "namespace": NS, "uid": "uid-theirs", **meta}
    kind = {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "ModelCache"}
    return {**kind, "metadata": metadata, "spec": spec}


async def test_a_model_cache_warmfleet_does_not_manage_is_left_alone(env: Env) -> None:
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    name = _cache_name(body)
    theirs, other = _theirs(name), _theirs("their-cache")
    await c.create(kube.MODEL_CACHES, NS, theirs)
    await c.create(kube.MODEL_CACHES, NS, other)
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    await converge(cluster, controller)
    for cache in (theirs, other):  # before: overwritten and owned; the other deleted
        found = await get_object(cluster, kube.MODEL_CACHES, cache["metadata"]["name"])
        assert found is not None
        assert found["spec"] == cache["spec"]
        assert "ownerReferences" not in found["metadata"]
        assert "status" not in found
    assert name not in await _assigned(cluster)  # not filled on the nodes under that name
    message = await conflict_message(cluster)
    assert message is not None
    assert f"ModelCache {name} exists and is not managed by warmfleet" in message

    mine = await taken_once_free(cluster, controller, kube.MODEL_CACHES, name)
    assert mine["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert mine["spec"]["modelSource"]["uri"] == "s3://models/llama"
    assert await get_object(cluster, kube.MODEL_CACHES, "their-cache") is not None


async def test_a_model_cache_made_after_the_read_is_not_written(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass planned to create the cache (it read none); one made meanwhile is left alone:
    the check is made on the object as the write finds it."""
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    theirs = _theirs(_cache_name(body))
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    read = controller.snapshot

    async def snapshot_then_theirs() -> Any:
        snap = await read()
        await c.create(kube.MODEL_CACHES, NS, theirs)
        return snap

    controller.snapshot = snapshot_then_theirs  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator"):
        await controller.reconcile()
    found = await get_object(cluster, kube.MODEL_CACHES, theirs["metadata"]["name"])
    assert found is not None
    assert found["spec"] == theirs["spec"]  # before: patched to the endpoint's
    assert "ownerReferences" not in found["metadata"]
    assert any("is not managed by warmfleet: left alone" in m for m in caplog.messages)


async def test_an_earlier_endpoints_model_cache_is_not_adopted(env: Env) -> None:
    cluster, c = env[0], env[0].client
    body = endpoint_body("llama", replicas=1)
    name = _cache_name(body)
    earlier = _theirs(name, labels={names.LABEL_MANAGED_BY: names.MANAGER})
    earlier["metadata"]["ownerReferences"] = [
        render.owner_reference(names.ENDPOINT_KIND, "llama", "uid-old")
    ]
    await c.create(kube.MODEL_CACHES, NS, earlier)
    await create_endpoint(cluster, body)
    controller = server_controller(env)
    await controller.reconcile()
    message = await conflict_message(cluster)
    assert message is not None
    assert f"ModelCache {name} belongs to an earlier InferenceEndpoint llama" in message
    await converge(cluster, controller)  # its endpoint is gone: collected, then made anew
    mine = await get_object(cluster, kube.MODEL_CACHES, name)
    assert mine is not None
    assert mine["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"  # before: uid-old
    assert mine["spec"]["modelSource"]["uri"] == "s3://models/llama"
    assert await conflict_message(cluster) is None


async def _roll_with_a_race(
    env: Env, resource: kube.Resource, old_name: Callable[[FakeCluster], Any]
) -> tuple[str, Obj]:
    """Roll llama v1 -> v2; the old revision's object of ``resource`` is deleted and created
    again by someone else just before the operator's delete. (name, the object made again)."""
    cluster = env[0]
    await create_endpoint(cluster, endpoint_body("llama", replicas=1))
    await converge(cluster, server_controller(env))
    name = await old_name(cluster)
    again: Obj = {}

    async def race(path: str) -> bool:
        if not path.endswith(f"/{resource.plural}/{name}"):
            return False
        current = await get_object(cluster, resource, name)
        assert current is not None
        meta = {"name": name, "namespace": NS, "uid": "uid-theirs"}
        again.update({**current, "metadata": meta})
        if resource == kube.DEPLOYMENTS:  # their pods, not llama's
            template = {**again["spec"]["template"], "metadata": {"labels": {"app": "theirs"}}}
            again["spec"] = {**again["spec"], "template": template}
        await cluster.client.delete(resource, NS, name)
        await cluster.client.create(resource, NS, again)
        return True

    patch = {"spec": {"modelSource": {"uri": "s3://models/llama", "revision": "v2"}}}
    await cluster.client.patch(kube.ENDPOINTS, NS, "llama", patch)
    await converge(cluster, server_controller(env, race), rounds=16)
    assert again, "the operator never deleted it"
    return name, again


async def _old_cache(cluster: FakeCluster) -> str:
    (cache,) = await cluster.client.list(kube.MODEL_CACHES, NS)
    return str(cache["metadata"]["name"])


async def _old_deployment(cluster: FakeCluster) -> str:
    (dep,) = await cluster.client.list(kube.DEPLOYMENTS, NS)
    return str(dep["metadata"]["name"])


@pytest.mark.parametrize(
    ("resource", "old_name"),
    [(kube.MODEL_CACHES, _old_cache), (kube.DEPLOYMENTS, _old_deployment)],
    ids=["ModelCache", "Deployment"],
)
async def test_a_delete_spares_an_object_made_again_since_the_read(
    env: Env,
    resource: kube.Resource,
    old_name: Callable[[FakeCluster], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        name, again = await _roll_with_a_race(env, resource, old_name)
    found = await get_object(env[0], resource, name)
    assert found is not None  # before: the operator deleted the new object
    assert found["metadata"]["uid"] == "uid-theirs"
    assert found["spec"] == again["spec"]
    said = f"{resource.plural} {name} changed since it was read: not deleted, read again"
    assert any(m.startswith(said) for m in caplog.messages)
    endpoint = await get_object(env[0], kube.ENDPOINTS, "llama")
    assert endpoint is not None
    assert endpoint["status"]["phase"] == "Ready"  # the pass went on; the rollover ended


async def test_a_removed_variants_service_made_again_since_the_read_stays(env: Env) -> None:
    cluster = env[0]
    body = endpoint_body("llama", replicas=1)
    body["spec"]["variants"].append({"name": "b", "replicas": 1})
    await create_endpoint(cluster, body)
    await converge(cluster, server_controller(env))
    theirs = {"apiVersion": "v1", "kind": "Service", "spec": {"selector": {"app": "theirs"}}}
    theirs["metadata"] = {"name": "llama-b", "namespace": NS, "uid": "uid-theirs"}

    async def race(path: str) -> bool:
        if not path.endswith("/services/llama-b"):
            return False
        await cluster.client.delete(kube.SERVICES, NS, "llama-b")
        await cluster.client.create(kube.SERVICES, NS, theirs)
        return True

    patch = {"spec": {"variants": [{"name": "main", "replicas": 1}]}}
    await cluster.client.patch(kube.ENDPOINTS, NS, "llama", patch)
    await converge(cluster, server_controller(env, race))
    found = await get_object(cluster, kube.SERVICES, "llama-b")
    assert found is not None  # before: deleted with the variant it was not
    assert found["metadata"]["uid"] == "uid-theirs"


async def test_a_model_cache_changed_since_the_read_is_deleted_by_the_next_pass(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The old revision's ModelCache is changed (not made again: same uid) by another writer
    between the pass's read and its delete: the API server refuses the delete on its
    resourceVersion (409); the next pass reads it again and deletes it."""
    cluster, session, url = env
    await create_endpoint(cluster, endpoint_body("llama", replicas=1))
    await converge(cluster, server_controller(env))
    name = await _old_cache(cluster)
    old = await get_object(cluster, kube.MODEL_CACHES, name)
    assert old is not None
    uids: list[str] = []

    async def race(path: str) -> bool:
        if not path.endswith(f"/{kube.MODEL_CACHES.plural}/{name}"):
            return False
        other = ServerClient(session, url)  # another writer: its change is a new version
        touched = {"metadata": {"annotations": {"example.com/touched": "yes"}}}
        changed = await other.patch(kube.MODEL_CACHES, NS, name, touched)
        uids.append(changed["metadata"]["uid"])
        return True

    patch = {"spec": {"modelSource": {"uri": "s3://models/llama", "revision": "v2"}}}
    await cluster.client.patch(kube.ENDPOINTS, NS, "llama", patch)
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        await converge(cluster, server_controller(env, race), rounds=16)
    assert uids == [old["metadata"]["uid"]], "the operator never deleted it"  # changed, not new
    said = f"modelcaches {name} changed since it was read: not deleted, read again"
    assert any(m.startswith(said) for m in caplog.messages)  # before: deleted as it was
    assert await get_object(cluster, kube.MODEL_CACHES, name) is None  # the next pass deleted it
    endpoint = await get_object(cluster, kube.ENDPOINTS, "llama")
    assert endpoint is not None
    assert endpoint["status"]["phase"] == "Ready"
