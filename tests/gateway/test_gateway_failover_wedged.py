"""Finding 2: a wedged instance (its /health answers, its completions hang) -> its requests are
retried elsewhere (none fails, also when they time out together), it is ejected by passive
outlier detection, passing health probes do not readmit it, and real requests on probation do;
an instance that hangs on one prompt only is never ejected, and that prompt is not pinned to it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from gateway_support import (
    HEALTH,
    MODEL,
    FakeBackend,
    backends_running,
    gateway_doc,
    gateway_running,
)
from wedged_instance import WedgedInstance

from warmfleet.core.types import Reason
from warmfleet.gateway.config import GatewayConfig, parse_gateway_config
from warmfleet.gateway.health import HealthMonitor
from warmfleet.gateway.server import StartedApp
from warmfleet.gateway.variant import VariantRuntime

# ---- a wedged instance (finding 2): /health answers 200, completions never answer --------

ADMIN_TOKEN = "outlier-admin-token-0123"
READ_TIMEOUT_S = 4.0
OUTLIER = {
    "consecutive_failures": 3,
    "base_ejection_time_s": 4.0,
    "max_ejection_time_s": 30.0,
    "max_ejection_percent": 50,
}


def _prompt(user: int, marker: str = "") -> dict[str, object]:
    text = f"user {user} asks: {marker} " + " ".join(f"w{user}-{i}" for i in range(300))
    return {"model": MODEL, "messages": [{"role": "user", "content": text}]}


def _wedged_config(
    backend: FakeBackend,
    wedged: WedgedInstance,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_attempts: int = 2,
) -> GatewayConfig:
    doc = gateway_doc(
        [backend],
        strategy={"type": "prefix_affinity"},
        health={**HEALTH, "outlier": OUTLIER},
        limits={"upstream_read_timeout_s": read_timeout_s, "max_attempts": max_attempts},
        admin_token=ADMIN_TOKEN,
    )
    doc["spec"]["endpoints"][0]["variants"][0]["instances"].append(
        {"id": wedged.name, "url": wedged.url}
    )
    return parse_gateway_config(doc)


class _Client:
    """Posts chats and reads the wedged instance's standing through the admin API."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.failed = 0
        self.answers: list[tuple[str, str, str | None]] = []  # instance, reason, attempts

    async def chat(self, user: int, marker: str = "") -> str:
        body = _prompt(user, marker)
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as r:
            await r.read()
            if r.status != 200:
                self.failed += 1
            instance = r.headers["x-warmfleet-instance"]
            reason = r.headers["x-warmfleet-reason"]
            self.answers.append((instance, reason, r.headers.get("x-warmfleet-attempts")))
            return instance

    async def outlier(self, iid: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        path = "/admin/v1/endpoints/main/variants/v1"
        async with self.session.get(self.url + path, headers=headers) as r:
            assert r.status == 200
            instances = (await r.json())["instances"]
        found: dict[str, Any] = next(i for i in instances if i["id"] == iid)
        return found


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of ``name`` whose labels include ``labels`` (0 if absent)."""
    for line in metrics.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class _SkippableClock:
    """The gateway's clock of passive ejections: ``time.monotonic()`` plus the time a test
    skipped, so an ejection ends without the test sleeping through it (virtual time: the
    ejection timer reads only this clock; health rounds and read timeouts stay real)."""

    def __init__(self) -> None:
        self.skipped_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped_s


async def _skip_ejection(client: _Client, clock: _SkippableClock, iid: str) -> None:
    """Skip what is left of ``iid``'s ejection time on ``clock`` (nothing if it has passed)."""
    remaining_s = (await client.outlier(iid))["outlier"]["ejection_remaining_s"]
    if remaining_s > 0:
        clock.skipped_s += remaining_s + 0.01  # the admin view rounds it to the millisecond


async def _until_standing(client: _Client, iid: str, standing: str) -> None:
    for _ in range(200):  # bounded: at most ~20 s
        if (await client.outlier(iid))["outlier"]["standing"] == standing:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{iid} never reached {standing}")


async def _until_sent_to(client: _Client, wedged: WedgedInstance, first_user: int) -> int:
    """Send fresh prompts, one at a time, until one reaches ``wedged``; returns the next user."""
    before = wedged.completions_received
    for user in range(first_user, first_user + 30):
        await client.chat(user)
        if wedged.completions_received > before:
            return user + 1
    raise AssertionError("no request reached the instance on probation")


async def _first_sent_to(client: _Client, inst: WedgedInstance, marker: str) -> int:
    """A prompt (by user number) whose first request the router sends to ``inst``."""
    for user in range(100, 130):
        before = inst.completions_received
        await client.chat(user, marker=marker)
        if inst.completions_received > before:
            return user
    raise AssertionError(f"no prompt was sent to {inst.name}")


@asynccontextmanager
async def _wedged_fleet() -> AsyncIterator[
    tuple[WedgedInstance, StartedApp, _Client, _SkippableClock]
]:
    """A wedged instance ``w`` and a working backend ``b`` behind a gateway; its client and its
    clock of ejections."""
    wedged = WedgedInstance("w")
    clock = _SkippableClock()
    await wedged.start()
    try:
        async with backends_running("b") as backends:
            config = _wedged_config(backends[0], wedged)
            async with (
                gateway_running(config, clock=clock) as gw,
                aiohttp.ClientSession() as session,
            ):
                yield wedged, gw, _Client(session, gw.url), clock
    finally:
        await wedged.stop()


@pytest.mark.slow
async def test_wedged_instance_retried_ejected_and_readmitted_only_by_requests() -> None:
    async with _wedged_fleet() as (wedged, gw, client, clock):
        variant = gw.gateway.state.default_endpoint().variant("v1")
        await _phase_eject(client, wedged, gw.gateway.metrics.render)
        await _phase_probes_do_not_readmit(client, wedged, gw.gateway.health, variant)
        await _phase_probation(client, clock, wedged, variant, gw.gateway.metrics.render)


async def _phase_eject(
    client: _Client, wedged: WedgedInstance, render: Callable[[], bytes]
) -> None:
    """20 requests, 10 prompts (two rounds, prefix affinity): none fails; the wedged instance is
    ejected at its third timeout, not before, and gets nothing more."""
    ejected_after: int | None = None
    for _ in range(2):
        for user in range(10):
            await client.chat(user)
            state = (await client.outlier("w"))["outlier"]
            if state["standing"] == "ejected" and ejected_after is None:
                ejected_after = wedged.completions_received
            if ejected_after is None:
                assert state["consecutive_failures"] == wedged.completions_received
    assert client.failed == 0
    assert ejected_after == OUTLIER["consecutive_failures"]
    assert wedged.completions_received == ejected_after  # nothing reached it once ejected
    retried = [a for a in client.answers if a[2] is not None]
    assert len(retried) == ejected_after  # every timeout retried, on b, with a real reason
    assert {(i, n) for i, _, n in retried} == {("b", "2")}
    assert {r for _, r, _ in retried} <= {r.value for r in Reason}
    metrics = render().decode()
    assert _sample(metrics, "warmfleet_gateway_ejections_total", instance_id="w") == 1
    assert _sample(metrics, "warmfleet_gateway_ejections_total", cause="passive_timeout") == 1
    timeouts = _sample(
        metrics, "warmfleet_gateway_attempt_failures_total", instance_id="w", cause="timeout"
    )
    assert timeouts == ejected_after
    assert _sample(metrics, "warmfleet_gateway_retries_total") == ejected_after
    assert _sample(metrics, "warmfleet_gateway_instance_ejected", instance_id="w") == 1
    assert _sample(metrics, "warmfleet_gateway_requests_total", instance_id="w") == 0


async def _phase_probes_do_not_readmit(
    client: _Client, wedged: WedgedInstance, health: HealthMonitor, variant: VariantRuntime
) -> None:
    """While ejected, its /health keeps answering 200: that readmits nothing."""
    probes = wedged.health_probes
    for _ in range(3):  # healthy_threshold is 2: three good rounds would have readmitted it
        await asyncio.wait_for(health.wait_round(), 10)
    assert wedged.health_probes >= probes + 3
    state = await client.outlier("w")
    assert state["active_healthy"] is True
    assert state["healthy"] is False
    assert state["outlier"]["standing"] == "ejected"
    assert "w" not in [i.instance_id for i in variant.healthy]


async def _phase_probation(
    client: _Client,
    clock: _SkippableClock,
    wedged: WedgedInstance,
    variant: VariantRuntime,
    render: Callable[[], bytes],
) -> None:
    """After its ejection time it is on probation: still wedged, its one request fails and it
    is ejected again, for twice as long; answering again, one request readmits it."""
    await _skip_ejection(client, clock, "w")
    await _until_standing(client, "w", "probation")
    user = await _until_sent_to(client, wedged, 100)
    state = (await client.outlier("w"))["outlier"]
    assert state["standing"] == "ejected"
    assert state["times_ejected"] == 2
    assert state["ejection_remaining_s"] > OUTLIER["base_ejection_time_s"]  # 2 x base
    assert client.failed == 0

    wedged.wedged = False
    await _skip_ejection(client, clock, "w")
    await _until_standing(client, "w", "probation")
    await _until_sent_to(client, wedged, user)
    state = await client.outlier("w")
    assert (state["healthy"], state["outlier"]["standing"]) == (True, "in")
    assert "w" in [i.instance_id for i in variant.healthy]
    assert wedged.completions_answered == 1
    assert client.answers[-1][0] == "w"
    assert client.failed == 0
    metrics = render().decode()
    assert _sample(metrics, "warmfleet_gateway_readmissions_total", instance_id="w") == 1
    assert _sample(metrics, "warmfleet_gateway_ejections_total", instance_id="w") == 2


@pytest.mark.slow
async def test_wedged_instance_concurrent_rounds_none_fails() -> None:
    """The finding's load: two rounds of the same 10 prompts, each round sent at once. The
    requests hanging on the wedged instance time out together; each is retried on b; the
    instance is ejected once (the timeouts after the third find it ejected already)."""
    async with _wedged_fleet() as (wedged, gw, client, _clock):
        await asyncio.gather(*(client.chat(u) for u in range(10)))
        assert wedged.completions_held >= OUTLIER["consecutive_failures"]
        await asyncio.gather(*(client.chat(u) for u in range(10)))
        assert client.failed == 0
        held = wedged.completions_held
        assert [a for a in client.answers if a[0] != "b"] == []
        assert len([a for a in client.answers if a[2] == "2"]) == held
        assert (await client.outlier("w"))["outlier"]["standing"] == "ejected"
        metrics = gw.gateway.metrics.render().decode()
        assert _sample(metrics, "warmfleet_gateway_ejections_total", instance_id="w") == 1


async def test_a_prompt_is_not_pinned_to_an_instance_that_keeps_failing_it() -> None:
    """An instance that hangs on one prompt only answers the others, so it is never ejected.
    Without retries (max_attempts 1) the router learns that prompt's prefix on that instance
    only, and prefix affinity would send it back there every round (each time a 504). After
    failing there once, the prompt goes elsewhere first."""
    stuck = WedgedInstance("w")
    stuck.wedged = False
    stuck.hang_on = b"stuck"
    await stuck.start()
    try:
        async with backends_running("b") as backends:
            config = _wedged_config(backends[0], stuck, read_timeout_s=1.0, max_attempts=1)
            async with gateway_running(config) as gw, aiohttp.ClientSession() as session:
                client = _Client(session, gw.url)
                user = await _first_sent_to(client, stuck, marker="stuck")
                for _ in range(4):
                    for other in range(4):
                        await client.chat(other)
                    await client.chat(user, marker="stuck")
                assert client.failed == 1  # its first request: nowhere else to try
                assert stuck.completions_held == 1  # once, never again
                assert stuck.completions_answered >= 4  # w serves the other prompts
                assert (await client.outlier("w"))["outlier"]["standing"] == "in"
    finally:
        await stuck.stop()
