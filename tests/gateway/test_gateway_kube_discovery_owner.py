"""Two InferenceEndpoints that derive one Service name (endpoint ``chat`` variant ``prod-main``
and endpoint ``chat-prod`` variant ``main`` both name ``chat-prod-main``): the gateway follows
that Service's slices only for the endpoint the Service's controller ``ownerReference`` names
(by uid), the other variant has no instances and says why, and the name changing hands moves
the engines with it. Against kmock's API emulator, Services declared next to the slices."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from gateway_support import FakeBackend, backends_running, gateway_doc
from test_gateway_kube_discovery import NS, SLICES, declare, declare_endpoints, slice_body

from support.waiting import wait_until
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import InferenceEndpointsSource, parse_gateway_config
from warmfleet.gateway.discovery.inference_endpoints import derive_endpoint
from warmfleet.gateway.server import StartedApp, start_app
from warmfleet.kube.owners import endpoint_service_problem

TOKEN = "admin-token-0123456789"
SERVICES = f"/api/v1/namespaces/{NS}/services"
OBJECTS = f"/apis/warmfleet.dev/v1alpha1/namespaces/{NS}/inferenceendpoints"
SHARED = "chat-prod-main"  # chat/prod-main and chat-prod/main
UID = {"chat": "uid-chat-1", "chat-prod": "uid-chat-prod-1"}
LOGGER = "warmfleet.gateway.discovery.kubernetes"


def declare_services(kmock: Any) -> None:
    kmock.resources["v1/services"] = kmock.ResourceInfo(
        kind="Service", namespaced=True, verbs=["get", "list", "watch", "create", "patch", "delete"]
    )


def endpoint_object(name: str, variant: str) -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name, "namespace": NS, "uid": UID[name]},
        "spec": {
            "modelSource": {"uri": f"s3://models/{name}", "revision": "v1"},
            "image": "vllm/vllm-openai:v0.9",
            "variants": [{"name": variant, "routing": {"strategy": {"type": "round_robin"}}}],
        },
    }


def controller(endpoint: str, uid: str | None = None) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "warmfleet.dev/v1alpha1",
            "kind": "InferenceEndpoint",
            "name": endpoint,
            "uid": uid or UID[endpoint],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def service_object(name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": owners},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }


async def started(kmock: Any, session: aiohttp.ClientSession, backend: FakeBackend) -> StartedApp:
    declare(kmock)
    declare_endpoints(kmock)
    declare_services(kmock)
    api = str(kmock.url).rstrip("/")
    access = {"apiServer": api, "tokenPath": "/nonexistent/token", "caPath": "/nx/ca.crt"}
    doc = gateway_doc([], admin_token=TOKEN)
    doc["spec"]["endpoints"] = []
    doc["spec"]["inferenceEndpoints"] = {"namespace": NS, "retryIntervalS": 0.05, **access}
    doc["spec"]["modelSelectsEndpoint"] = True
    await session.post(api + SLICES, json=slice_body(f"{SHARED}-x", SHARED, {backend: True}))
    await session.post(api + OBJECTS, json=endpoint_object("chat", "prod-main"))
    await session.post(api + OBJECTS, json=endpoint_object("chat-prod", "main"))
    return await start_app(create_app(parse_gateway_config(doc)))


def served(gw: StartedApp) -> dict[str, list[str]]:
    return {
        f"{name}/{v.name}": sorted(v.instances)
        for name, ep in gw.gateway.state.endpoints.items()
        for v in ep.variants.values()
    }


async def problem(session: aiohttp.ClientSession, gw: StartedApp, variant: str) -> str | None:
    endpoint, name = variant.split("/")
    url = f"{gw.url}/admin/v1/endpoints/{endpoint}/variants/{name}"
    async with session.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 200
        found: str | None = (await resp.json())["discovery_problem"]
    async with session.get(
        gw.url + "/admin/v1/endpoints", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as resp:
        listed = {
            f"{e['name']}/{v['name']}": v["discovery_problem"]
            for e in (await resp.json())["endpoints"]
            for v in e["variants"]
        }
    assert listed[variant] == found
    return found


async def test_only_the_services_owner_gets_its_engines(
    kmock: Any, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """The Service is chat-prod's: chat/prod-main gets none of its engines (503, one warning,
    the reason in the admin API) while the slices change; once the name is chat's, the engines
    move to chat/prod-main."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    api = str(kmock.url).rstrip("/")
    async with backends_running("a", "b") as (a, b):
        await session.post(api + SERVICES, json=service_object(SHARED, controller("chat-prod")))
        gw = await started(kmock, session, a)
        try:
            owned = {"chat/prod-main": [], "chat-prod/main": ["pod-a"]}
            await wait_until(lambda: served(gw) == owned)
            assert "belongs to InferenceEndpoint chat-prod" in str(
                await problem(session, gw, "chat/prod-main")
            )
            assert await problem(session, gw, "chat-prod/main") is None
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 503
                assert resp.headers.get("x-warmfleet-instance") in (None, "none")

            # Slice events while the Service is chat-prod's: still nothing for chat, no more logs.
            await session.post(api + SLICES, json=slice_body(f"{SHARED}-y", SHARED, {b: True}))
            await wait_until(lambda: served(gw)["chat-prod/main"] == ["pod-a", "pod-b"])
            assert served(gw)["chat/prod-main"] == []
            warned = [
                r for r in caplog.records if r.name == LOGGER and "chat/prod-main" in r.getMessage()
            ]
            assert [r.levelno for r in warned] == [logging.WARNING]

            # The name changes hands: the engines follow the Service's owner.
            await session.patch(
                api + f"{SERVICES}/{SHARED}",
                json={"metadata": {"ownerReferences": controller("chat")}},
            )
            moved = {"chat/prod-main": ["pod-a", "pod-b"], "chat-prod/main": []}
            await wait_until(lambda: served(gw) == moved)
            assert await problem(session, gw, "chat/prod-main") is None
            assert "belongs to InferenceEndpoint chat " in str(
                await problem(session, gw, "chat-prod/main")
            )
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        finally:
            await gw.stop()


