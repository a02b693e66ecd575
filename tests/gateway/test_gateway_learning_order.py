"""When the router learns a decision (``on_routed``, and with replica sync the note for the
peers): once the request is on its way to the instance when a pooled connection takes it (off a
lone request's critical path), before waiting when one must be opened, and always before the
next decision; a strategy bug there is the same 500 envelope as one in ``choose``."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from gateway_support import MODEL, FakeRouter, backends_running, gateway_config, gateway_running

from warmfleet.core.types import Decision, FleetSnapshot, RoutingKey
from warmfleet.gateway.http.upstream_pool import UpstreamPool
from warmfleet.gateway.server import StartedApp
from warmfleet.routing.config import RoutingConfig

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


class _Recorder(FakeRouter):
    """Records its calls, and whether the request was already on the wire when it learnt it."""

    def __init__(self, config: RoutingConfig, rng: random.Random) -> None:
        super().__init__(config, rng)
        self.pool: UpstreamPool | None = None
        self.calls: list[str] = []
        self.sent_before_learning: list[bool] = []
        self.fail_learning_at: int | None = None  # the n-th on_routed (from 1) raises

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        self.calls.append("choose")
        return super().choose(key, fleet)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.calls.append("learn")
        assert self.pool is not None
        self.sent_before_learning.append(any(c.exchange is not None for c in self.pool.open))
        if self.calls.count("learn") == self.fail_learning_at:
            raise RuntimeError("strategy bug")


class _Routers:
    """The router factory: keeps every router it built (the last one is the live one)."""

    def __init__(self) -> None:
        self.built: list[_Recorder] = []

    def __call__(self, config: RoutingConfig, rng: random.Random) -> _Recorder:
        self.built.append(_Recorder(config, rng))
        return self.built[-1]

    def live(self, gw: StartedApp) -> _Recorder:
        router = self.built[-1]
        router.pool = gw.gateway.proxy.pool
        return router


@asynccontextmanager
async def _running(
    *names: str,
) -> AsyncIterator[tuple[StartedApp, aiohttp.ClientSession, _Recorder]]:
    """Stub instances ``names``, a gateway routing with a ``_Recorder``, and a client."""
    routers = _Routers()
    async with (
        backends_running(*names) as backends,
        gateway_running(gateway_config(backends), routers) as gw,
        aiohttp.ClientSession() as client,
    ):
        yield gw, client, routers.live(gw)


async def _post(client: aiohttp.ClientSession, gw: StartedApp) -> tuple[int, str]:
    async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
        return resp.status, await resp.text()


async def test_a_pooled_request_is_learnt_once_on_its_way_a_new_connection_before_it() -> None:
    async with _running("a") as (gw, client, router):
        for _ in range(3):
            assert (await _post(client, gw))[0] == 200
    # the first request opened the connection (learnt before waiting for it); the next two
    # took it from the pool, and were learnt with their bytes already sent
    assert router.sent_before_learning == [False, True, True]
    assert router.calls == ["choose", "learn"] * 3


async def test_no_decision_is_made_before_the_previous_one_is_learnt() -> None:
    async with _running("a", "b") as (gw, client, router):
        for _ in range(2):  # a cold pool (connections opened), then a warm one
            answers = await asyncio.gather(*(_post(client, gw) for _ in range(16)))
            assert [status for status, _ in answers] == [200] * 16
    assert router.calls == ["choose", "learn"] * 32
    assert any(router.sent_before_learning)


async def test_a_strategy_bug_in_learning_is_a_500_and_releases_the_instance() -> None:
    async with _running("a") as (gw, client, router):
        router.fail_learning_at = 2  # a pooled request: its bytes are already on the way
        assert (await _post(client, gw))[0] == 200
        status, text = await _post(client, gw)
        assert status == 500
        assert "routing failed: RuntimeError" in text
        assert (await _post(client, gw))[0] == 200  # the instance still serves
        variant = gw.gateway.state.default_endpoint().variant("v1")
        assert variant.instances["a"].in_flight_requests == 0
    # the failed request's connection was aborted (the instance sees the request dropped): the
    # third one opened a new connection
    assert router.sent_before_learning == [False, True, False]
