"""``limits.maxUpstreamConnections``: a request that finds every upstream connection busy waits
for one at most ``upstreamConnectTimeoutS``, then is answered 503 in the OpenAI error envelope
with ``Retry-After`` (reason ``pool_timeout``, counted in ``requests_total``), without counting
against the instance. Regression: it waited for ever."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gateway_support import MODEL, backends_running, gateway_config, gateway_running
from wire_support import REQ, WAIT_S, Upstream, answer_ok, pool_for

from warmfleet.gateway.http.upstream_pool import UpstreamPoolTimeout

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


async def test_waiting_for_a_free_connection_is_bounded_by_the_connect_timeout() -> None:
    async with (
        Upstream(answer_ok) as up,
        pool_for(max_connections=1, connect_timeout_s=0.05) as pool,
    ):
        busy = await pool.acquire(up.addr)
        with pytest.raises(UpstreamPoolTimeout, match="maxUpstreamConnections"):
            await asyncio.wait_for(pool.acquire(up.addr), WAIT_S)
        assert pool.open == {busy}
        await busy.start(REQ, 1.0, 5.0).done  # released: the next acquire has it at once
        assert await asyncio.wait_for(pool.acquire(up.addr), WAIT_S) is busy
        assert up.accepted == 1


async def test_a_waiter_woken_in_time_is_not_timed_out_afterwards() -> None:
    async with (
        Upstream(answer_ok) as up,
        pool_for(max_connections=1, connect_timeout_s=5.0) as pool,
    ):
        busy = await pool.acquire(up.addr)
        waiting = asyncio.create_task(pool.acquire(up.addr))
        await asyncio.sleep(0)
        await busy.start(REQ, 1.0, 5.0).done
        assert await asyncio.wait_for(waiting, WAIT_S) is busy


async def _metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def test_a_request_finding_every_connection_busy_gets_503_with_retry_after() -> None:
    limits = {"maxUpstreamConnections": 1, "upstreamConnectTimeoutS": 0.2}
    async with backends_running("a") as (backend,):
        backend.gate = asyncio.Event()  # the first stream holds the one connection
        async with (
            gateway_running(gateway_config([backend], limits=limits)) as gw,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S * 4)) as session,
        ):
            url = gw.url + "/v1/chat/completions"
            async with session.post(url, json={**CHAT, "stream": True}) as first:
                assert first.status == 200
                await first.content.readuntil(b"\n\n")  # its first event: the connection is held
                async with session.post(url, json=CHAT) as second:
                    body = await second.json()
                    assert second.status == 503
                    assert second.headers["Retry-After"] == "1"
                    assert second.headers["x-warmfleet-reason"] == "pool_timeout"
                assert body["error"]["type"] == "service_unavailable_error"
                assert "maxUpstreamConnections" in body["error"]["message"]
                backend.gate.set()
                assert (await first.read()).endswith(b"data: [DONE]\n\n")
            async with session.post(url, json=CHAT) as third:  # the connection is free again
                assert third.status == 200
            text = await _metrics(session, gw.url)
    assert 'reason="pool_timeout",status="503",variant="v1"} 1.0' in text
    assert "warmfleet_gateway_attempt_failures_total{" not in text  # not the instance's failure
    assert backend.stats.requests == 2
