"""Wedged instances (their ``/health`` never answers) cannot get healthy ones ejected: a probe's
``health.timeoutS`` covers its own exchange only, never a wait for a connection slot behind the
wedged instances' probes (with 64 of them the probes' pool was full, and every healthy instance
probed in the same round timed out in the queue)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import ClientSession, DummyCookieJar, TCPConnector
from gateway_support import FakeBackend, backends_running, gateway_doc, gateway_running

from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.health import HealthMonitor
from warmfleet.gateway.runtime import Gateway

# Half a second: room for a healthy probe on a loaded 2-core box (no duration is asserted).
HEALTH = {"intervalS": 1.0, "timeoutS": 0.5, "unhealthyThreshold": 1, "healthyThreshold": 1}


@asynccontextmanager
async def hanging_health() -> AsyncIterator[str]:
    """A server on 127.0.0.1 that accepts connections and never answers (until the client
    leaves: each handler ends at its connection's EOF); yields its URL."""
    writers: set[asyncio.StreamWriter] = set()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            while await reader.read(65536):
                pass  # the probe's request: never answered
        except ConnectionError:
            pass
        finally:
            writers.discard(writer)
            writer.close()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in list(writers):
            writer.close()
        await asyncio.wait_for(server.wait_closed(), 10)


def _doc(wedged_url: str, wedged: int, good: list[FakeBackend]) -> dict[str, Any]:
    """Wedged instances first: their probes start first in every round."""
    doc = gateway_doc(good, health=HEALTH)
    instances = [{"id": f"a-wedged-{i:02d}", "url": wedged_url} for i in range(wedged)]
    doc["spec"]["endpoints"][0]["variants"][0]["instances"][:0] = instances
    return doc


def _good(gateway: Gateway, names: list[str]) -> list[tuple[str, int, bool]]:
    variant = gateway.state.endpoint("main").variant("v1")
    return [(n, variant.instances[n].failures, variant.instances[n].active_healthy) for n in names]


async def test_a_probe_waits_for_a_slot_outside_its_timeout() -> None:
    """Given a session whose pool holds 4 connections, 6 wedged instances take them all for
    ``timeoutS``; the healthy instances' probes start once a slot is free, and pass."""
    async with hanging_health() as wedged_url, backends_running("g1", "g2") as good:
        gateway = Gateway(parse_gateway_config(_doc(wedged_url, 6, good)), default_router_factory)
        connector = TCPConnector(limit=4)
        async with ClientSession(connector=connector, cookie_jar=DummyCookieJar()) as session:
            monitor = HealthMonitor(gateway.state, session)
            await asyncio.wait_for(monitor.poll_once(), 20)
        assert _good(gateway, ["g1", "g2"]) == [("g1", 0, True), ("g2", 0, True)]
        variant = gateway.state.endpoint("main").variant("v1")
        wedged = [i for i in variant.instances.values() if i.instance_id.startswith("a-")]
        assert [i.active_healthy for i in wedged] == [False] * 6  # each probe still timed out


async def test_seventy_wedged_instances_leave_the_healthy_ones_in() -> None:
    """The running gateway: 70 instances whose ``/health`` hangs (more than the 64 connections
    the shared pool of the probes had) and two healthy ones, ejected at the first failed
    probe: after a round the healthy ones are still in."""
    async with hanging_health() as wedged_url, backends_running("g1", "g2") as good:
        config = parse_gateway_config(_doc(wedged_url, 70, good))
        async with gateway_running(config) as started:
            gateway = started.gateway
            await asyncio.wait_for(gateway.health.wait_round(), 20)
            assert _good(gateway, ["g1", "g2"]) == [("g1", 0, True), ("g2", 0, True)]
            variant = gateway.state.endpoint("main").variant("v1")
            assert sorted(i.instance_id for i in variant.routable) == ["g1", "g2"]
