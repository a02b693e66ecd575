"""What the operator reads besides the cluster's objects: autoscaling from the gateways'
in-flight metrics (against kmock), a gateway Service scraped pod by pod through its
EndpointSlices, ``--gateway-service`` references, and a service-account token re-read at every
request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
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

from support.servers import Handler, serving
from support.slices import endpoint_slice
from warmfleet.control.load import in_flight_by_variant
from warmfleet.kube import client as kube
from warmfleet.kube.access import read_token
from warmfleet.operator.controller import Controller
from warmfleet.operator.gateway_metrics import GatewayService, scraper


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
            body = endpoint_slice(f"gw-{i}", "warmfleet-gateway", NS, port, {f"gw-{i}": True})
            await client.create(kube.ENDPOINT_SLICES, NS, body)
        for name, pods, service in (
            ("gw-off", {"gw-starting": False}, "warmfleet-gateway"),  # not ready: skipped
            ("gw-dead", {"gw-dead": True}, "warmfleet-gateway"),  # ready but not answering
            ("other", {"other": True}, "another-service"),
        ):
            await client.create(
                kube.ENDPOINT_SLICES, NS, endpoint_slice(name, service, NS, 9, pods)
            )
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
