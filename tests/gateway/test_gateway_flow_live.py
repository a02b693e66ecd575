"""Flow control live (issue 23): the gateway drives the FlowGate in front of the emulator.

One emulated instance with ``maxInFlightPerInstance: 1`` makes the queue deterministic: the
next request is dispatched only when the previous one has answered, so the order the answers
arrive in is the dispatch order. Assertions are on counts, statuses, reasons and order, never on
durations; every test is bounded (a few short requests)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from gateway_support import FakeRouter, backends_running, gateway_running

from support.waiting import wait_until
from warmfleet.api.trace_format import parse_trace
from warmfleet.core.types import Decision, RoutingKey
from warmfleet.emulator.config import build_spec
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.flow import GatewayFlow, VariantFlow
from warmfleet.gateway.server import StartedApp

pytestmark = pytest.mark.slow

MODEL = "warmfleet-emulated"
CHAT = "/v1/chat/completions"
FLOW: dict[str, Any] = {
    "maxInFlightPerInstance": 1,
    "maxQueuedPerFlow": 4,
    "maxQueuedRequests": 64,
    "maxWaitMs": 20_000,
    "enginePreset": "tiny-cpu",
    "bands": [{"name": "default", "minPriority": -1000}],
    "tenants": {"victim": {}, "bully": {}},
}


@dataclass
class Answer:
    tenant: str
    status: int
    reason: str
    retry_after: str | None
    error: dict[str, Any] | None


@asynccontextmanager
async def _fleet(speedup: float = 4.0) -> AsyncIterator[EmulatedFleet]:
    spec = build_spec(instances=1, preset="tiny-cpu", block_size=16, speedup=speedup)
    async with EmulatedFleet(spec) as fleet:
        yield fleet


def _variant(flow: dict[str, Any], **where: Any) -> dict[str, Any]:
    routing = {"strategy": {"type": "prefix_affinity"}, "flow": flow}
    return {"name": "v1", "models": [MODEL], "routing": routing, **where}


def _doc(variant: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "health": {"intervalS": 0.2, "timeoutS": 0.2},
        "endpoints": [{"name": "main", "variants": [variant]}],
    }
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


@asynccontextmanager
async def _gateway(variant: dict[str, Any]) -> AsyncIterator[StartedApp]:
    async with gateway_running(parse_gateway_config(_doc(variant))) as gw:
        yield gw


def _flow(gw: StartedApp) -> VariantFlow:
    flows: GatewayFlow = gw.gateway.flow
    (flow,) = flows.flows.values()
    return flow


def _queued(gw: StartedApp) -> int:
    flows = gw.gateway.flow.flows
    return sum(f.gate.demand() for f in flows.values())


def _running(gw: StartedApp) -> int:
    flows = gw.gateway.flow.flows
    return sum(f.gate.running() for f in flows.values())


def _body(text: str, max_tokens: int = 12) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def _send(
    client: aiohttp.ClientSession,
    gw: StartedApp,
    tenant: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    done: list[Answer] | None = None,
) -> Answer:
    all_headers = {"x-prefix-aware-id": tenant, **(headers or {})}
    async with client.post(gw.url + CHAT, json=body, headers=all_headers) as resp:
        raw = await resp.read()
        error = None
        if resp.status != 200:
            error = yaml.safe_load(raw)["error"]
        answer = Answer(
            tenant,
            resp.status,
            resp.headers.get("x-warmfleet-reason", ""),
            resp.headers.get("Retry-After"),
            error,
        )
    if done is not None:
        done.append(answer)
    return answer


async def _metrics(client: aiohttp.ClientSession, gw: StartedApp) -> str:
    async with client.get(gw.url + "/metrics") as resp:
        return await resp.text()


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample of ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_bursting_tenant_does_not_starve_or_shed_the_victim() -> None:
    """The bully bursts 8 requests (1 runs, 4 queue, 3 are shed 429 by its flow's bound);
    the victim's 3 requests, arriving behind the whole burst, all queue and are served
    interleaved with the bully's (VTC), none shed; every request is answered exactly once."""
    async with (
        _fleet() as fleet,
        _gateway(_variant(FLOW, instances=[{"id": "emu-0", "url": fleet.urls[0]}])) as gw,
        aiohttp.ClientSession() as client,
    ):
        await wait_until(lambda: bool(gw.gateway.state.endpoints["main"].variants["v1"].routable))
        done: list[Answer] = []
        bully = [
            asyncio.create_task(_send(client, gw, "bully", _body(f"bully {i}"), done=done))
            for i in range(8)
        ]
        await wait_until(lambda: _queued(gw) == 4 and len(done) >= 3)
        victim = [
            asyncio.create_task(_send(client, gw, "victim", _body(f"victim {i}"), done=done))
            for i in range(3)
        ]
        await wait_until(lambda: _queued(gw) == 7)
        answers = await asyncio.gather(*bully, *victim)
        text = await _metrics(client, gw)
        flow = _flow(gw)
    assert len(done) == len(answers) == 11  # each answered once
    shed = [a for a in answers if a.status != 200]
    assert [(a.tenant, a.status, a.reason) for a in shed] == [("bully", 429, "shed")] * 3
    assert all(a.retry_after is not None and int(a.retry_after) >= 1 for a in shed)
    assert all(a.error is not None and a.error["type"] == "rate_limit_error" for a in shed)
    served = [a.tenant for a in done if a.status == 200]
    assert served.count("victim") == 3
    assert served.count("bully") == 5
    # behind the whole burst, yet the victim's requests alternate with the bully's
    assert served.index("victim") <= 2
    assert served[-1] == "bully"
    assert max(i for i, t in enumerate(served) if t == "victim") < len(served) - 1
    assert {a.reason for a in done if a.status == 200 and a.tenant == "victim"} == {"queued"}
    labels = {"endpoint": "main", "variant": "v1", "band": "default"}
    assert _sample(text, "warmfleet_gateway_flow_shed_total", **labels, tenant="bully") == 3
    assert _sample(text, "warmfleet_gateway_flow_shed_total", **labels, tenant="victim") == 0
    assert _sample(text, "warmfleet_gateway_flow_queued_requests", **labels) == 0
    waited = "warmfleet_gateway_flow_wait_seconds_count"
    assert _sample(text, waited, **labels, tenant="victim", outcome="dispatched") == 3
    assert _sample(text, "warmfleet_gateway_flow_ttft_seconds_count", kind="observed") == 8
    assert _sample(text, "warmfleet_gateway_flow_served_prompt_tokens_total", tenant="victim") > 0
    assert flow.gate.running() == 0
    assert flow.gate.demand() == 0
    assert not flow.parked


async def test_a_deadline_that_cannot_be_met_gets_429_at_once() -> None:
    """With the only instance busy, a request whose deadline is shorter than the expected
    wait is answered 429 ``deadline`` with Retry-After at once, while the blocker still runs:
    it never waited (its recorded wait is 0)."""
    async with (
        _fleet(speedup=1.0) as fleet,
        _gateway(_variant(FLOW, instances=[{"id": "emu-0", "url": fleet.urls[0]}])) as gw,
        aiohttp.ClientSession() as client,
    ):
        await wait_until(lambda: bool(gw.gateway.state.endpoints["main"].variants["v1"].routable))
        blocker = asyncio.create_task(_send(client, gw, "bully", _body("long", max_tokens=120)))
        await wait_until(lambda: _running(gw) == 1)
        headers = {"x-warmfleet-deadline-ms": "300"}
        late = await _send(client, gw, "victim", _body("in a hurry"), headers)
        assert not blocker.done()
        text = await _metrics(client, gw)
        assert (await blocker).status == 200
    assert (late.status, late.reason) == (429, "deadline")
    assert late.retry_after is not None
    assert int(late.retry_after) >= 1
    assert late.error is not None
    assert "deadline" in late.error["message"]
    labels = {"tenant": "victim", "outcome": "shed"}
    assert _sample(text, "warmfleet_gateway_flow_wait_seconds_count", **labels) == 1
    assert _sample(text, "warmfleet_gateway_flow_wait_seconds_sum", **labels) == 0.0
    assert _sample(text, "warmfleet_gateway_flow_shed_total", reason="deadline") == 1


async def test_bad_priority_or_deadline_is_a_400_naming_the_header() -> None:
    async with (
        _fleet() as fleet,
        _gateway(_variant(FLOW, instances=[{"id": "emu-0", "url": fleet.urls[0]}])) as gw,
        aiohttp.ClientSession() as client,
    ):
        for header, value in (
            ("x-warmfleet-priority", "urgent"),
            ("x-warmfleet-deadline-ms", "-5"),
        ):
            answer = await _send(client, gw, "victim", _body("x"), {header: value})
            assert answer.status == 400
            assert answer.error is not None
            assert answer.error["param"] == header
        ok = await _send(client, gw, "victim", _body("x"), {"x-warmfleet-priority": "-3"})
        assert ok.status == 200


def _write(path: Path, instances: list[dict[str, str]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"instances": instances}))
    os.replace(tmp, path)


