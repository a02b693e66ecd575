"""Kubernetes discovery against kmock's API emulator: the gateway follows a Service's
EndpointSlices (list, then watch), keeps its instances when the API fails, and follows
reloads that change the Service."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from gateway_support import (
    MODEL,
    FakeBackend,
    backends_running,
    gateway_doc,
    gateway_running,
)

from support.waiting import wait_until
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.server import StartedApp, start_app
from warmfleet.kube.watch import ListWatch

NS = "default"
TOKEN = "admin-token-0123456789"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def declare(kmock: Any) -> None:
    kmock.resources["discovery.k8s.io/v1/endpointslices"] = kmock.ResourceInfo(
        kind="EndpointSlice",
        namespaced=True,
        verbs=["get", "list", "watch", "create", "update", "patch", "delete"],
    )


def slice_body(name: str, service: str, ready: dict[FakeBackend, bool]) -> dict[str, Any]:
    """One slice of ``service`` whose endpoints are the fake backends (all on one port each:
    a slice has one port list, so each backend gets a slice of its own in these tests)."""
    (backend,) = ready
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": backend.port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": ready[backend]},
                "targetRef": {"kind": "Pod", "name": f"pod-{backend.name}", "namespace": NS},
            }
        ],
    }


def k8s_variant(api: str, service: str, **extra: Any) -> dict[str, Any]:
    discovery = {
        "type": "kubernetes",
        "service": service,
        "namespace": NS,
        "api_server": api,
        "token_path": "/nonexistent/token",
        "ca_path": "/nonexistent/ca.crt",
        "retry_interval_s": 0.05,
        "timeout_s": 2.0,
        **extra,
    }
    return {"name": "v1", "models": [MODEL], "discovery": discovery}


async def ask(session: aiohttp.ClientSession, gw: StartedApp) -> tuple[int, str | None]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-warmfleet-instance")


def ids(gw: StartedApp) -> list[str]:
    return sorted(gw.gateway.state.default_endpoint().variant("v1").instances)


async def test_follows_the_services_endpointslices(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    async with backends_running("a", "b") as (a, b):
        await session.post(api + SLICES, json=slice_body("llama-a", "llama", {a: True}))
        await session.post(api + SLICES, json=slice_body("mistral-x", "mistral", {b: True}))
        doc = gateway_doc([], variants=[k8s_variant(api, "llama")], admin_token=TOKEN)
        async with gateway_running(parse_gateway_config(doc)) as gw:
            disc = gw.gateway.kube_discovery
            await wait_until(lambda: ids(gw) == ["pod-a"])  # the other Service's slice is not ours
            assert await ask(session, gw) == (200, "pod-a")

            await session.post(api + SLICES, json=slice_body("llama-b", "llama", {b: False}))
            await session.patch(
                api + f"{SLICES}/llama-a",
                json={"endpoints": slice_body("llama-a", "llama", {a: False})["endpoints"]},
            )
            await wait_until(lambda: ids(gw) == [])  # both known, neither ready
            assert (await ask(session, gw))[0] == 503

            await session.patch(
                api + f"{SLICES}/llama-b",
                json={"endpoints": slice_body("llama-b", "llama", {b: True})["endpoints"]},
            )
            await wait_until(lambda: ids(gw) == ["pod-b"])
            assert await ask(session, gw) == (200, "pod-b")
            await session.delete(api + f"{SLICES}/llama-b")
            await wait_until(lambda: ids(gw) == [])
            assert disc.loads >= 4
            assert disc.errors == 0

            async with session.put(
                gw.url + "/admin/v1/endpoints/main/variants/v1/instances",
                json=[],
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp:  # the Service is the source of truth, not the admin API
                assert resp.status == 409
                assert "EndpointSlices of Service default/llama" in await resp.text()


async def test_api_failures_keep_the_instances_and_reload_switches_service(
    kmock: Any, session: aiohttp.ClientSession, unused_tcp_port: int
) -> None:
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    async with backends_running("a", "b") as (a, b):
        await session.post(api + SLICES, json=slice_body("llama-a", "llama", {a: True}))
        await session.post(api + SLICES, json=slice_body("mistral-b", "mistral", {b: True}))
        doc = gateway_doc([], variants=[k8s_variant(api, "llama")])
        async with gateway_running(parse_gateway_config(doc)) as gw:
            disc = gw.gateway.kube_discovery
            await wait_until(lambda: ids(gw) == ["pod-a"])

            # An API server that refuses connections: errors counted, instances kept.
            dead = f"http://127.0.0.1:{unused_tcp_port}"
            gw.gateway.apply(
                parse_gateway_config(gateway_doc([], variants=[k8s_variant(dead, "llama")])),
                "test",
            )
            await wait_until(lambda: disc.errors >= 2)
            assert ids(gw) == ["pod-a"]
            assert await ask(session, gw) == (200, "pod-a")

            # A reload that names another Service: the watcher restarts on it.
            gw.gateway.apply(
                parse_gateway_config(gateway_doc([], variants=[k8s_variant(api, "mistral")])),
                "test",
            )
            await wait_until(lambda: ids(gw) == ["pod-b"])
            assert await ask(session, gw) == (200, "pod-b")
        watchers = [
            t for t in asyncio.all_tasks() if t.get_name().startswith("warmfleet-gateway-k8s")
        ]
        assert watchers == []  # the runtime stopped the supervisor and its watchers


async def test_a_crashed_watcher_is_restarted(
    kmock: Any, session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a watcher (not an API error) is logged, counted, and the watcher starts again."""
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    real = ListWatch.list_and_watch
    calls = []

    async def buggy_once(self: ListWatch, session: aiohttp.ClientSession) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise AttributeError("a bug")
        await real(self, session)

    monkeypatch.setattr(ListWatch, "list_and_watch", buggy_once)
    async with backends_running("a") as (a,):
        await session.post(api + SLICES, json=slice_body("llama-a", "llama", {a: True}))
        doc = gateway_doc([], variants=[k8s_variant(api, "llama")])
        async with gateway_running(parse_gateway_config(doc)) as gw:
            await wait_until(lambda: ids(gw) == ["pod-a"])
            assert gw.gateway.kube_discovery.errors == 1
            assert len(calls) >= 2


