"""A fake cluster on kmock: resources for discovery, plus stand-ins for what kmock lacks.

kmock stores objects and serves list/watch/patch/delete with finalizers and deletionTimestamp,
but runs no controllers. ``FakeCluster`` plays the ones the operator depends on:
the node agent (fills assigned caches, reports them in a Node annotation), the scheduler +
kubelet (pods for Deployments and DaemonSets, placed by preferred node affinity, Ready at once)
and the garbage collector for pods of deleted owners. The operator tests drive it with a
ticking ``Clock``, ``create_endpoint`` (with the finalizer kopf adds) and ``converge``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from warmfleet.api import names
from warmfleet.control.claims import CONDITION
from warmfleet.kube import client as kube
from warmfleet.operator import render
from warmfleet.operator.controller import Controller, PassResult

Obj = dict[str, Any]
NS = "default"
TS = "2026-11-29T12:00:00+00:00"
JSON = "application/json"

RESOURCES = {
    "v1/nodes": ("Node", False, ()),
    "v1/pods": ("Pod", True, ()),
    "v1/services": ("Service", True, ()),
    "v1/events": ("Event", True, ()),
    "v1/namespaces": ("Namespace", False, ()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, ()),
    "apps/v1/deployments": ("Deployment", True, ("status",)),
    "apps/v1/daemonsets": ("DaemonSet", True, ("status",)),
    "warmfleet.dev/v1alpha1/inferenceendpoints": ("InferenceEndpoint", True, ("status",)),
    "warmfleet.dev/v1alpha1/modelcaches": ("ModelCache", True, ("status",)),
    "warmfleet.dev/v1alpha1/imagecaches": ("ImageCache", True, ("status",)),
}


def declare_resources(kmock: Any) -> None:
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    for key, (kind, namespaced, subs) in RESOURCES.items():
        kmock.resources[key] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, verbs=verbs, subresources=list(subs)
        )


def forget_requests(kmock: Any) -> None:
    """kmock keeps every request for assertions and its filters rescan that log on each new
    request (quadratic); these tests assert on objects only, so the log is dropped per round."""
    kmock._requests.clear()


def endpoint_body(
    name: str, revision: str = "v1", image: str = "vllm/vllm-openai:v0.9", replicas: int = 2
) -> Obj:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "modelSource": {"uri": f"s3://models/{name}", "revision": revision},
            "image": image,
            "modelCacheConfig": {
                "weightsCache": {"enabled": True},
                "imageCache": {"enabled": True},
            },
            "variants": [{"name": "main", "replicas": replicas}],
        },
    }


class FakeCluster:
    def __init__(
        self, session: aiohttp.ClientSession, url: str, on_round: Callable[[], None]
    ) -> None:
        self.client = kube.KubeClient(session, url)
        self.on_round = on_round
        self._pods = 0

    async def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels or {"pool": "gpu"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        await self.client.create(kube.NODES, None, body)

    async def nodes(self) -> dict[str, Obj]:
        return {n["metadata"]["name"]: n for n in await self.client.list(kube.NODES, None)}

    async def agents(self, only: Iterable[str] | None = None) -> None:
        """Each node's agent fills what is assigned to it and evicts the rest."""
        allowed = None if only is None else set(only)
        for name, node in (await self.nodes()).items():
            ann = node["metadata"].get("annotations") or {}
            assigned = [a["cache"] for a in json.loads(ann.get(render.ANN_ASSIGNED, "[]"))]
            have = json.loads(ann.get(render.ANN_CACHE_STATUS, "{}"))
            report = {c: r for c, r in have.items() if c in assigned}
            for cache in assigned:
                if cache not in report and (allowed is None or name in allowed):
                    report[cache] = {
                        "state": "ready",
                        "bytesDone": 100,
                        "bytesTotal": 100,
                        "healthy": True,
                    }
            patch = {"metadata": {"annotations": {render.ANN_CACHE_STATUS: json.dumps(report)}}}
            await self.client.patch(kube.NODES, None, name, patch)

    async def kubelet(self) -> None:
        """Pods for Deployments (preferred affinity) and puller DaemonSets; GC of orphans."""
        nodes = await self.nodes()
        pods = await self.client.list(kube.PODS, NS)
        deployments = await self.client.list(kube.DEPLOYMENTS, NS)
        daemonsets = await self.client.list(kube.DAEMONSETS, NS)
        owners = {d["metadata"]["name"] for d in deployments + daemonsets}
        for pod in pods:
            owner = pod["metadata"]["labels"].get("owner")
            if owner not in owners or pod["spec"]["nodeName"] not in nodes:
                await self.client.delete(kube.PODS, NS, pod["metadata"]["name"])
        pods = list(await self.client.list(kube.PODS, NS))
        for dep in deployments:
            await self._scale(
                dep,
                [p for p in pods if p["metadata"]["labels"]["owner"] == dep["metadata"]["name"]],
                nodes,
            )
        for ds in daemonsets:
            mine = {
                p["spec"]["nodeName"]
                for p in pods
                if p["metadata"]["labels"]["owner"] == ds["metadata"]["name"]
            }
            selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
            for name, node in nodes.items():
                labels = node["metadata"].get("labels") or {}
                if name not in mine and all(labels.get(k) == v for k, v in selector.items()):
                    await self._pod(ds, name)

    async def _scale(self, dep: Obj, pods: list[Obj], nodes: dict[str, Obj]) -> None:
        want = dep["spec"]["replicas"]
        for pod in pods[want:]:
            await self.client.delete(kube.PODS, NS, pod["metadata"]["name"])
        used = {p["spec"]["nodeName"] for p in pods}
        terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]

        def score(name: str) -> tuple[int, str]:
            labels = nodes[name]["metadata"].get("labels") or {}
            total = sum(
                t["weight"]
                for t in terms
                if labels.get(t["preference"]["matchExpressions"][0]["key"]) == "ready"
            )
            return (-total, name)

        free = sorted((n for n in nodes if n not in used), key=score)
        for name in free[: max(0, want - len(pods))]:
            await self._pod(dep, name)

    async def _pod(self, owner: Obj, node: str) -> None:
        self._pods += 1
        labels = dict(owner["spec"]["template"]["metadata"]["labels"])
        labels["owner"] = owner["metadata"]["name"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{owner['metadata']['name']}-{self._pods}",
                "namespace": NS,
                "labels": labels,
            },
            "spec": {"nodeName": node},
            "status": {
                "startTime": TS,
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": TS}],
            },
        }
        await self.client.create(kube.PODS, NS, body)

    async def managed_labels(self) -> dict[str, set[str]]:
        return {
            n: {k for k in (o["metadata"].get("labels") or {}) if names.is_managed_label(k)}
            for n, o in (await self.nodes()).items()
        }


