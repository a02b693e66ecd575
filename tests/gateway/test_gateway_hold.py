"""The zero-ready hold, live: a request for a variant with no ready instance waits for one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from gateway_support import MODEL, backends_running, gateway_config, gateway_running

from support.waiting import wait_until
from warmfleet.gateway.config import GatewayConfig
from warmfleet.gateway.hold_config import HoldConfig
from warmfleet.gateway.server import StartedApp

KEY = ("main", "v1")


def _body() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


def _write(path: Path, instances: list[dict[str, str]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"instances": instances}))
    os.replace(tmp, path)


def _config(listing: Path, hold: HoldConfig | None) -> GatewayConfig:
    variants = [
        {
            "name": "v1",
            "models": [MODEL],
            "discovery": {"type": "file", "path": str(listing), "pollIntervalS": 0.05},
        }
    ]
    config = gateway_config([], variants=variants)
    if hold is None:
        return config
    spec = config.spec.model_copy(update={"hold": hold})
    return config.model_copy(update={"spec": spec})


async def _metrics(client: aiohttp.ClientSession, gw: StartedApp) -> str:
    async with client.get(gw.url + "/metrics") as resp:
        return await resp.text()


def _hold_config(**fields: Any) -> HoldConfig:
    return HoldConfig.model_validate(fields)


async def test_a_held_request_is_served_when_an_instance_appears(tmp_path: Path) -> None:
    listing = tmp_path / "instances.yaml"
    _write(listing, [])
    config = _config(listing, _hold_config(timeoutS=20))
    async with (
        backends_running("a") as (a,),
        aiohttp.ClientSession() as client,
        gateway_running(config) as gw,
    ):
        queue = gw.gateway.hold.queue
        request = asyncio.create_task(client.post(gw.url + "/v1/chat/completions", json=_body()))
        await wait_until(lambda: queue.held(KEY) == 1)
        text = await _metrics(client, gw)
        assert 'warmfleet_gateway_held_requests{endpoint="main",variant="v1"} 1.0' in text
        _write(listing, [{"id": "a", "url": a.url}])
        async with await request as resp:
            assert resp.status == 200
            assert resp.headers["x-warmfleet-instance"] == "a"
        text = await _metrics(client, gw)
        assert 'warmfleet_gateway_held_requests{endpoint="main",variant="v1"} 0.0' in text
        served = 'warmfleet_gateway_hold_outcomes_total{endpoint="main",outcome="served",'
        assert served + 'variant="v1"} 1.0' in text


async def test_a_held_request_is_shed_at_its_deadline_with_retry_after(tmp_path: Path) -> None:
    listing = tmp_path / "instances.yaml"
    _write(listing, [])
    config = _config(listing, _hold_config(timeoutS=0.3, retryAfterS=7))
    async with aiohttp.ClientSession() as client, gateway_running(config) as gw:
        started = time.perf_counter()
        async with client.post(gw.url + "/v1/chat/completions", json=_body()) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "7"
            assert resp.headers["x-warmfleet-reason"] == "hold_timeout"
            error = (await resp.json())["error"]
        assert time.perf_counter() - started >= 0.3  # it was held first
        assert error["type"] == "service_unavailable_error"
        assert error["code"] == 503
        assert "retry after 7 s" in error["message"]
        assert gw.gateway.hold.queue.held(KEY) == 0


async def test_a_full_hold_sheds_at_once(tmp_path: Path) -> None:
    listing = tmp_path / "instances.yaml"
    _write(listing, [])
    config = _config(listing, _hold_config(timeoutS=20, maxHeldPerVariant=1))
    async with aiohttp.ClientSession() as client, gateway_running(config) as gw:
        queue = gw.gateway.hold.queue
        first = asyncio.create_task(client.post(gw.url + "/v1/chat/completions", json=_body()))
        await wait_until(lambda: queue.held(KEY) == 1)
        async with client.post(gw.url + "/v1/chat/completions", json=_body()) as resp:
            assert resp.status == 503
            assert resp.headers["x-warmfleet-reason"] == "hold_full"
            assert "Retry-After" in resp.headers
        first.cancel()  # the client leaves while held
        await wait_until(lambda: queue.held(KEY) == 0)


async def test_without_hold_no_instance_fails_at_once(tmp_path: Path) -> None:
    listing = tmp_path / "instances.yaml"
    _write(listing, [])
    config = _config(listing, None)
    async with aiohttp.ClientSession() as client, gateway_running(config) as gw:
        resp = await client.post(gw.url + "/v1/chat/completions", json=_body())
        assert resp.status == 503
        assert "Retry-After" not in resp.headers
        resp.release()