async def test_zero_ready_replicas_hold_the_request_until_one_is_ready(tmp_path: Path) -> None:
    """No instance yet: the request waits in the flow queue (counted as demand), and is
    served once one appears; without one in time it is answered 503 with Retry-After."""
    listing = tmp_path / "instances.yaml"
    _write(listing, [])
    discovery = {"type": "file", "path": str(listing), "pollIntervalS": 0.05}
    async with (
        _fleet() as fleet,
        _gateway(_variant(FLOW, discovery=discovery)) as gw,
        aiohttp.ClientSession() as client,
    ):
        request = asyncio.create_task(_send(client, gw, "victim", _body("anyone there?")))
        await wait_until(lambda: _queued(gw) == 1)
        text = await _metrics(client, gw)
        depth = _sample(text, "warmfleet_gateway_flow_queued_requests", tenant="victim")
        assert depth == 1
        assert not request.done()
        _write(listing, [{"id": "emu-0", "url": fleet.urls[0]}])
        answer = await request
        assert (answer.status, answer.reason) == (200, "queued")
        assert _queued(gw) == 0
    short = {**FLOW, "maxWaitMs": 200}
    async with _gateway(_variant(short, discovery=discovery)) as gw, aiohttp.ClientSession() as c:
        _write(listing, [])
        await wait_until(lambda: not gw.gateway.state.endpoints["main"].variants["v1"].instances)
        answer = await _send(c, gw, "victim", _body("still nobody"))
    assert (answer.status, answer.reason) == (503, "deadline")
    assert answer.retry_after is not None
    assert answer.error is not None
    assert answer.error["type"] == "service_unavailable_error"


