"""The operator's reconciliation passes against kmock's stateful Kubernetes API emulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kmock_cluster import NS, FakeCluster, declare_resources, endpoint_body, forget_requests

from support.servers import Handler, serving
from warmfleet.api import names
from warmfleet.control.load import in_flight_by_variant
from warmfleet.kube import client as kube
from warmfleet.kube.access import read_token
from warmfleet.kube.endpointslices import SERVICE_NAME_LABEL as SERVICE_LABEL
from warmfleet.operator import render
from warmfleet.operator.controller import Controller, PassResult
from warmfleet.operator.gateway_metrics import GatewayService, scraper

FINALIZER = "warmfleet.dev/finalizer"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


@pytest.fixture
async def env(kmock: Any) -> AsyncIterator[tuple[FakeCluster, Controller]]:
    declare_resources(kmock)
    async with aiohttp.ClientSession() as session:
        cluster = FakeCluster(session, str(kmock.url), on_round=lambda: forget_requests(kmock))
        controller = Controller(kube.KubeClient(session, str(kmock.url)), NS, Clock())
        for i in range(3):
            await cluster.add_node(f"n{i}")
        yield cluster, controller


async def converge(cluster: FakeCluster, controller: Controller, rounds: int = 12) -> PassResult:
    released: set[str] = set()
    for _ in range(rounds):
        cluster.on_round()
        await cluster.agents()
        await cluster.kubelet()
        result = await controller.reconcile()
        released |= result.released
        for name in result.released:  # what kopf does once its delete handler succeeds
            await cluster.client.patch(kube.ENDPOINTS, NS, name, {"metadata": {"finalizers": []}})
        if not result.actions:
            result.released = released
            return result
    raise AssertionError(f"no convergence; last actions {result.actions}")


async def create_endpoint(cluster: FakeCluster, body: dict[str, Any]) -> None:
    body["metadata"]["finalizers"] = [FINALIZER]  # kopf adds it on a real cluster
    await cluster.client.create(kube.ENDPOINTS, NS, body)


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


async def test_autoscaling_from_gateway_metrics(kmock: Any) -> None:
    declare_resources(kmock)
    text = 'warmfleet_gateway_in_flight_requests{endpoint="e",instance_id="i0",variant="main"} 70\n'
    kmock["get /gateway/metrics"] << text.encode()
    async with aiohttp.ClientSession() as session:
        cluster = FakeCluster(session, str(kmock.url), on_round=lambda: forget_requests(kmock))
        scrape = scraper(
            session, [f"{kmock.url}/gateway/metrics", "http://127.0.0.1:9/unreachable"]
        )
        controller = Controller(
            kube.KubeClient(session, str(kmock.url)), NS, Clock(), metrics=scrape
        )
        for i in range(4):
            await cluster.add_node(f"n{i}")
        body = endpoint_body("e", replicas=1)
        body["spec"]["variants"][0]["autoscaling"] = {
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 3,
            "targetInFlightPerReplica": 10,
        }
        await create_endpoint(cluster, body)
        await converge(cluster, controller)
        (dep,) = await cluster.client.list(kube.DEPLOYMENTS, NS)
        assert dep["spec"]["replicas"] == 3  # 70 in flight / 10 per replica, capped at max 3
        endpoint = await cluster.client.get(kube.ENDPOINTS, NS, "e")
        assert endpoint is not None
        assert (
            endpoint["metadata"]["annotations"]["warmfleet.dev/autoscaled-replicas"]
            == '{"main": 3}'
        )


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


def gateway_slice(name: str, port: int, pods: dict[str, bool], service: str) -> dict[str, Any]:
    """One EndpointSlice of ``service``: every pod on 127.0.0.1 at ``port``, ready or not."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {SERVICE_LABEL: service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
            }
            for pod, ready in pods.items()
        ],
    }


async def test_a_gateway_service_is_scraped_pod_by_pod(kmock: Any) -> None:
    """A Service URL reaches one gateway replica per request; --gateway-service lists the
    Service's ready pods and scrapes each, and a pod that cannot be read is reported as such
    (None), so the autoscaler knows the sum is partial."""
    declare_resources(kmock)
    kmock.resources["discovery.k8s.io/v1/endpointslices"] = kmock.ResourceInfo(
        kind="EndpointSlice", namespaced=True, verbs=["get", "list", "watch", "create"]
    )
    line = 'warmfleet_gateway_in_flight_requests{{endpoint="e",instance_id="{}",variant="v"}} {}\n'

    def metrics(value: int) -> Handler:
        async def handler(_: web.Request) -> web.Response:
            return web.Response(text=line.format(value, value))

        return handler

    async with (
        serving({"/metrics": metrics(30)}) as (first, _),
        serving({"/metrics": metrics(12)}) as (second, _),
        aiohttp.ClientSession() as session,
    ):
        client = kube.KubeClient(session, str(kmock.url))
        for i, url in enumerate((first, second)):
            port = int(url.rsplit(":", 1)[1])
            body = gateway_slice(f"gw-{i}", port, {f"gw-{i}": True}, "warmfleet-gateway")
            await client.create(kube.ENDPOINT_SLICES, NS, body)
        for name, pods, service in (
            ("gw-off", {"gw-starting": False}, "warmfleet-gateway"),  # not ready: skipped
            ("gw-dead", {"gw-dead": True}, "warmfleet-gateway"),  # ready but not answering
            ("other", {"other": True}, "another-service"),
        ):
            await client.create(kube.ENDPOINT_SLICES, NS, gateway_slice(name, 9, pods, service))
        gateway = GatewayService.parse(f"{NS}/warmfleet-gateway:http")
        texts = await scraper(session, [], [gateway], client, timeout_s=2.0)()
    assert sorted(t is None for t in texts) == [False, False, True]
    assert in_flight_by_variant([t for t in texts if t]) == {("e", "v"): 42.0}


def test_gateway_service_references() -> None:
    assert GatewayService.parse("ns/gw") == GatewayService("ns", "gw", "http")
    assert GatewayService.parse("ns/gw:8080") == GatewayService("ns", "gw", 8080)
    assert GatewayService.parse("ns/gw:metrics") == GatewayService("ns", "gw", "metrics")
    for bad in ("gw", "/gw", "ns/", "ns/gw:", "ns/a/b"):
        with pytest.raises(ValueError, match="namespace/name"):
            GatewayService.parse(bad)


async def test_the_client_reads_a_rotating_token_at_every_request(tmp_path: Path) -> None:
    """The kubelet rewrites a projected service-account token before it expires; a client that
    read it once at start gets 401s an hour later (kopf's own login re-reads it)."""
    seen: list[str | None] = []

    async def nodes(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"items": []})

    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    async with serving({"/api/v1/nodes": nodes}) as (url, _), aiohttp.ClientSession() as session:
        client = kube.KubeClient(session, url, token=lambda: read_token(str(token_file)))
        await client.list(kube.NODES, None)
        token_file.write_text("second\n")
        await client.list(kube.NODES, None)
        token_file.unlink()  # between the kubelet's unlink and rename: no header
        await client.list(kube.NODES, None)
        await kube.KubeClient(session, url, token="fixed").list(kube.NODES, None)
    assert seen == ["Bearer first", "Bearer second", None, "Bearer fixed"]
