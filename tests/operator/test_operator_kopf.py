"""The real kopf operator (handlers, watch stream, finalizer) against kmock."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import kopf
from kmock_cluster import NS, FakeCluster, declare_resources, endpoint_body, forget_requests

from warmfleet.kube import client as kube
from warmfleet.operator.handlers import build_registry


async def _until(check: Any, cluster: FakeCluster, *, rounds: int = 150) -> None:
    for _ in range(rounds):
        cluster.on_round()
        await cluster.agents()
        await cluster.kubelet()
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached")


async def test_kopf_create_deploy_delete(kmock: Any) -> None:
    declare_resources(kmock)
    registry = build_registry(NS, server=str(kmock.url), interval_s=0.3)

    @kopf.on.startup(registry=registry)
    async def _quiet(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True

    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry, namespaces=[NS], standalone=True, stop_flag=stop, ready_flag=ready
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), timeout=20)
        async with aiohttp.ClientSession() as session:
            cluster = FakeCluster(session, str(kmock.url), on_round=lambda: forget_requests(kmock))
            c = cluster.client
            await cluster.add_node("n0")
            await cluster.add_node("n1")
            body = endpoint_body("llama")
            # kmock does not maintain resourceVersion; kopf's JSON patches carry a `test` op on it,
            # so the object starts with one (constant: kmock has no optimistic concurrency).
            body["metadata"]["resourceVersion"] = "1"
            await c.create(kube.ENDPOINTS, NS, body)

            async def deployed() -> bool:
                obj = await c.get(kube.ENDPOINTS, NS, "llama")
                return bool(obj and (obj.get("status") or {}).get("phase") == "Ready")

            await _until(deployed, cluster)
            obj = await c.get(kube.ENDPOINTS, NS, "llama")
            assert obj is not None
            assert "warmfleet.dev/finalizer" in obj["metadata"]["finalizers"]
            assert len(await c.list(kube.DEPLOYMENTS, NS)) == 1

            await c.delete(kube.ENDPOINTS, NS, "llama")

            async def gone() -> bool:
                return await c.get(kube.ENDPOINTS, NS, "llama") is None

            await _until(gone, cluster)
            assert await c.list(kube.DEPLOYMENTS, NS) == []
            assert await c.list(kube.MODEL_CACHES, NS) == []
            assert await c.list(kube.IMAGE_CACHES, NS) == []
    finally:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, timeout=20)