async def test_a_client_leaving_while_queued_leaves_the_queue() -> None:
    async with (
        _fleet(speedup=1.0) as fleet,
        _gateway(_variant(FLOW, instances=[{"id": "emu-0", "url": fleet.urls[0]}])) as gw,
        aiohttp.ClientSession() as client,
    ):
        await wait_until(lambda: bool(gw.gateway.state.endpoints["main"].variants["v1"].routable))
        blocker = asyncio.create_task(_send(client, gw, "bully", _body("long", max_tokens=60)))
        await wait_until(lambda: _running(gw) == 1)
        leaver = asyncio.create_task(_send(client, gw, "victim", _body("bye")))
        await wait_until(lambda: _queued(gw) == 1)
        leaver.cancel()  # the client disconnects while its request waits
        await wait_until(lambda: _queued(gw) == 0 and not _flow(gw).parked)
        assert (await blocker).status == 200
        after = await _send(client, gw, "victim", _body("next"))
        assert after.status == 200
        flow = _flow(gw)
        await wait_until(lambda: flow.gate.running() == 0)
        text = await _metrics(client, gw)
    assert flow.gate.cancelled == 1
    assert _sample(text, "warmfleet_gateway_flow_cancelled_total", variant="v1") == 1
    # only the blocker and the request after it reached the instance
    assert _sample(text, "warmfleet_gateway_requests_total", instance_id="emu-0") == 2
    variant = gw.gateway.state.endpoints["main"].variants["v1"]
    assert variant.instances["emu-0"].in_flight_requests == 0


