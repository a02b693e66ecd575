"""Optimistic concurrency against the real API server: the operator's read-modify-write of a
ModelCache's spec meets an object changed since it was read, the server refuses the
stale write (409 Conflict, resourceVersion precondition), and the operator reads again and
retries. The conflict is forced: the controller (in process, the operator's own reconcile pass)
runs on a client whose reads are followed by a change made by another writer (the admin).
Opt-in: ``make k8s-e2e``."""

from __future__ import annotations

import ssl
import time
from typing import Any

import aiohttp
import pytest

from k8s.controlplane import ControlPlane
from k8s.endpoints import inference_endpoint
from k8s.k8s_results import ENABLED, SKIP_REASON, Results
from warmfleet.kube import client as kube
from warmfleet.operator.controller import Controller

pytestmark = [pytest.mark.k8s, pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)]

NS = "conflicts"
Obj = dict[str, Any]


class ChangedAfterRead(kube.KubeClient):
    """Right after the first read of each existing object of ``kinds``, another writer changes
    it: what this client returns is then one resourceVersion behind the server."""

    def __init__(self, plane: ControlPlane, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plane = plane
        self.kinds: set[str] = set()
        self.changed: list[str] = []

    async def get(self, resource: kube.Resource, namespace: str | None, name: str) -> Obj | None:
        obj = await super().get(resource, namespace, name)
        if obj is not None and resource.plural in self.kinds:
            self.kinds.discard(resource.plural)
            path = resource.path(namespace, name)
            patch = {"metadata": {"annotations": {"e2e.warmfleet.dev/other-writer": "1"}}}
            status, body = self.plane.request("PATCH", path, patch)
            assert status == 200, body
            self.changed.append(f"{resource.plural}/{name}")
        return obj


SIGNED = "https://b.s3.amazonaws.com/w.bin?X-Amz-Date={0}&X-Amz-Expires=3600&X-Amz-Signature={0}"


def endpoint(signature: str) -> Obj:
    return inference_endpoint(
        "gamma",
        NS,
        modelSource={"uri": SIGNED.format(signature), "revision": "r1"},
        modelCacheConfig={"weightsCache": {"enabled": True, "gate": {"mode": "none"}}},
    )


async def test_conflicts_are_retried(
    control_plane: ControlPlane, crds: int, results: Results
) -> None:
    plane = control_plane
    status, body = plane.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": NS}, "apiVersion": "v1"}
    )
    assert status == 201, body
    path = f"/apis/warmfleet.dev/v1alpha1/namespaces/{NS}/inferenceendpoints"
    status, body = plane.request("POST", path, endpoint("1"))
    assert status == 201, body
    context = ssl.create_default_context(cafile=str(plane.ca_path))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            client = ChangedAfterRead(plane, session, plane.server, token=plane.token)
            controller = Controller(client, NS, time.time)
            await controller.reconcile()  # creates the ModelCache, Deployment and Services
            assert len(await client.list(kube.MODEL_CACHES, NS)) == 1
            # the source signed again: the same cache (a new node selector is a new one), its
            # spec re-applied (read, merge patch, write)
            patch = {"spec": {"modelSource": {"uri": SIGNED.format("2"), "revision": "r1"}}}
            status, body = plane.request("PATCH", f"{path}/gamma", patch)
            assert status == 200, body
            client.kinds = {"modelcaches"}
            await controller.reconcile()
            client.kinds = set()
            caches = await client.list(kube.MODEL_CACHES, NS)
    finally:
        plane.request("DELETE", f"/api/v1/namespaces/{NS}")
    results.record(conflicts_retried=client.conflicts_retried, conflicts_forced=client.changed)
    assert client.changed
    assert client.conflicts_retried >= 1
    # the retried write was computed from the fresh object: the new signature is there and the
    # other writer's change was kept
    (cache,) = caches
    assert cache["spec"]["modelSource"]["uri"] == SIGNED.format("2")
    assert cache["metadata"]["annotations"].get("e2e.warmfleet.dev/other-writer") == "1"