_VERSIONS = itertools.count(1)  # resourceVersions, one sequence for every ServerClient


class ServerClient(kube.KubeClient):
    """A client whose API server checks what kmock does not, as a real API server does: it
    gives each object it creates a uid; it versions what it writes (each create or merge patch
    gets a new ``resourceVersion``, one sequence over every ServerClient: another writer's
    change through one of its own is seen); it refuses (409) a DELETE whose
    ``preconditions.uid`` or ``preconditions.resourceVersion`` is not the object's, and a
    patch whose ``metadata.resourceVersion`` is not the object's. (A write through a plain
    client, such as ``FakeCluster.client``, changes no version.) ``race(path)``: another
    writer's work, done before each request of a method in ``on`` (DELETE unless told) reaches
    the server until it says it acted (e.g. the object deleted and created again)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        race: Callable[[str], Awaitable[bool]] | None = None,
        on: Iterable[str] = ("DELETE",),
    ) -> None:
        super().__init__(session, url)
        self._race = race
        self._on = frozenset(on)
        self._uids = 0

    async def _call(
        self, method: str, path: str, body: Obj | None = None, *, content_type: str = JSON
    ) -> Obj:
        if method == "POST" and body is not None and "uid" not in body["metadata"]:
            self._uids += 1
            body = {**body, "metadata": {**body["metadata"], "uid": f"server-{self._uids}"}}
        if method in self._on and self._race is not None and await self._race(path):
            self._race = None
        if method == "DELETE":
            await self._check(method, path, (body or {}).get("preconditions") or {})
        elif method in {"POST", "PATCH"} and isinstance(body, dict):
            meta = body.get("metadata") or {}
            if method == "PATCH":
                await self._check(method, path, {"resourceVersion": meta.get("resourceVersion")})
            body = {**body, "metadata": {**meta, "resourceVersion": str(next(_VERSIONS))}}
        return await super()._call(method, path, body, content_type=content_type)

    async def _check(self, method: str, path: str, wanted: Obj) -> None:
        """409 unless the object at ``path`` has the uid and resourceVersion ``wanted``."""
        wanted = {k: v for k, v in wanted.items() if k in {"uid", "resourceVersion"} and v}
        if not wanted:
            return
        try:
            current = await super()._call("GET", path.removesuffix("/status"))
        except kube.KubeError as err:
            if err.status != 404:
                raise
            return  # gone: the request itself says so
        for field, value in wanted.items():
            if current["metadata"].get(field) != value:
                raise kube.KubeError(f"{method} {path}: HTTP 409: {field} precondition", status=409)


FINALIZER = "warmfleet.dev/finalizer"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


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


async def get_object(cluster: FakeCluster, resource: kube.Resource, name: str) -> Obj | None:
    return await cluster.client.get(resource, NS, name)


async def conflict_message(cluster: FakeCluster, endpoint: str = "llama") -> str | None:
    """The message of the endpoint's ``NameConflict`` condition (None: it has none)."""
    obj = await get_object(cluster, kube.ENDPOINTS, endpoint)
    assert obj is not None
    found = [c for c in obj["status"]["conditions"] if c["type"] == CONDITION]
    return found[0]["message"] if found else None


async def taken_once_free(
    cluster: FakeCluster, controller: Controller, resource: kube.Resource, name: str
) -> Obj:
    """Someone else's object ``name`` deleted: the endpoint makes its own, its conflict gone."""
    await cluster.client.delete(resource, NS, name)
    await converge(cluster, controller)
    mine = await get_object(cluster, resource, name)
    assert mine is not None
    assert await conflict_message(cluster) is None
    return mine


Env = tuple[FakeCluster, aiohttp.ClientSession, str]


@asynccontextmanager
async def server_env(kmock: Any, nodes: int = 2) -> AsyncIterator[Env]:
    """A FakeCluster of ``nodes`` nodes on kmock (its resources declared), with the session and
    URL a ``server_controller`` talks to it through."""
    declare_resources(kmock)
    async with aiohttp.ClientSession() as session:
        cluster = FakeCluster(session, str(kmock.url), on_round=lambda: forget_requests(kmock))
        for i in range(nodes):
            await cluster.add_node(f"n{i}")
        yield cluster, session, str(kmock.url)


def server_controller(
    env: Env,
    race: Callable[[str], Awaitable[bool]] | None = None,
    on: Iterable[str] = ("DELETE",),
) -> Controller:
    """An operator whose client plays the API server (``ServerClient``: uids, preconditions),
    ``race`` run before its first ``on`` request to an object."""
    _, session, url = env
    return Controller(ServerClient(session, url, race, on), NS, Clock())