async def test_a_missing_service_gives_no_instances_until_made(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    """Slices without their Service (or a Service left by a deleted endpoint of the same name,
    another uid) give nothing; the Service made for the endpoint brings its engines."""
    api = str(kmock.url).rstrip("/")
    async with backends_running("a") as (a,):
        gw = await started(kmock, session, a)
        try:
            await wait_until(lambda: len(gw.gateway.kube_discovery.problems) == 2)
            assert served(gw) == {"chat/prod-main": [], "chat-prod/main": []}
            assert "does not exist" in str(await problem(session, gw, "chat-prod/main"))
            stale = controller("chat-prod", uid="uid-of-a-deleted-one")
            await session.post(api + SERVICES, json=service_object(SHARED, stale))
            await wait_until(
                lambda: "uid-of-a-deleted-one" in str(gw.gateway.kube_discovery.problems)
            )
            assert served(gw) == {"chat/prod-main": [], "chat-prod/main": []}
            await session.patch(
                api + f"{SERVICES}/{SHARED}",
                json={"metadata": {"ownerReferences": controller("chat-prod")}},
            )
            await wait_until(
                lambda: served(gw) == {"chat/prod-main": [], "chat-prod/main": ["pod-a"]}
            )
            assert await problem(session, gw, "chat-prod/main") is None
        finally:
            await gw.stop()


def test_derived_variants_carry_the_endpoints_uid() -> None:
    """The uid goes into the variant's discovery; an object without one (never from a real API
    server) derives the unchecked discovery of before."""
    source = InferenceEndpointsSource(namespace=NS)
    derived = derive_endpoint(endpoint_object("chat", "prod-main"), source, NS)
    assert derived is not None
    (disc,) = [v.kubernetes_discovery() for v in derived.variants]
    assert disc is not None
    assert (disc.service, disc.service_owner_uid) == (SHARED, UID["chat"])
    bare = endpoint_object("chat", "prod-main")
    del bare["metadata"]["uid"]
    derived = derive_endpoint(bare, source, NS)
    assert derived is not None
    disc = derived.variants[0].kubernetes_discovery()
    assert disc is not None
    assert disc.service_owner_uid is None


@pytest.mark.parametrize(
    ("owners", "expected"),
    [
        (controller("chat"), None),
        (controller("chat-prod"), "belongs to InferenceEndpoint chat-prod (uid uid-chat-prod-1)"),
        (controller("chat", uid="other"), "belongs to InferenceEndpoint chat (uid other)"),
        ([{**controller("chat")[0], "controller": False}], "has no controller"),
        ([], "has no controller"),
        ([{**controller("chat")[0], "apiVersion": "example.com/v1"}], "controlled by"),
        ([{**controller("chat")[0], "kind": "Deployment"}], "controlled by Deployment chat"),
    ],
)
def test_the_service_owner_check(owners: list[dict[str, Any]], expected: str | None) -> None:
    found = endpoint_service_problem(service_object(SHARED, owners), SHARED, UID["chat"])
    assert found == expected if expected is None else expected in str(found)
    assert endpoint_service_problem(None, SHARED, UID["chat"]) == f"Service {SHARED} does not exist"


async def test_a_service_the_gateway_may_not_read_is_the_variants_problem(
    kmock: Any, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """RBAC without ``services`` (the API answers 403): the derived variants get no instances
    and say why in the admin API (one warning each, however many retries); once the Service
    can be read, its owner's variant gets its engines and the reason goes."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    api = str(kmock.url).rstrip("/")
    readable = False

    def forbidden() -> dict[str, Any]:
        if readable:
            raise StopAsyncIteration  # this reaction is spent: the emulator answers from now on
        return {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "forbidden"}

    kmock[f"get {SERVICES}"] << 403 << forbidden
    async with backends_running("a") as (a,):
        await session.post(api + SERVICES, json=service_object(SHARED, controller("chat-prod")))
        gw = await started(kmock, session, a)
        try:
            await wait_until(lambda: len(gw.gateway.kube_discovery.problems) == 2)
            assert gw.gateway.kube_discovery.errors >= 2
            found = str(await problem(session, gw, "chat-prod/main"))
            assert found.startswith(f"cannot read Service {NS}/{SHARED}: ")
            assert "HTTP 403" in found
            assert served(gw) == {"chat/prod-main": [], "chat-prod/main": []}
            errors = gw.gateway.kube_discovery.errors
            await wait_until(lambda: gw.gateway.kube_discovery.errors >= errors + 4)  # retried
            logged = [r for r in caplog.records if r.name == LOGGER and "/main" in r.getMessage()]
            assert [r.levelno for r in logged] == [logging.WARNING], logged

            readable = True
            await wait_until(
                lambda: served(gw) == {"chat/prod-main": [], "chat-prod/main": ["pod-a"]}
            )
            assert await problem(session, gw, "chat-prod/main") is None
            await wait_until(  # (its own watch's backoff may end later)
                lambda: (
                    "belongs to InferenceEndpoint chat-prod"
                    in str(gw.gateway.kube_discovery.problem("chat", "prod-main"))
                )
            )
            assert served(gw)["chat/prod-main"] == []
        finally:
            await gw.stop()