async def test_a_reload_keeps_the_old_gates_queued_requests() -> None:
    """A new ``flow`` config builds a new gate for the next requests; the request queued in
    the old one is still dispatched there once the instance has room, none is lost."""
    async with (
        _fleet(speedup=1.0) as fleet,
        _gateway(_variant(FLOW, instances=[{"id": "emu-0", "url": fleet.urls[0]}])) as gw,
        aiohttp.ClientSession() as client,
    ):
        await wait_until(lambda: bool(gw.gateway.state.endpoints["main"].variants["v1"].routable))
        blocker = asyncio.create_task(_send(client, gw, "bully", _body("long", max_tokens=40)))
        await wait_until(lambda: _running(gw) == 1)
        queued = asyncio.create_task(_send(client, gw, "victim", _body("waiting")))
        await wait_until(lambda: _queued(gw) == 1)
        old = _flow(gw)
        variant = _variant(
            {**FLOW, "maxQueuedPerFlow": 5}, instances=[{"id": "emu-0", "url": fleet.urls[0]}]
        )
        gw.gateway.apply(parse_gateway_config(_doc(variant)), "test")
        after = await _send(client, gw, "victim", _body("after the reload"))
        answers = [await blocker, await queued]
        assert _flow(gw) is not old
    assert after.status == 200  # the new gate knew nothing of the old one's in-flight request
    assert [a.status for a in answers] == [200, 200]
    assert answers[1].reason == "queued"
    assert old.gate.demand() == 0
    assert old.gate.running() == 0
    assert not old.parked


class _BrokenRouter(FakeRouter):
    """Fails in ``on_routed``, after the gate has dispatched the request."""

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        raise RuntimeError("strategy bug")


async def test_a_strategy_bug_is_a_500_envelope_and_frees_the_gate() -> None:
    async with backends_running("a") as (a,):
        variant = _variant(FLOW, instances=[{"id": "a", "url": a.url}])
        variant["models"] = [MODEL]
        async with (
            gateway_running(parse_gateway_config(_doc(variant)), _BrokenRouter) as gw,
            aiohttp.ClientSession() as client,
        ):
            answer = await _send(client, gw, "victim", _body("x"))
            flow = _flow(gw)
    assert answer.status == 500
    assert answer.error is not None
    assert "routing failed" in answer.error["message"]
    assert flow.gate.running() == 0
    assert flow.gate.demand() == 0


async def test_the_capture_records_what_flow_control_acted_on(tmp_path: Path) -> None:
    """With ``spec.capture`` on, a flow-controlled request's line carries its priority, its
    own deadline and the gate's TTFT prediction (a trace the simulator replays with them)."""
    capture = tmp_path / "capture.jsonl"
    async with _fleet() as fleet:
        variant = _variant(FLOW, instances=[{"id": "emu-0", "url": fleet.urls[0]}])
        doc = _doc(variant)
        doc["spec"]["capture"] = {"path": str(capture)}
        async with (
            gateway_running(parse_gateway_config(doc)) as gw,
            aiohttp.ClientSession() as client,
        ):
            await wait_until(
                lambda: bool(gw.gateway.state.endpoints["main"].variants["v1"].routable)
            )
            headers = {"x-warmfleet-priority": "-2", "x-warmfleet-deadline-ms": "60000"}
            answer = await _send(client, gw, "victim", _body("captured"), headers)
            assert answer.status == 200
    (record,) = parse_trace(capture.read_text().splitlines(), str(capture)).records
    assert record.priority == -2
    assert record.deadline_ms == 60000.0
    assert record.predicted_ttft_ms is not None
    assert record.predicted_ttft_ms > 0.0