def declare_endpoints(kmock: Any) -> None:
    kmock.resources["warmfleet.dev/v1alpha1/inferenceendpoints"] = kmock.ResourceInfo(
        kind="InferenceEndpoint",
        namespaced=True,
        verbs=["get", "list", "watch", "create", "update", "patch", "delete"],
    )


def inference_endpoint(name: str, strategy: str = "prefix_affinity") -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "modelSource": {"uri": f"s3://models/{name}", "revision": "v1"},
            "image": "vllm/vllm-openai:v0.9",
            "variants": [{"name": "main", "routing": {"strategy": {"type": strategy}}}],
        },
    }


async def test_endpoints_follow_the_inference_endpoints(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    """``spec.inference_endpoints``: one endpoint per InferenceEndpoint, its variants on the
    operator's per-variant Services, chosen by the request's model; they follow the objects."""
    declare(kmock)
    declare_endpoints(kmock)
    api = str(kmock.url).rstrip("/")
    objects = f"/apis/warmfleet.dev/v1alpha1/namespaces/{NS}/inferenceendpoints"
    access = {
        "api_server": api,
        "token_path": "/nonexistent/token",
        "ca_path": "/nonexistent/ca.crt",
        "retry_interval_s": 0.05,
    }
    doc = gateway_doc([])
    doc["spec"]["endpoints"] = []
    doc["spec"]["inference_endpoints"] = {"namespace": NS, **access}
    doc["spec"]["model_selects_endpoint"] = True
    async with backends_running("a", "b") as (a, b):
        await session.post(api + SLICES, json=slice_body("llama-main-x", "llama-main", {a: True}))
        await session.post(
            api + SLICES, json=slice_body("mistral-main-x", "mistral-main", {b: True})
        )
        await session.post(api + objects, json=inference_endpoint("llama"))
        bad = inference_endpoint("broken")
        del bad["spec"]["image"]
        await session.post(api + objects, json=bad)
        tokens = inference_endpoint("tokens")  # key mode tokens, but the gateway has no tokenizer
        tokens["spec"]["variants"][0]["routing"]["key"] = {"mode": "tokens"}
        await session.post(api + objects, json=tokens)
        gw = await start_app(create_app(parse_gateway_config(doc)))
        state = gw.gateway.state

        def served() -> dict[str, list[str]]:
            return {
                name: sorted(ep.variant("main").instances) for name, ep in state.endpoints.items()
            }

        async def ask_model(model: str) -> tuple[int, str | None]:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                return resp.status, resp.headers.get("x-warmfleet-instance")

        try:
            await wait_until(lambda: served() == {"llama": ["pod-a"]})  # the others: left out
            assert sorted(gw.gateway._endpoint_problems) == ["broken", "tokens"]
            assert await ask_model("llama") == (200, "pod-a")
            assert (await ask_model("mistral"))[0] == 404

            await session.post(api + objects, json=inference_endpoint("mistral"))
            await wait_until(lambda: served() == {"llama": ["pod-a"], "mistral": ["pod-b"]})
            assert await ask_model("mistral") == (200, "pod-b")
            async with session.get(gw.url + "/v1/models") as resp:
                listed = sorted(m["id"] for m in (await resp.json())["data"])
            assert listed == ["llama", "mistral"]

            llama = state.endpoint("llama").variant("main")
            assert llama.routing_config.strategy.type == "prefix_affinity"
            patch = {"spec": {"variants": [{"name": "main", "routing": {"strategy": {
                "type": "round_robin"}}}]}}  # fmt: skip
            await session.patch(api + f"{objects}/llama", json=patch)
            await wait_until(
                lambda: (
                    state.endpoint("llama").variant("main").routing_config.strategy.type
                    == "round_robin"
                )
            )
            assert state.endpoint("llama").variant("main") is llama  # same variant, new router
            assert sorted(llama.instances) == ["pod-a"]  # its instances stay

            syncs = gw.gateway.endpoint_syncs
            await session.patch(api + f"{objects}/llama", json={"status": {"phase": "Ready"}})
            await asyncio.sleep(0.3)  # the event arrives; nothing for the gateway in it
            assert gw.gateway.endpoint_syncs == syncs

            await session.delete(api + f"{objects}/mistral")
            await wait_until(lambda: served() == {"llama": ["pod-a"]})
            assert (await ask_model("mistral"))[0] == 404
            assert gw.gateway.endpoint_sync_errors == 0
        finally:
            await gw.stop()


async def test_admin_changes_survive_inference_endpoint_changes(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    """An admin change to an endpoint of the document outlives a change of the
    InferenceEndpoints (only a reload replaces it); a derived endpoint's routing is the object's
    (409)."""
    declare(kmock)
    declare_endpoints(kmock)
    api = str(kmock.url).rstrip("/")
    objects = f"/apis/warmfleet.dev/v1alpha1/namespaces/{NS}/inferenceendpoints"
    access = {"api_server": api, "token_path": "/nonexistent/token", "ca_path": "/nx/ca.crt"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with backends_running("a", "b", "c") as (a, b, c):
        doc = gateway_doc([a], admin_token=TOKEN)
        doc["spec"]["inference_endpoints"] = {"namespace": NS, "retry_interval_s": 0.05, **access}
        doc["spec"]["model_selects_endpoint"] = True
        await session.post(api + SLICES, json=slice_body("llama-main-x", "llama-main", {c: True}))
        gw = await start_app(create_app(parse_gateway_config(doc)))
        state = gw.gateway.state
        admin = gw.url + "/admin/v1/endpoints/{}/variants/{}/{}"
        try:
            least = {"strategy": {"type": "least_outstanding_requests"}}
            async with session.put(admin.format("main", "v1", "routing"), json=least, headers=auth):
                pass
            async with session.post(
                admin.format("main", "v1", "instances"),
                json={"id": "b", "url": b.url},
                headers=auth,
            ) as resp:
                assert resp.status == 201
            await session.post(api + objects, json=inference_endpoint("llama"))
            await wait_until(lambda: "llama" in state.endpoints)
            main = state.endpoint("main").variant("v1")
            assert main.routing_config.strategy.type == "least_outstanding_requests"
            assert sorted(main.instances) == ["a", "b"]
            assert gw.gateway.derived_endpoints == {"llama"}

            async with session.put(
                admin.format("llama", "main", "routing"), json=least, headers=auth
            ) as resp:
                assert resp.status == 409
                assert "InferenceEndpoint" in (await resp.json())["error"]["message"]
            assert state.endpoint("llama").variant("main").routing_config.strategy.type == (
                "prefix_affinity"
            )
            await session.delete(api + f"{objects}/llama")
            await wait_until(lambda: "llama" not in state.endpoints)
            assert gw.gateway.derived_endpoints == frozenset()
            assert main.routing_config.strategy.type == "least_outstanding_requests"
            assert sorted(main.instances) == ["a", "b"]
        finally:
            await gw.stop()
