"""Instances whose ``/v1/models`` and ``/metrics`` hang (their ``/health`` answers) cannot keep
the healthy ones out of ``GET /v1/models`` nor keep their engine figures unread: the models
cache and the engine-stats probe each read on a connection pool of their own, and a read's
timeout covers its own exchange only, never a wait for a slot behind the hung reads (they
shared a 64-connection pool with the KV capacity probe: a good instance's read that queued
behind 64 hung ones timed out waiting). As ``test_gateway_health_pool.py`` for the probes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import ClientSession, DummyCookieJar, TCPConnector, web
from gateway_support import FakeBackend, gateway_doc, gateway_running

from support.waiting import wait_until
from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.engine_stats import EngineStatsProbe
from warmfleet.gateway.openai.models import ModelsCache
from warmfleet.gateway.runtime import Gateway

# Two seconds, and three failed probes to eject: room for a healthy read on a loaded 2-core box
# (no duration is asserted; at 0.5 s and one failure, a CI run under load ejected the good
# instances and listed no model). A read queued behind the wedged ones for a shared connection
# still waits a whole timeout before any frees.
HEALTH = {"intervalS": 2.0, "timeoutS": 2.0, "unhealthyThreshold": 3, "healthyThreshold": 1}
STATS = {"type": "llmd_approx", "refreshMetricsIntervalMs": 200}  # reads timed out at 2 s
ANSWER_S = 0.2  # a good engine's answer
METRICS = "vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n"


@asynccontextmanager
async def side_wedged() -> AsyncIterator[str]:
    """A server on 127.0.0.1 whose every ``.../health`` answers 200 while ``.../v1/models``
    and ``.../metrics`` never answer (until it stops); yields its URL. Instances that are
    ``URL/w<k>`` are distinct addresses on it."""
    release = asyncio.Event()

    async def serve(request: web.Request) -> web.Response:
        if request.path.endswith("/health"):
            return web.Response(text="ok")
        await release.wait()  # (a handler cancelled when its client leaves)
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        release.set()
        await runner.cleanup()


def _doc(wedged_url: str, wedged: int, good: list[FakeBackend], **kw: Any) -> dict[str, Any]:
    """Wedged instances first (their reads start first in every round), serving any model."""
    doc = gateway_doc(good, health=HEALTH, models=(), **kw)
    instances = [{"id": f"a-wedged-{i:03d}", "url": f"{wedged_url}/w{i}"} for i in range(wedged)]
    doc["spec"]["endpoints"][0]["variants"][0]["instances"][:0] = instances
    return doc


class Busy(FakeBackend):
    """A good engine, busy: it answers ``/v1/models`` and ``/metrics`` in ``ANSWER_S``, well
    within the timeout, and its server closes each connection after its answer (as uvicorn
    closes one idle for 5 s, under ``modelsCacheTtlS``' 10 s), so every read of it needs a new
    connection (a pooled one would not wait for a slot). A read that waited for a slot until the
    first wedged read timed out cannot be answered within its own timeout."""

    async def _models(self, request: web.Request) -> web.Response:
        await asyncio.sleep(ANSWER_S)
        resp = await super()._models(request)
        resp.force_close()
        return resp

    async def _metrics(self, request: web.Request) -> web.Response:
        await asyncio.sleep(ANSWER_S)
        resp = await super()._metrics(request)
        resp.force_close()
        return resp


@asynccontextmanager
async def fleet(wedged: int, **kw: Any) -> AsyncIterator[tuple[dict[str, Any], list[FakeBackend]]]:
    """``wedged`` side-wedged instances and two good ones (models ``m-g1``, ``m-g2``, an
    engine queue of 3): the document and the good backends."""
    good: list[FakeBackend] = [Busy("g1"), Busy("g2")]
    async with side_wedged() as wedged_url:
        for backend in good:
            backend.models = [f"m-{backend.name}"]
            backend.metrics_text = METRICS
            await backend.start()
        try:
            yield _doc(wedged_url, wedged, good, **kw), good
        finally:
            for backend in good:
                await backend.stop()


def _small_pool() -> ClientSession:
    return ClientSession(connector=TCPConnector(limit=4), cookie_jar=DummyCookieJar())


def _listed(body: bytes) -> list[str]:
    return sorted(entry["id"] for entry in json.loads(body)["data"])


def _queues(gateway: Gateway) -> dict[str, int]:
    variant = gateway.state.endpoint("main").variant("v1")
    return {n: variant.instances[n].waiting_requests for n in ("g1", "g2")}


async def test_a_models_read_waits_for_a_slot_outside_its_timeout() -> None:
    """Given a session whose pool holds 4 connections, 12 wedged instances take them all for
    ``timeoutS``, three times over; the good instances' reads start once a slot is free, and
    their models are listed."""
    async with fleet(12) as (doc, _good):
        gateway = Gateway(parse_gateway_config(doc), default_router_factory)
        async with _small_pool() as session:
            cache = ModelsCache(gateway.state, session)
            body = await asyncio.wait_for(cache.get(), 20)
        assert _listed(body) == ["m-g1", "m-g2"]


async def test_an_engine_stats_read_waits_for_a_slot_outside_its_timeout() -> None:
    """The same for the engine-stats probe's reads of ``/metrics``: both good queues are read."""
    async with fleet(12, strategy=STATS) as (doc, _good):
        gateway = Gateway(parse_gateway_config(doc), default_router_factory)
        async with _small_pool() as session:
            probe = EngineStatsProbe(gateway.state, session)
            await asyncio.wait_for(probe.poll_once(), 20)
        assert _queues(gateway) == {"g1": 3, "g2": 3}


async def test_seventy_wedged_instances_leave_the_healthy_ones_models_listed() -> None:
    """The running gateway: 70 instances whose ``/v1/models`` hangs (more than the 64
    connections of the pool the models cache shared) and two good ones: both good ones'
    models are listed."""
    async with fleet(70) as (doc, _good), gateway_running(parse_gateway_config(doc)) as started:
        gateway = started.gateway
        # (once the KV capacity probe's first reads, which hang too, have ended)
        await wait_until(lambda: gateway.kv_capacity.rounds_completed >= 1, what="kv round")
        async with aiohttp.ClientSession() as http, http.get(started.url + "/v1/models") as r:
            assert r.status == 200
            assert _listed(await r.read()) == ["m-g1", "m-g2"]


async def test_seventy_wedged_instances_leave_the_healthy_ones_engine_stats_read() -> None:
    """The running gateway: 70 instances whose ``/metrics`` hangs (each its own address) and
    two good ones, whose queues change: two rounds of the engine-stats probe later, both new
    queues are read."""
    async with (
        fleet(70, strategy=STATS) as (doc, good),
        gateway_running(parse_gateway_config(doc)) as started,
    ):
        probe = started.gateway.engine_stats
        await wait_until(lambda: probe.rounds_completed >= 2, what="two rounds")
        for backend in good:
            backend.metrics_text = METRICS.replace(" 3\n", " 5\n")
        after = probe.rounds_completed + 2
        await wait_until(lambda: probe.rounds_completed >= after, what="two more rounds")
        assert _queues(started.gateway) == {"g1": 5, "g2": 5}
