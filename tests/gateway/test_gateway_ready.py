"""``/ready`` and ``/ready?scope=gateway``: the endpoints' readiness vs the gateway pod's own (its
Kubernetes readiness probe), which must not depend on engines."""

from __future__ import annotations

import aiohttp
from gateway_support import backends_running, gateway_config, gateway_running

from support.waiting import wait_until


async def _ready(client: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]]:
    async with client.get(url) as r:
        body = await r.json()
        assert isinstance(body, dict)
        return r.status, body


async def test_gateway_scope_is_ready_while_no_engine_is_healthy() -> None:
    async with backends_running("a") as backends:
        backends[0].healthy = False
        async with (
            gateway_running(gateway_config(backends)) as gw,
            aiohttp.ClientSession() as client,
        ):
            variant = gw.gateway.state.endpoints["main"].variants["v1"]
            await wait_until(lambda: gw.gateway.health.rounds_completed > 0 and not variant.healthy)
            status, body = await _ready(client, gw.url + "/ready")
            assert (status, body["unavailable"]) == (503, ["main"])
            status, body = await _ready(client, gw.url + "/ready?scope=gateway")
            assert (status, body["status"], body["scope"]) == (200, "ready", "gateway")
            assert body["unavailable"] == ["main"]  # still said, just not a reason to leave
            backends[0].healthy = True
            await wait_until(lambda: bool(variant.healthy))
            assert (await _ready(client, gw.url + "/ready"))[0] == 200


async def test_unknown_scope_is_a_400() -> None:
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends)) as gw,
        aiohttp.ClientSession() as client,
    ):
        status, body = await _ready(client, gw.url + "/ready?scope=everything")
        assert status == 400
        assert "scope" in str(body["error"])
