"""The operator's reconciliation passes against kmock's stateful Kubernetes API emulator:
create, gate, deploy, roll and delete an endpoint (also with a Rolling rollout), an image cache
shared by two endpoints, Services of a removed variant or lost mid-pass, node replacement, an
unhealthy cache, and a node-selector key removed from the endpoint."""

from __future__ import annotations

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
from warmfleet.kube import client as kube
from warmfleet.operator import render
from warmfleet.operator.controller import Controller


@pytest.fixture
async def env(kmock: Any) -> AsyncIterator[tuple[FakeCluster, Controller]]:
    declare_resources(kmock)
    async with aiohttp.ClientSession() as session:
        cluster = FakeCluster(session, str(kmock.url), on_round=lambda: forget_requests(kmock))
        controller = Controller(kube.KubeClient(session, str(kmock.url)), NS, Clock())
        for i in range(3):
            await cluster.add_node(f"n{i}")
        yield cluster, controller


async def test_create_gate_deploy_roll_delete(env: tuple[FakeCluster, Controller]) -> None:
    cluster, controller = env
    c = cluster.client
    await create_endpoint(cluster, endpoint_body("llama"))
    await controller.reconcile()
    (cache,) = await c.list(kube.MODEL_CACHES, NS)
    assert cache["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert cache["spec"]["modelSource"]["uri"] == "s3://models/llama"
    assert len(await c.list(kube.IMAGE_CACHES, NS)) == 1
    assert len(await c.list(kube.DAEMONSETS, NS)) == 1
    assert await c.list(kube.DEPLOYMENTS, NS) == []

    await cluster.agents(only=["n0", "n1"])  # n2 still filling: the 'all' gate stays closed
    await controller.reconcile()
    assert await c.list(kube.DEPLOYMENTS, NS) == []
    endpoint = await c.get(kube.ENDPOINTS, NS, "llama")
    assert endpoint is not None
    assert endpoint["status"]["phase"] == "WaitingForCache"

    await cluster.agents()
    await controller.reconcile()
    (dep,) = await c.list(kube.DEPLOYMENTS, NS)
    prefs = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    keys = [
        t["preference"]["matchExpressions"][0]["key"]
        for t in prefs["preferredDuringSchedulingIgnoredDuringExecution"]
    ]
    assert keys[0] == names.weights_label(cache["metadata"]["name"])
    services = {s["metadata"]["name"]: s for s in await c.list(kube.SERVICES, NS)}
    assert sorted(services) == ["llama", "llama-main"]  # the endpoint's and its variant's
    assert services["llama-main"]["spec"]["selector"][names.LABEL_VARIANT] == "main"
    assert names.LABEL_VARIANT not in services["llama"]["spec"]["selector"]

    await converge(cluster, controller)
    endpoint = await c.get(kube.ENDPOINTS, NS, "llama")
    assert endpoint is not None
    assert endpoint["status"]["phase"] == "Ready"
    assert endpoint["status"]["readyReplicas"] == 2
    assert endpoint["status"]["unpreparedReplicaShare"] == 0.0
    (cache_obj,) = await c.list(kube.MODEL_CACHES, NS)
    assert cache_obj["status"]["state"] == "Ready"
    assert cache_obj["status"]["readyNodes"] == 3

    # roll: a new model revision builds a new cache, rolls, then drops the old cache
    old_dep, old_cache = dep["metadata"]["name"], cache["metadata"]["name"]
    await c.patch(kube.ENDPOINTS, NS, "llama", {"spec": {"modelSource": {"revision": "v2"}}})
    await converge(cluster, controller)
    deps = [d["metadata"]["name"] for d in await c.list(kube.DEPLOYMENTS, NS)]
    caches = [m["metadata"]["name"] for m in await c.list(kube.MODEL_CACHES, NS)]
    assert old_dep not in deps
    assert len(deps) == 1
    assert old_cache not in caches
    assert len(caches) == 1
    for labels in (await cluster.managed_labels()).values():
        assert names.weights_label(old_cache) not in labels

    # delete: everything goes, then the finalizer is released
    await c.delete(kube.ENDPOINTS, NS, "llama")
    result = await converge(cluster, controller)
    assert "llama" in result.released
    assert await c.get(kube.ENDPOINTS, NS, "llama") is None
    for resource in (
        kube.DEPLOYMENTS,
        kube.MODEL_CACHES,
        kube.IMAGE_CACHES,
        kube.DAEMONSETS,
        kube.SERVICES,
    ):
        assert await c.list(resource, NS) == [], resource
    for node in (await cluster.nodes()).values():
        ann = node["metadata"].get("annotations") or {}
        assert ann.get(render.ANN_ASSIGNED) == "[]"
        assert ann.get(render.ANN_CACHE_STATUS) == "{}"
    assert all(not labels for labels in (await cluster.managed_labels()).values())


@pytest.mark.slow
async def test_a_rolling_rollout_scales_the_old_deployment_down_as_the_new_one_grows(
    env: tuple[FakeCluster, Controller],
) -> None:
    """``rollout: Rolling, maxSurge 0``: the declared replicas of both revisions never exceed
    the variant's 2 (no spare GPU needed); the old Deployment is scaled (a replicas patch),
    then deleted; the Deployments' own update strategy carries the same bounds."""
    cluster, controller = env
    c = cluster.client
    body = endpoint_body("llama")
    body["spec"]["rollout"] = {"type": "Rolling", "maxSurge": 0, "maxUnavailable": 1}
    await create_endpoint(cluster, body)
    await converge(cluster, controller)
    (old,) = await c.list(kube.DEPLOYMENTS, NS)
    assert old["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    await c.patch(kube.ENDPOINTS, NS, "llama", {"spec": {"modelSource": {"revision": "v2"}}})
    old_sizes: list[int] = []
    for _ in range(20):
        cluster.on_round()
        await cluster.agents()
        await cluster.kubelet()
        deps = await c.list(kube.DEPLOYMENTS, NS)
        assert sum(d["spec"]["replicas"] for d in deps) <= 2
        old_sizes += [
            d["spec"]["replicas"] for d in deps if d["metadata"]["name"] == old["metadata"]["name"]
        ]
        result = await controller.reconcile()
        if not result.actions:
            break
    (new,) = await c.list(kube.DEPLOYMENTS, NS)
    assert new["metadata"]["name"] != old["metadata"]["name"]
    assert new["spec"]["replicas"] == 2
    assert 1 in old_sizes, old_sizes


async def test_image_cache_shared_by_two_endpoints(env: tuple[FakeCluster, Controller]) -> None:
    cluster, controller = env
    c = cluster.client
    await create_endpoint(cluster, endpoint_body("a"))
    await create_endpoint(cluster, endpoint_body("b"))
    await converge(cluster, controller)
    (image,) = await c.list(kube.IMAGE_CACHES, NS)
    assert [p["name"] for p in image["spec"]["parentReferences"]] == ["a", "b"]
    assert image["status"]["references"] == 2
    assert len(await c.list(kube.DAEMONSETS, NS)) == 1

    await c.delete(kube.ENDPOINTS, NS, "a")
    await converge(cluster, controller)
    (image,) = await c.list(kube.IMAGE_CACHES, NS)
    assert [p["name"] for p in image["spec"]["parentReferences"]] == ["b"]
    assert len(await c.list(kube.DAEMONSETS, NS)) == 1

    await c.delete(kube.ENDPOINTS, NS, "b")
    await converge(cluster, controller)
    assert await c.list(kube.IMAGE_CACHES, NS) == []
    assert await c.list(kube.DAEMONSETS, NS) == []


async def test_a_removed_variant_loses_its_service(env: tuple[FakeCluster, Controller]) -> None:
    cluster, controller = env
    c = cluster.client
    body = endpoint_body("llama")
    body["spec"]["variants"].append({"name": "canary", "replicas": 1})
    await create_endpoint(cluster, body)
    await converge(cluster, controller)

    async def services() -> list[str]:
        return sorted(s["metadata"]["name"] for s in await c.list(kube.SERVICES, NS))

    assert await services() == ["llama", "llama-canary", "llama-main"]
    await c.patch(kube.ENDPOINTS, NS, "llama", {"spec": {"variants": [{"name": "main"}]}})
    await converge(cluster, controller)
    assert await services() == ["llama", "llama-main"]
    assert all("canary" not in d["metadata"]["name"] for d in await c.list(kube.DEPLOYMENTS, NS))


async def test_services_lost_between_deployment_and_services_come_back(
    env: tuple[FakeCluster, Controller],
) -> None:
    """An operator killed after applying a Deployment but before its Services (seen on a real
    API server, tests/k8s/test_k8s_faults.py): the next pass, which plans nothing for the
    unchanged Deployment, still creates them."""
    cluster, controller = env
    c = cluster.client
    await create_endpoint(cluster, endpoint_body("llama"))
    await converge(cluster, controller)
    for name in ("llama", "llama-main"):
        await c.delete(kube.SERVICES, NS, name)
    await controller.reconcile()
    assert sorted(s["metadata"]["name"] for s in await c.list(kube.SERVICES, NS)) == [
        "llama",
        "llama-main",
    ]


async def test_node_replacement(env: tuple[FakeCluster, Controller]) -> None:
    cluster, controller = env
    c = cluster.client
    await create_endpoint(cluster, endpoint_body("e", replicas=3))
    await converge(cluster, controller)
    (cache,) = await c.list(kube.MODEL_CACHES, NS)
    label = names.weights_label(cache["metadata"]["name"])

    await c.delete(kube.NODES, None, "n1")  # the node is replaced
    await cluster.add_node("n3")
    result = await controller.reconcile()
    assert any(getattr(a, "node", None) == "n3" for a in result.actions)
    node = (await cluster.nodes())["n3"]
    assert cache["metadata"]["name"] in node["metadata"]["annotations"][render.ANN_ASSIGNED]
    await cluster.agents()
    await cluster.kubelet()
    await converge(cluster, controller)
    assert (await cluster.nodes())["n3"]["metadata"]["labels"][label] == "ready"
    endpoint = await c.get(kube.ENDPOINTS, NS, "e")
    assert endpoint is not None
    assert endpoint["status"]["readyReplicas"] == 3
    assert {r["node"] for r in endpoint["status"]["replicaStatus"]} == {"n0", "n2", "n3"}
    (cache,) = await c.list(kube.MODEL_CACHES, NS)
    assert cache["status"]["targetNodes"] == 3
    assert cache["status"]["readyNodes"] == 3


async def test_unhealthy_cache_drops_the_label(env: tuple[FakeCluster, Controller]) -> None:
    cluster, controller = env
    c = cluster.client
    await create_endpoint(cluster, endpoint_body("e"))
    await converge(cluster, controller)
    (cache,) = await c.list(kube.MODEL_CACHES, NS)
    name = cache["metadata"]["name"]
    bad = f'{{"{name}": {{"state": "ready", "healthy": false, "bytesDone": 1, "bytesTotal": 100}}}}'
    await c.patch(
        kube.NODES, None, "n2", {"metadata": {"annotations": {render.ANN_CACHE_STATUS: bad}}}
    )
    await controller.reconcile()
    assert names.weights_label(name) not in (await cluster.managed_labels())["n2"]
    (cache,) = await c.list(kube.MODEL_CACHES, NS)
    assert cache["status"]["state"] == "Downloading"
    assert any(cond["type"] == "NodeUnhealthy" for cond in cache["status"]["conditions"])


async def test_a_removed_node_selector_key_is_removed_from_cache_and_deployment(
    env: tuple[FakeCluster, Controller],
) -> None:
    """A merge patch keeps map keys it does not mention: dropping a selector key from the
    endpoint must still reach the ModelCache and the pod template (and the pass converge)."""
    cluster, controller = env
    c = cluster.client
    for node in ("n0", "n1", "n2"):
        await c.patch(kube.NODES, None, node, {"metadata": {"labels": {"zone": "a"}}})
    body = endpoint_body("e")
    body["spec"]["nodeSelector"] = {"pool": "gpu", "zone": "a"}
    await create_endpoint(cluster, body)
    await converge(cluster, controller)
    await c.patch(kube.ENDPOINTS, NS, "e", {"spec": {"nodeSelector": {"zone": None}}})
    await converge(cluster, controller)
    (cache,) = await c.list(kube.MODEL_CACHES, NS)
    assert cache["spec"]["nodeSelector"] == {"pool": "gpu"}
    (dep,) = await c.list(kube.DEPLOYMENTS, NS)
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
