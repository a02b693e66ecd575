"""Object names two owners want, against kmock: endpoint ``chat`` variant ``prod`` and endpoint
``chat-prod`` both name a Service ``chat-prod`` (with variants ``prod-a`` and ``a``, a
Deployment too). The operator never overwrites, adopts or deletes an object another endpoint
(or nobody warmfleet knows) controls: the endpoint that loses says so in a ``NameConflict``
condition and a log line, and takes the name once it is free."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kmock_cluster import (
    NS,
    Clock,
    FakeCluster,
    converge,
    create_endpoint,
    declare_resources,
    endpoint_body,
    forget_requests,
)

from warmfleet.api import names
from warmfleet.api.resources import InferenceEndpointSpec
from warmfleet.control.claims import CONDITION
from warmfleet.control.observed import DesiredEndpoint
from warmfleet.kube import client as kube
from warmfleet.kube.owners import endpoint_service_problem
from warmfleet.operator import ownership, render
from warmfleet.operator.controller import Controller

Obj = dict[str, Any]
Env = tuple[FakeCluster, Controller]


@pytest.fixture
async def env(kmock: Any) -> AsyncIterator[Env]:
    declare_resources(kmock)
    async with aiohttp.ClientSession() as session:
        cluster = FakeCluster(session, str(kmock.url), on_round=lambda: forget_requests(kmock))
        controller = Controller(kube.KubeClient(session, str(kmock.url)), NS, Clock())
        for i in range(2):
            await cluster.add_node(f"n{i}")
        yield cluster, controller


def _body(name: str, variant: str) -> Obj:
    body = endpoint_body(name, replicas=1)
    body["spec"]["modelSource"]["uri"] = "s3://models/shared"  # one revision for both
    body["spec"]["variants"] = [{"name": variant, "replicas": 1}]
    return body


async def _get(cluster: FakeCluster, resource: kube.Resource, name: str) -> Obj:
    obj = await cluster.client.get(resource, NS, name)
    assert obj is not None, name
    return obj


async def _conflict(cluster: FakeCluster, endpoint: str) -> str | None:
    status = (await _get(cluster, kube.ENDPOINTS, endpoint)).get("status") or {}
    found = [c for c in status.get("conditions", []) if c["type"] == CONDITION]
    return found[0]["message"] if found else None


async def _pods_of(cluster: FakeCluster, deployment: str) -> list[str]:
    pods = await cluster.client.list(kube.PODS, NS, {"owner": deployment})
    return sorted(p["metadata"]["name"] for p in pods)


def _controller_uid(obj: Obj) -> str:
    (ref,) = obj["metadata"]["ownerReferences"]
    return str(ref["uid"])


async def test_a_service_another_endpoint_holds_is_reported_and_taken_once_free(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, controller = env
    await create_endpoint(cluster, _body("chat", "prod"))
    await create_endpoint(cluster, _body("chat-prod", "main"))
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        await converge(cluster, controller)
    service = await _get(cluster, kube.SERVICES, "chat-prod")
    assert _controller_uid(service) == "uid-chat"  # chat's variant Service, untouched
    assert service["spec"]["selector"][names.LABEL_ENDPOINT] == "chat"
    assert service["spec"]["selector"][names.LABEL_VARIANT] == "prod"
    message = await _conflict(cluster, "chat-prod")
    assert message is not None
    assert "Service chat-prod belongs to InferenceEndpoint chat" in message
    assert await _conflict(cluster, "chat") is None
    assert f"InferenceEndpoint chat-prod: name conflict: {message}" in caplog.messages
    await _get(cluster, kube.SERVICES, "chat-prod-main")  # the rest of chat-prod runs

    await cluster.client.delete(kube.ENDPOINTS, NS, "chat")
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        await converge(cluster, controller)
    service = await _get(cluster, kube.SERVICES, "chat-prod")
    assert _controller_uid(service) == "uid-chat-prod"
    assert service["spec"]["selector"] == {
        names.LABEL_ENDPOINT: "chat-prod",
        render.LABEL_ROLE: "engine",
    }
    assert await _conflict(cluster, "chat-prod") is None
    assert any("chat-prod: name conflict resolved" in m for m in caplog.messages)


async def test_a_contested_deployment_is_neither_flipped_nor_deleted_by_the_other(
    env: Env,
) -> None:
    cluster, controller = env
    c = cluster.client
    await create_endpoint(cluster, _body("chat", "prod-a"))
    await create_endpoint(cluster, _body("chat-prod", "a"))
    await converge(cluster, controller)  # before: no convergence, each pass re-took it
    (dep,) = await c.list(kube.DEPLOYMENTS, NS)
    name = dep["metadata"]["name"]
    assert name.startswith("chat-prod-a-")
    assert _controller_uid(dep) == "uid-chat"
    assert dep["metadata"]["labels"][names.LABEL_ENDPOINT] == "chat"
    message = await _conflict(cluster, "chat-prod")
    assert message is not None
    assert f"Deployment {name} belongs to InferenceEndpoint chat" in message
    assert "Service chat-prod-a belongs to InferenceEndpoint chat" in message
    pods = await _pods_of(cluster, name)
    assert pods

    await c.delete(kube.ENDPOINTS, NS, "chat-prod")  # before: its deletion took chat's along
    result = await converge(cluster, controller)
    assert "chat-prod" in result.released
    (dep,) = await c.list(kube.DEPLOYMENTS, NS)
    assert dep["metadata"]["name"] == name
    assert _controller_uid(dep) == "uid-chat"
    assert await _pods_of(cluster, name) == pods  # the same replicas: never re-created
    assert _controller_uid(await _get(cluster, kube.SERVICES, "chat-prod-a")) == "uid-chat"


async def test_objects_warmfleet_does_not_manage_are_left_alone(env: Env) -> None:
    cluster, controller = env
    c = cluster.client
    body = endpoint_body("llama", replicas=1)
    spec = InferenceEndpointSpec.model_validate(body["spec"])
    dep_name = names.deployment_name("llama", "main", names.revision(spec))
    theirs = {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}
    service = {"metadata": {"name": "llama", "namespace": NS}, "spec": theirs}
    rollout = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "r"}
    ref = {**rollout, "uid": "uid-r", "controller": True}
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": dep_name, "namespace": NS, "ownerReferences": [ref]},
        "spec": {"replicas": 7},
    }
    await c.create(kube.SERVICES, NS, {"apiVersion": "v1", "kind": "Service", **service})
    await c.create(kube.DEPLOYMENTS, NS, {"apiVersion": "apps/v1", **deployment})
    await create_endpoint(cluster, body)
    for _ in range(4):
        await cluster.agents()
        await controller.reconcile()
    assert (await _get(cluster, kube.SERVICES, "llama"))["spec"] == theirs
    assert (await _get(cluster, kube.DEPLOYMENTS, dep_name))["spec"] == {"replicas": 7}
    message = await _conflict(cluster, "llama")
    assert message is not None
    assert f"Deployment {dep_name} belongs to Rollout r" in message
    assert "Service llama exists and is not managed by warmfleet" in message

    await c.delete(kube.DEPLOYMENTS, NS, dep_name)
    await converge(cluster, controller)
    dep = await _get(cluster, kube.DEPLOYMENTS, dep_name)
    assert _controller_uid(dep) == "uid-llama"
    assert (await _get(cluster, kube.SERVICES, "llama"))["spec"] == theirs
    message = await _conflict(cluster, "llama")
    assert message is not None
    assert "Deployment" not in message


async def test_a_write_checks_the_holder_on_the_version_it_patches(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """An object created after the pass read the cluster (the plan did not know it) is still
    left alone: the check is made on the object as the write finds it."""
    cluster, _ = env
    c = cluster.client
    held = render.service("chat", 8000, NS, "uid-chat", "prod")
    await c.create(kube.SERVICES, NS, held)
    spec = InferenceEndpointSpec.model_validate(endpoint_body("chat-prod")["spec"])
    other = DesiredEndpoint("chat-prod", spec, uid="uid-chat-prod")
    body = render.service("chat-prod", 9000, NS, other.uid)
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator"):
        done = await ownership.apply_owned(c, kube.SERVICES, names.SERVICE, body, other)
    assert not done
    after = await _get(cluster, kube.SERVICES, "chat-prod")
    assert after["metadata"]["ownerReferences"] == held["metadata"]["ownerReferences"]
    assert after["spec"] == held["spec"]
    assert caplog.messages == [
        "InferenceEndpoint chat-prod: Service chat-prod belongs to InferenceEndpoint chat: "
        "left alone"
    ]
    owner = DesiredEndpoint("chat", spec, uid="uid-chat")
    changed = render.service("chat", 9000, NS, "uid-chat", "prod")
    assert await ownership.apply_owned(c, kube.SERVICES, names.SERVICE, changed, owner)
    assert (await _get(cluster, kube.SERVICES, "chat-prod"))["spec"]["ports"][0]["port"] == 9000


def test_who_holds_an_object() -> None:
    def obj(labels: dict[str, str], refs: list[Obj]) -> Obj:
        return {"metadata": {"name": "x", "labels": labels, "ownerReferences": refs}}

    ours = {names.LABEL_MANAGED_BY: names.MANAGER, names.LABEL_ENDPOINT: "chat"}
    ref = render.owner_reference("InferenceEndpoint", "chat", "u1")
    by_ref = ownership.held_name(names.SERVICE, obj({}, [ref]))
    assert (by_ref.endpoint, by_ref.uid) == ("chat", "u1")
    assert by_ref.owned_by("chat", "u1")
    assert not by_ref.owned_by("chat", "u2")  # a new endpoint of the same name
    assert not by_ref.owned_by("chat-prod", "u1")
    by_labels = ownership.held_name(names.SERVICE, obj(ours, []))  # no owner reference
    assert by_labels.owned_by("chat", "u9")
    foreign = ownership.held_name(names.DEPLOYMENT, obj({}, []))
    assert foreign.endpoint is None
    assert foreign.holder("chat") == ""
    not_controller = {**ref, "controller": False}
    assert ownership.held_name(names.SERVICE, obj(ours, [not_controller])).owned_by("chat", "")


@pytest.mark.parametrize(
    "refs",
    [
        [render.owner_reference("InferenceEndpoint", "chat", "u1")],
        [render.owner_reference("InferenceEndpoint", "chat-prod", "u2")],
        [{**render.owner_reference("InferenceEndpoint", "chat", "u1"), "controller": False}],
        [{**render.owner_reference("InferenceEndpoint", "chat", "u1"), "controller": "true"}],
        [{**render.owner_reference("InferenceEndpoint", "chat", "u1"), "controller": 1}],
        [{**render.owner_reference("InferenceEndpoint", "chat", "u1"), "apiVersion": "x.io/v1"}],
        [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "controller": True}],
        [],
    ],
)
def test_the_operator_and_the_gateway_agree_on_a_services_controller(refs: list[Obj]) -> None:
    """One reading of a controller reference (``kube.owners``: ``controller: true``, the boolean
    Kubernetes defines; the operator took any truthy value): the operator takes a Service for
    InferenceEndpoint chat's (uid u1) exactly when the gateway follows it for that endpoint."""
    service = {"metadata": {"name": "chat-prod", "ownerReferences": refs}}
    operator_says = ownership.held_name(names.SERVICE, service).owned_by("chat", "u1")
    gateway_says = endpoint_service_problem(service, "chat-prod", "u1") is None
    assert operator_says == gateway_says
