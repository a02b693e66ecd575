"""Acceptance 4 and live control: admin API, reloads and discovery while traffic runs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from gateway_support import (
    MODEL,
    FakeBackend,
    backends_running,
    gateway_config,
    gateway_doc,
    gateway_running,
    parse_sse,
)

from support.waiting import wait_until
from warmfleet.core.config import parse_document
from warmfleet.gateway.config import load_gateway_config
from warmfleet.gateway.discovery import files

TOKEN = "s3cret-admin-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
VARIANT = "/admin/v1/endpoints/main/variants/v1"


def chat(i: int, stream: bool = True) -> dict[str, Any]:
    content = f"shared system prompt {i % 4} " * 20 + f"question {i}"
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}


async def _stream(client: aiohttp.ClientSession, url: str, i: int) -> tuple[int, str, list[str]]:
    async with client.post(url + "/v1/chat/completions", json=chat(i)) as resp:
        return resp.status, resp.headers["x-warmfleet-instance"], parse_sse(await resp.read())


async def test_switch_strategy_and_instances_under_32_streams() -> None:
    async with backends_running("a", "b", "c", chunks=8) as backends:
        a, b, c = backends
        gate = asyncio.Event()
        for backend in backends:
            backend.gate = gate  # every stream stalls after its first chunk until released
        config = gateway_config([a, b], admin_token=TOKEN)
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            tasks = [asyncio.create_task(_stream(client, gw.url, i)) for i in range(32)]
            await wait_until(lambda: a.stats.streams_started + b.stats.streams_started == 32)

            new_routing = {"strategy": {"type": "prefix_affinity"}, "key": {"block_size": 32}}
            async with client.put(
                gw.url + VARIANT + "/routing", json=new_routing, headers=AUTH
            ) as r:
                assert r.status == 200, await r.text()
            async with client.post(
                gw.url + VARIANT + "/instances", json={"id": "c", "url": c.url}, headers=AUTH
            ) as r:
                assert r.status == 201
            async with client.delete(gw.url + VARIANT + "/instances/a", headers=AUTH) as r:
                assert r.status == 200
                assert [i["id"] for i in await r.json()] == ["b", "c"]

            # New requests see the new world while the 32 old streams are still open.
            after = [asyncio.create_task(_stream(client, gw.url, 100 + i)) for i in range(16)]
            await wait_until(lambda: c.stats.streams_started > 0)
            gate.set()
            results = await asyncio.gather(*tasks)
            late = await asyncio.gather(*after)

        for status, _inst, events in results:  # no request lost
            assert status == 200
            assert events[-1] == "[DONE]"
            assert len(events) == 9
        assert a.stats.streams_completed + b.stats.streams_completed == 32
        assert {inst for _, inst, _ in late} <= {"b", "c"}
        assert all(s == 200 and e[-1] == "[DONE]" for s, _, e in late)
        assert a.stats.streams_started == sum(1 for _, inst, _ in results if inst == "a")


async def test_admin_api_auth_validation_and_reads() -> None:
    async with backends_running("a") as backends, aiohttp.ClientSession() as client:
        async with (
            gateway_running(gateway_config(backends)) as gw,
            client.get(gw.url + "/admin/v1/endpoints", headers=AUTH) as r,
        ):
            assert r.status == 404  # off unless a token is configured
        async with gateway_running(gateway_config(backends, admin_token=TOKEN)) as gw:
            async with client.get(gw.url + "/admin/v1/endpoints") as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer ")
                assert (await r.json())["error"]["type"] == "authentication_error"
            bad = {"Authorization": "Bearer wrong-token-wrong-token"}
            async with client.get(gw.url + "/admin/v1/endpoints", headers=bad) as r:
                assert r.status == 401
            async with client.get(gw.url + "/admin/v1/endpoints", headers=AUTH) as r:
                state = await r.json()
                assert state["endpoints"][0]["variants"][0]["instances"][0]["id"] == "a"
            async with client.get(gw.url + VARIANT + "/routing", headers=AUTH) as r:
                assert (await r.json())["strategy"]["type"] == "round_robin"

            invalid = {"strategy": {"type": "prefix_hash", "prefix_length": 5}}
            async with client.put(gw.url + VARIANT + "/routing", json=invalid, headers=AUTH) as r:
                assert r.status == 400
                error = (await r.json())["error"]
                assert "prefixLength" in error["message"]
                assert error["param"] == "strategy.prefix_hash.prefixLength"
            unknown = {"strategy": {"type": "round_robin"}, "bogus": 1}
            async with client.put(gw.url + VARIANT + "/routing", json=unknown, headers=AUTH) as r:
                assert r.status == 400
                assert (await r.json())["error"]["param"] == "bogus"
            async with client.put(gw.url + VARIANT + "/routing", data=b"{", headers=AUTH) as r:
                assert r.status == 400
            infinite = b'{"strategy": {"type": "llmd_approx", "prefixWeight": Infinity}}'
            async with client.put(gw.url + VARIANT + "/routing", data=infinite, headers=AUTH) as r:
                assert r.status == 400  # a weight that is not finite breaks the scores
                assert (await r.json())["error"]["param"] == "strategy.llmd_approx.prefixWeight"
            preset = {"strategy": {"type": "round_robin"}, "flow": {"enginePreset": "gpt-9"}}
            async with client.put(gw.url + VARIANT + "/routing", json=preset, headers=AUTH) as r:
                assert r.status == 400  # (accepted, it made every request to the variant a 500)
                assert "enginePreset" in (await r.json())["error"]["message"]
            async with client.put(gw.url + VARIANT + "/routing", json=[], headers=AUTH) as r:
                assert r.status == 400
                assert (await r.json())["error"]["param"] is None  # no field to name
            async with client.get(gw.url + VARIANT + "/routing", headers=AUTH) as r:
                assert (await r.json())["strategy"]["type"] == "round_robin"  # old one stays

            async with client.post(
                gw.url + VARIANT + "/instances",
                json={"id": "a", "url": backends[0].url},
                headers=AUTH,
            ) as r:
                assert r.status == 409
            async with client.post(
                gw.url + VARIANT + "/instances", json={"id": "x", "url": "ftp://h"}, headers=AUTH
            ) as r:
                assert r.status == 400
                assert (await r.json())["error"]["param"] == "url"
            async with client.delete(gw.url + VARIANT + "/instances/zz", headers=AUTH) as r:
                assert r.status == 404
            async with client.get(
                gw.url + "/admin/v1/endpoints/main/variants/nope", headers=AUTH
            ) as r:
                assert r.status == 404
            put = {"instances": [{"id": "a2", "url": backends[0].url}]}
            async with client.put(gw.url + VARIANT + "/instances", json=put, headers=AUTH) as r:
                assert r.status == 200
            async with client.post(gw.url + "/v1/chat/completions", json=chat(0, False)) as r:
                assert r.headers["x-warmfleet-instance"] == "a2"


def _write(path: Path, doc: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)


async def test_reload_from_file_applies_valid_and_rejects_invalid(tmp_path: Path) -> None:
    async with backends_running("a", "b") as backends, aiohttp.ClientSession() as client:
        path = tmp_path / "gateway.yaml"
        doc = gateway_doc(backends)
        _write(path, doc)
        config = load_gateway_config(path)
        async with gateway_running(config, config_path=path) as gw:
            runtime = gw.gateway
            old_router = runtime.state.default_endpoint().variant("v1").router

            variant_doc = doc["spec"]["endpoints"][0]["variants"][0]
            variant_doc["routing"] = {"strategy": {"type": "prefix_hash", "prefix_length": 10}}
            _write(path, doc)
            assert runtime.reload() is False  # invalid: the old config stays
            assert runtime.state.default_endpoint().variant("v1").router is old_router

            variant_doc["routing"] = {"strategy": {"type": "least_outstanding_requests"}}
            variant_doc["instances"] = variant_doc["instances"][1:]
            _write(path, doc)
            assert runtime.reload() is True
            variant = runtime.state.default_endpoint().variant("v1")
            assert variant.routing_config.strategy.type == "least_outstanding_requests"
            assert list(variant.instances) == ["b"]
            async with client.post(gw.url + "/v1/chat/completions", json=chat(1, False)) as r:
                assert r.headers["x-warmfleet-instance"] == "b"
                assert r.headers["x-warmfleet-reason"] == "load_balance"
            metrics = runtime.metrics.render().decode()
            assert (
                'warmfleet_gateway_config_reloads_total{result="error",source="sighup"} 1.0'
                in metrics
            )


async def test_file_discovery_follows_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with backends_running("a", "b") as backends, aiohttp.ClientSession() as client:
        a, b = backends
        listing = tmp_path / "instances.yaml"
        _write(listing, {"instances": [{"id": "a", "url": a.url}]})
        variants = [
            {
                "name": "v1",
                "models": [MODEL],
                "discovery": {"type": "file", "path": str(listing), "poll_interval_s": 0.05},
            }
        ]
        async with gateway_running(gateway_config(backends, variants=variants)) as gw:
            disc = gw.gateway.discovery
            async with client.post(gw.url + "/v1/chat/completions", json=chat(0, False)) as r:
                assert r.headers["x-warmfleet-instance"] == "a"
            loads = disc.loads
            _write(listing, [{"id": "b", "url": b.url}])
            await wait_until(lambda: disc.loads > loads)
            async with client.post(gw.url + "/v1/chat/completions", json=chat(0, False)) as r:
                assert r.headers["x-warmfleet-instance"] == "b"
            errors = disc.errors
            listing.write_text("instances: [{id: 'bad id!', url: 3}]")
            await wait_until(lambda: disc.errors > errors)
            async with client.post(gw.url + "/v1/chat/completions", json=chat(0, False)) as r:
                assert r.headers["x-warmfleet-instance"] == "b"  # old set kept
            errors = disc.errors
            listing.write_text("instances: " + "[" * 5000 + "]" * 5000)  # past the parser
            await wait_until(lambda: disc.errors > errors)
            loads = disc.loads
            _write(listing, [{"id": "a", "url": a.url}])  # still followed
            await wait_until(lambda: disc.loads > loads)

            def bug(*_args: object) -> None:
                raise RuntimeError("a bug in a scan")

            errors = disc.errors
            with monkeypatch.context() as patch:
                patch.setattr(files, "parse_instance_list", bug)
                _write(listing, [{"id": "b", "url": b.url}])
                await wait_until(lambda: disc.errors > errors)  # logged, the task lives on
            loads = disc.loads
            _write(listing, [{"id": "b", "url": b.url}, {"id": "a", "url": a.url}])
            await wait_until(lambda: disc.loads > loads)
            admin_free = gw.gateway.state.default_endpoint().variant("v1")
            assert admin_free.discovery is not None


def test_example_config_validates() -> None:
    root = Path(__file__).resolve().parents[2]
    config = load_gateway_config(root / "examples" / "gateway.yaml")
    assert config.spec.listen.host == "127.0.0.1"
    # round-trips through the strict model
    parse_document(type(config), json.loads(config.model_dump_json()))


async def test_backend_helper_restart_keeps_port() -> None:
    backend = FakeBackend("z")
    await backend.start()
    port = backend.port
    await backend.kill()
    await backend.restart()
    assert backend.port == port
    await backend.stop()


async def test_tuning_prefix_affinity_live_keeps_the_learnt_cache_map() -> None:
    """An admin change of prefix_affinity's parameters swaps the router but not what it learnt:
    the next request of a known prefix is still a prefix hit on the same instance."""
    affinity = {"type": "prefix_affinity"}
    async with backends_running("a", "b", "c", "d") as backends, aiohttp.ClientSession() as c:
        config = gateway_config(backends, admin_token=TOKEN, strategy=affinity)
        async with gateway_running(config) as gw:

            async def ask(i: int) -> tuple[str, str]:
                async with c.post(gw.url + "/v1/chat/completions", json=chat(i, False)) as r:
                    assert r.status == 200
                    return r.headers["x-warmfleet-instance"], r.headers["x-warmfleet-reason"]

            first, reason = await ask(0)
            assert reason == "no_match"
            tuned = {"strategy": {**affinity, "load_weight": 0.5}}
            async with c.put(gw.url + VARIANT + "/routing", json=tuned, headers=AUTH) as r:
                assert r.status == 200
            assert await ask(4) == (first, "prefix_hit")  # same system prompt, new question
            other = {"strategy": {"type": "round_robin"}}
            async with c.put(gw.url + VARIANT + "/routing", json=other, headers=AUTH) as r:
                assert r.status == 200
            async with c.put(gw.url + VARIANT + "/routing", json=tuned, headers=AUTH) as r:
                assert r.status == 200
            assert (await ask(8))[1] == "no_match"  # learnt by nobody in between


async def test_reloaded_upstream_connection_limit_applies_to_the_next_requests() -> None:
    """Regression: ``max_upstream_connections`` (and ``upstream_connect_timeout_s``) were read
    once at start; a reload changed the config but not the pool."""
    async with backends_running("a", chunks=2) as backends:
        (a,) = backends
        gate = asyncio.Event()
        a.gate = gate
        async with gateway_running(gateway_config(backends)) as gw:
            gw.gateway.apply(gateway_config(backends, limits={"max_upstream_connections": 1}), "t")
            async with aiohttp.ClientSession() as client:
                tasks = [asyncio.create_task(_stream(client, gw.url, i)) for i in range(3)]
                await wait_until(lambda: a.stats.streams_started == 1)
                await asyncio.sleep(0.2)  # the others wait for the one connection
                assert a.stats.streams_started == 1
                gw.gateway.apply(gateway_config(backends), "t")  # unlimited again: all go
                await wait_until(lambda: a.stats.streams_started == 3)
                gate.set()
                results = await asyncio.gather(*tasks)
        assert [(status, events[-1]) for status, _, events in results] == [(200, "[DONE]")] * 3


async def test_admin_api_hides_url_credentials_and_refuses_a_host_with_a_space() -> None:
    async with (
        backends_running("a") as backends,
        aiohttp.ClientSession() as client,
        gateway_running(gateway_config(backends, admin_token=TOKEN)) as gw,
    ):
        with_secret = backends[0].url.replace("http://", "http://user:hunter2@")
        put = {"instances": [{"id": "s", "url": with_secret}]}
        async with client.put(gw.url + VARIANT + "/instances", json=put, headers=AUTH) as r:
            assert r.status == 200
            listed = await r.json()
        for path in ("/admin/v1/endpoints", VARIANT, VARIANT + "/instances"):
            async with client.get(gw.url + path, headers=AUTH) as r:
                text = await r.text()
            assert "hunter2" not in text
            assert "user" not in text
        assert listed[0]["url"] == backends[0].url.replace("http://", "http://***@")
        for bad in ("http://a b:8000", "http://a\tb:8000"):
            body = {"id": "x", "url": bad}
            async with client.post(gw.url + VARIANT + "/instances", json=body, headers=AUTH) as r:
                assert r.status == 400
                assert (await r.json())["error"]["param"] == "url"
