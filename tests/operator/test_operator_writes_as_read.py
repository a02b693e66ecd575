"""Patches to objects the pass read go to those very objects (``ownership.patch_as_read``): a
Deployment scaled in a rollover, an endpoint's or a cache's status. One deleted and created
again between the read and the write (by a user, by another owner, the endpoint itself) is not
written; the operator logs it and the next pass reads and decides again."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kmock_cluster import (
    NS,
    Env,
    FakeCluster,
    converge,
    create_endpoint,
    endpoint_body,
    server_controller,
    server_env,
)

from warmfleet.api import names
from warmfleet.api.resources import InferenceEndpointSpec
from warmfleet.kube import client as kube
from warmfleet.operator.controller import Controller

Obj = dict[str, Any]
Race = Callable[[str], Awaitable[bool]]
WRITES = ("GET", "PATCH")  # the first request of a write to the object: the race goes first


@pytest.fixture
async def env(kmock: Any) -> AsyncIterator[Env]:
    async with server_env(kmock) as made:
        yield made


def _controller(env: Env, race: Race | None = None) -> Controller:
    return server_controller(env, race, on=WRITES)


def _made_again(
    cluster: FakeCluster, resource: kube.Resource, name: str, again: Callable[[Obj], Obj]
) -> tuple[Race, Obj]:
    """A race: before the first write to ``name`` (or its status), it is deleted and
    ``again(current)`` created in its place. (the race, the object made again once it ran)"""
    made: Obj = {}

    async def race(path: str) -> bool:
        if not path.endswith((f"/{resource.plural}/{name}", f"/{resource.plural}/{name}/status")):
            return False
        current = await cluster.client.get(resource, NS, name)
        assert current is not None
        made.update(again(current))
        await cluster.client.patch(resource, NS, name, {"metadata": {"finalizers": []}})
        await cluster.client.delete(resource, NS, name)
        await cluster.client.create(resource, NS, made)
        return True

    return race, made


def _theirs(current: Obj) -> Obj:
    """A user's object of that name: their spec, no status, no labels or owner of warmfleet's."""
    meta = {"name": current["metadata"]["name"], "namespace": NS, "uid": "uid-theirs"}
    return {k: v for k, v in current.items() if k != "status"} | {"metadata": meta}


async def test_a_deployment_made_again_since_the_read_is_not_scaled(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """A Rolling rollover scales the old revision's Deployment down (2 -> 1); a user's
    Deployment of its name made meanwhile keeps its replicas."""
    cluster = env[0]
    body = endpoint_body("llama")
    body["spec"]["rollout"] = {"type": "Rolling", "maxSurge": 0, "maxUnavailable": 1}
    await create_endpoint(cluster, body)
    await converge(cluster, _controller(env))
    (old,) = await cluster.client.list(kube.DEPLOYMENTS, NS)
    name = old["metadata"]["name"]

    def theirs(current: Obj) -> Obj:
        made = _theirs(current)
        template = {**made["spec"]["template"], "metadata": {"labels": {"app": "theirs"}}}
        return made | {"spec": {**made["spec"], "template": template}}  # their own pods

    race, made = _made_again(cluster, kube.DEPLOYMENTS, name, theirs)
    patch = {"spec": {"modelSource": {"uri": "s3://models/llama", "revision": "v2"}}}
    await cluster.client.patch(kube.ENDPOINTS, NS, "llama", patch)
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        await converge(cluster, _controller(env, race), rounds=16)
    assert made, "the operator never scaled it"
    found = await cluster.client.get(kube.DEPLOYMENTS, NS, name)
    assert found is not None
    assert found["metadata"]["uid"] == "uid-theirs"
    assert found["spec"]["replicas"] == 2  # before: scaled to 1, as the read one would be
    said = f"deployments {name} changed since it was read: not patched, read again next pass"
    assert any(m.startswith(said) for m in caplog.messages)
    endpoint = await cluster.client.get(kube.ENDPOINTS, NS, "llama")
    assert endpoint is not None
    assert endpoint["status"]["phase"] == "Ready"  # the rollover went on without it


async def test_an_endpoint_made_again_since_the_read_gets_no_status_of_the_old_one(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = env[0]
    await create_endpoint(cluster, endpoint_body("llama"))

    made_body = endpoint_body("llama", revision="v2")
    made_body["metadata"]["uid"] = "uid-llama-2"
    spec = InferenceEndpointSpec.model_validate(made_body["spec"])
    race, made = _made_again(cluster, kube.ENDPOINTS, "llama", lambda _: made_body)

    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        await _controller(env, race).reconcile()
    assert made, "the operator wrote no status"
    found = await cluster.client.get(kube.ENDPOINTS, NS, "llama")
    assert found is not None
    assert found["metadata"]["uid"] == "uid-llama-2"
    assert "status" not in found  # before: the deleted endpoint's status
    said = "inferenceendpoints llama changed since it was read: status not written"
    assert any(m.startswith(said) for m in caplog.messages)

    await converge(cluster, _controller(env))  # the next pass reads it and writes its own
    found = await cluster.client.get(kube.ENDPOINTS, NS, "llama")
    assert found is not None
    assert found["status"]["phase"] == "Ready"
    assert found["status"]["revision"] == names.revision(spec)  # the new endpoint's


async def test_a_cache_made_again_since_the_read_gets_no_status(env: Env) -> None:
    """The pass after the one that made the weights cache gives it its first status; a user's
    ModelCache made in its place meanwhile gets none."""
    cluster = env[0]
    await create_endpoint(cluster, endpoint_body("llama"))
    await _controller(env).reconcile()
    (cache,) = await cluster.client.list(kube.MODEL_CACHES, NS)
    assert "status" not in cache
    name = cache["metadata"]["name"]
    race, made = _made_again(cluster, kube.MODEL_CACHES, name, _theirs)
    await _controller(env, race).reconcile()
    assert made, "the operator wrote no status"
    found = await cluster.client.get(kube.MODEL_CACHES, NS, name)
    assert found is not None
    assert found["metadata"]["uid"] == "uid-theirs"
    assert "status" not in found  # before: the status of the cache the pass read
