"""Proxying: routing headers, byte-exact forwarding, streaming relay, retries, errors."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from gateway_support import (
    MODEL,
    FakeRouterFactory,
    backends_running,
    gateway_config,
    gateway_doc,
    gateway_running,
    parse_sse,
)

from support.waiting import wait_until
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.config import parse_gateway_config

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
TRACE_CONTEXT = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=opaque",
    "baggage": "tenant=acme",
}


async def test_chat_non_streaming_forwards_bytes_and_sets_headers() -> None:
    factory = FakeRouterFactory()
    async with (
        backends_running("a", "b") as backends,
        gateway_running(gateway_config(backends), factory) as gw,
        aiohttp.ClientSession() as client,
    ):
        raw = b'{"model": "fake-model",   "messages": [{"role": "user", "content": "hi"}]}'
        seen = []
        for _ in range(4):
            async with client.post(
                gw.url + "/v1/chat/completions",
                data=raw,
                headers={"Content-Type": "application/json", "Authorization": "Bearer k",
                         **TRACE_CONTEXT, "Cookie": "session=not-for-the-instance"},
            ) as resp:  # fmt: skip
                assert resp.status == 200
                body = await resp.json()
                seen.append(resp.headers["x-warmfleet-instance"])
                assert resp.headers["x-warmfleet-reason"] == "round_robin"
                assert body["choices"][0]["message"]["content"] == f"hello from {seen[-1]}"
        assert sorted(set(seen)) == ["a", "b"]
        for b in backends:
            assert b.stats.bodies == [raw, raw]  # never re-serialised
            assert b.stats.headers[0]["Authorization"] == "Bearer k"
            for name, value in TRACE_CONTEXT.items():  # the client's trace goes on at the engine
                assert b.stats.headers[0][name] == value
            assert "Cookie" not in b.stats.headers[0]


async def test_streaming_relay_is_complete_and_ordered() -> None:
    async with (
        backends_running("a", chunks=6) as backends,
        gateway_running(gateway_config(backends)) as gw,
        aiohttp.ClientSession() as client,
    ):
        async with client.post(
            gw.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert resp.headers["x-warmfleet-instance"] == "a"
            events = parse_sse(await resp.read())
        assert events[-1] == "[DONE]"
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        assert texts == [f"a-{i} " for i in range(6)]


async def test_connection_refused_retries_elsewhere_and_ejects() -> None:
    async with backends_running("a", "b") as backends:
        config = gateway_config(backends, health={"interval_s": 30, "timeout_s": 1})
        await backends[0].kill()
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            for _ in range(4):
                async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-warmfleet-instance"] == "b"
            variant = gw.gateway.state.default_endpoint().variant("v1")
            assert [i.instance_id for i in variant.healthy] == ["b"]
            metrics = gw.gateway.metrics.render().decode()
            assert 'cause="passive_connect"' in metrics
            assert "warmfleet_gateway_retries_total" in metrics


async def test_no_healthy_instance_is_503_json() -> None:
    async with backends_running("a") as backends:
        config = gateway_config(backends, health={"interval_s": 30, "timeout_s": 1})
        await backends[0].kill()
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            for expected in (502, 503):  # first: the attempt fails; then: nothing healthy left
                async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == expected
                    assert set((await resp.json())["error"]) == {"message", "type", "param", "code"}
                    assert resp.headers["x-warmfleet-instance"] == "none"


async def test_upstream_error_status_is_relayed() -> None:
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends)) as gw,
        aiohttp.ClientSession() as client,
    ):
        backends[0].fail_status = 429
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 429
            assert resp.headers["x-warmfleet-instance"] == "a"


async def test_unknown_model_and_variant_are_404() -> None:
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends)) as gw,
        aiohttp.ClientSession() as client,
    ):
        async with client.post(
            gw.url + "/v1/chat/completions", json={**CHAT, "model": "nope"}
        ) as r:
            assert r.status == 404
            assert (await r.json())["error"]["type"] == "not_found_error"
        hdr = {"x-warmfleet-variant": "v9"}
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT, headers=hdr) as r:
            assert r.status == 404
        async with client.post(gw.url + "/endpoints/nope/invocations", data=b"x") as r:
            assert r.status == 404
        async with client.get(gw.url + "/v1/chat/completions") as r:
            assert r.status == 405
            assert "error" in await r.json()
        async with client.get(gw.url + "/nowhere") as r:
            assert r.status == 404
            assert "error" in await r.json()


async def test_variant_header_and_weights() -> None:
    async with backends_running("a", "b") as backends:
        variants = [
            {
                "name": "heavy",
                "weight": 3,
                "models": [MODEL],
                "instances": [{"id": "a", "url": backends[0].url}],
            },
            {
                "name": "light",
                "weight": 1,
                "models": [MODEL],
                "instances": [{"id": "b", "url": backends[1].url}],
            },
            {
                "name": "other",
                "weight": 1,
                "models": ["m2"],
                "instances": [{"id": "b", "url": backends[1].url}],
            },
        ]
        config = gateway_config(backends, variants=variants)
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            counts = {"a": 0, "b": 0}
            for _ in range(200):
                async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
                    counts[r.headers["x-warmfleet-instance"]] += 1
            assert counts["a"] > 2 * counts["b"] > 0  # ~150 vs ~50, seeded
            hdr = {"x-warmfleet-variant": "light"}
            async with client.post(gw.url + "/v1/chat/completions", json=CHAT, headers=hdr) as r:
                assert r.headers["x-warmfleet-instance"] == "b"
            hdr = {"x-warmfleet-variant": "other"}
            async with client.post(gw.url + "/v1/chat/completions", json=CHAT, headers=hdr) as r:
                assert r.status == 404  # "other" does not serve fake-model


async def test_invocations_route_on_raw_bytes_and_tenant() -> None:
    factory = FakeRouterFactory()
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends), factory) as gw,
        aiohttp.ClientSession() as client,
    ):
        raw = b"\xff\x00 not json at all"
        hdr = {"x-prefix-aware-id": "tenant-7"}
        async with client.post(gw.url + "/endpoints/main/invocations", data=raw, headers=hdr) as r:
            assert r.status == 200
            assert (await r.json())["echo_bytes"] == len(raw)
        assert backends[0].stats.paths == ["/invocations"]
        assert backends[0].stats.bodies == [raw]
        assert factory.routers[-1].tenants == ["tenant-7"]


async def test_models_health_ready_metrics() -> None:
    async with backends_running("a", "b") as backends:
        backends[1].models = ["extra-model"]
        variants = [
            {"name": "v1", "models": [MODEL], "instances": [{"id": "a", "url": backends[0].url}]},
            {"name": "any", "instances": [{"id": "b", "url": backends[1].url}]},
        ]
        async with (
            gateway_running(gateway_config(backends, variants=variants)) as gw,
            aiohttp.ClientSession() as client,
        ):
            async with client.get(gw.url + "/v1/models") as r:
                ids = sorted(m["id"] for m in (await r.json())["data"])
            assert ids == ["extra-model", MODEL]
            async with client.get(gw.url + "/health") as r:
                assert r.status == 200
            await gw.gateway.health.wait_round()
            async with client.get(gw.url + "/ready") as r:
                assert r.status == 200
            async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
            async with client.get(gw.url + "/metrics") as r:
                text = await r.text()
            for name in (
                "warmfleet_gateway_requests_total",
                "warmfleet_gateway_decision_seconds_bucket",
                "warmfleet_gateway_overhead_seconds_bucket",
                "warmfleet_gateway_ttft_seconds_bucket",
                "warmfleet_gateway_in_flight_requests",
                "warmfleet_gateway_instance_healthy",
            ):
                assert name in text


async def test_client_disconnect_cancels_upstream() -> None:
    async with backends_running("a", chunks=3) as backends:
        backend = backends[0]
        backend.gate = asyncio.Event()  # the stream stalls after its first chunk
        async with gateway_running(gateway_config(backends)) as gw:
            async with aiohttp.ClientSession() as client:
                resp = await client.post(
                    gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}
                )
                await resp.content.readany()
                resp.close()  # the client goes away mid-stream
            await wait_until(lambda: backend.stats.disconnects == 1)
            variant = gw.gateway.state.default_endpoint().variant("v1")
            await wait_until(lambda: variant.instances["a"].in_flight_requests == 0)
            assert backend.stats.streams_completed == 0
            metrics = gw.gateway.metrics.render().decode()
            assert 'status="client_disconnect"' in metrics


async def test_mid_stream_failure_ends_with_error_event() -> None:
    async with backends_running("a", "b", chunks=3) as backends:
        backends[0].gate = asyncio.Event()
        async with (
            gateway_running(gateway_config(backends)) as gw,
            aiohttp.ClientSession() as client,
        ):
            resp = await client.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
            assert resp.headers["x-warmfleet-instance"] == "a"
            first = await resp.content.readany()
            await backends[0].kill()
            rest = await asyncio.wait_for(resp.read(), 10)
            events = parse_sse(first + rest)
            assert json.loads(events[0])["choices"][0]["delta"]["content"] == "a-0 "
            error = json.loads(events[-1])["error"]
            assert error["type"] == "upstream_error"
            assert "[DONE]" not in events


@pytest.mark.parametrize("size", [1, 1000])
async def test_body_limit_413(size: int) -> None:
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends, limits={"max_body_bytes": 64})) as gw,
        aiohttp.ClientSession() as client,
    ):
        payload = json.dumps({**CHAT, "pad": "x" * (64 * size)}).encode()
        async with client.post(gw.url + "/v1/chat/completions", data=payload) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == 413

        async def chunked() -> object:
            yield payload

        async with client.post(gw.url + "/v1/chat/completions", data=chunked()) as r:
            assert r.status == 413


async def test_slow_sender_408() -> None:
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends, limits={"body_read_timeout_s": 0.2})) as gw,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model":'
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408")
        writer.close()
        await writer.wait_closed()


async def test_app_exposes_runtime() -> None:
    async with backends_running("a") as backends, gateway_running(gateway_config(backends)) as gw:
        assert gw.app.gateway is gw.gateway


async def test_tcp_nodelay_on_both_sides() -> None:
    """No Nagle stall (sglang-router's ~43 ms first byte): TCP_NODELAY on client-facing and
    upstream sockets."""
    async with (
        backends_running("a", chunks=2) as backends,
        gateway_running(gateway_config(backends)) as gw,
        aiohttp.ClientSession() as client,
    ):
        backends[0].gate = asyncio.Event()
        resp = await client.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        await resp.content.readany()  # both connections are open now
        server_side = [c.transport for c in gw.app.server.connections]
        upstream_side = [c.transport for c in gw.gateway.proxy.pool.open]
        server_socks = [t.get_extra_info("socket") for t in server_side if t is not None]
        upstream_socks = [t.get_extra_info("socket") for t in upstream_side if t is not None]
        assert server_socks
        assert upstream_socks
        for sock in server_socks + upstream_socks:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        backends[0].gate.set()
        await resp.read()


async def test_strategy_bug_is_a_json_500_not_a_crash() -> None:
    factory = FakeRouterFactory()
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends), factory) as gw,
        aiohttp.ClientSession() as client,
    ):

        def broken(key: object, fleet: object) -> object:
            raise ZeroDivisionError

        factory.routers[-1].choose = broken  # type: ignore[method-assign,assignment]
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 500
            assert (await r.json())["error"]["type"] == "internal_error"
        del factory.routers[-1].choose  # back to the class's method
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200


async def test_data_parallel_ranks_are_pinned_by_header() -> None:
    """Two entries for two ranks of one data-parallel server (same URL) are two routing
    targets: each request carries the rank of the entry it was routed to, so the server's own
    DP balancer keeps it there; an entry without a rank sends no such header."""
    async with (
        backends_running("dp", "plain") as (dp, plain),
        aiohttp.ClientSession() as client,
    ):
        doc = gateway_doc([dp, plain])
        doc["spec"]["endpoints"][0]["variants"][0]["instances"] = [
            {"id": "dp-0", "url": dp.url, "data_parallel_rank": 0},
            {"id": "dp-1", "url": dp.url, "data_parallel_rank": 1},
            {"id": "plain", "url": plain.url},
        ]
        async with gateway_running(parse_gateway_config(doc)) as gw:
            routed = []
            for _ in range(6):
                async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
                    routed.append(resp.headers["x-warmfleet-instance"])
            described = gw.gateway.state.default_endpoint().variant("v1").describe()
    assert sorted(set(routed)) == ["dp-0", "dp-1", "plain"]
    ranks = [iid[-1] for iid in routed if iid.startswith("dp-")]
    assert [h.get("X-Data-Parallel-Rank") for h in dp.stats.headers] == ranks
    assert all("X-Data-Parallel-Rank" not in h for h in plain.stats.headers)
    assert [i["data_parallel_rank"] for i in described["instances"]] == [0, 1, None]


def test_a_negative_data_parallel_rank_is_rejected_naming_it() -> None:
    doc = gateway_doc([])
    doc["spec"]["endpoints"][0]["variants"][0]["instances"] = [
        {"id": "a", "url": "http://127.0.0.1:1", "data_parallel_rank": -1}
    ]
    with pytest.raises(ConfigError, match=r"dataParallelRank: .*greater than or equal to 0"):
        parse_gateway_config(doc)
