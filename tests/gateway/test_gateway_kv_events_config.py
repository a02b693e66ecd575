"""Exact mode from the config file: ``spec.tokenizer_path`` + ``spec.kv_events`` over an emulated
fleet that publishes vLLM-style KV events (no vLLM needed)."""

from __future__ import annotations

import asyncio
import gc
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
import zmq
import zmq.asyncio

from support.waiting import wait_until
from warmfleet.bench.live_procs import free_port
from warmfleet.core.errors import ConfigError
from warmfleet.emulator.config import EmulatorSpec, build_spec
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import load_gateway_config, parse_gateway_config
from warmfleet.gateway.kv_events import EventBatch, KvEventRelay, encode_batch
from warmfleet.gateway.kv_events.service import KvEventService
from warmfleet.gateway.server import StartedApp, start_app

MODEL = "warmfleet-emulated"
BLOCK = 16
TOKEN = "kv-events-admin-token-0123"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def words(seed: int, count: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 9973:x}"[:4] for i in range(count))


def document(
    instances: list[dict[str, str]],
    *,
    tokenizer_path: str | None = "tok",
    kv_events: dict[str, Any] | None = None,
    key_mode: str = "tokens",
    models: tuple[str, ...] = (MODEL,),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "health": {"interval_s": 0.5, "timeout_s": 0.5},
        "admin": {"token": TOKEN},
        "endpoints": [
            {
                "name": "main",
                "variants": [
                    {
                        "name": "v1",
                        "models": list(models),
                        "routing": {
                            "strategy": {"type": "prefix_affinity"},
                            "key": {"mode": key_mode, "block_size": BLOCK},
                        },
                        "instances": instances,
                    }
                ],
            }
        ],
    }
    if tokenizer_path is not None:
        spec["tokenizer_path"] = tokenizer_path
    if kv_events is not None:
        spec["kv_events"] = kv_events
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


INSTANCES = [{"id": "emu-0", "url": "http://127.0.0.1:9"}]


# ---- config validation -------------------------------------------------------------------------


def test_tokens_mode_requires_tokenizer_path_named() -> None:
    with pytest.raises(ConfigError, match=r"tokenizerPath: required"):
        parse_gateway_config(document(INSTANCES, tokenizer_path=None))
    parse_gateway_config(document(INSTANCES, tokenizer_path=None, key_mode="text"))


def test_kv_events_fields_validated() -> None:
    events = {"endpoint": "tcp://127.0.0.1:1"}
    config = parse_gateway_config(document(INSTANCES, kv_events=events))
    assert config.spec.kv_events is not None
    assert config.spec.kv_events.bind is True
    assert config.spec.kv_events_model() == MODEL
    with pytest.raises(ConfigError, match=r"kvEvents.model: required"):
        parse_gateway_config(document(INSTANCES, kv_events=events, models=()))
    named = {**events, "model": "m"}
    assert parse_gateway_config(document(INSTANCES, kv_events=named, models=())).spec.kv_events
    with pytest.raises(ConfigError, match=r"exactly one variant"):
        parse_gateway_config(document(INSTANCES, kv_events=events, key_mode="text"))
    for bad in ({"endpoint": "127.0.0.1:1"}, {**events, "resync_batches": 0}, {**events, "x": 1}):
        with pytest.raises(ConfigError, match=r"kvEvents"):
            parse_gateway_config(document(INSTANCES, kv_events=bad))
    with pytest.raises(ConfigError, match=r"silenceTimeoutS"):
        parse_gateway_config(document(INSTANCES, kv_events={**events, "silence_timeout_s": 0}))


def test_relative_tokenizer_path_and_missing_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(document(INSTANCES, tokenizer_path="model")))
    config = load_gateway_config(path)
    assert config.spec.tokenizer_path == str(tmp_path / "model")
    with pytest.raises(ConfigError, match=r"tokenizer"):
        create_app(config)  # the directory has no tokenizer.json


def test_text_mode_gateway_has_no_kv_events() -> None:
    config = parse_gateway_config(document(INSTANCES, tokenizer_path=None, key_mode="text"))
    assert create_app(config).gateway.kv_events is None


# ---- exact mode over the emulator ----------------------------------------------------------------


def modes(started: StartedApp) -> dict[str, str]:
    service = started.gateway.kv_events
    assert service is not None
    return service.feed.modes()


async def chat(
    session: aiohttp.ClientSession, url: str, system: str, user: str
) -> tuple[dict[str, Any], str]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 2,
        "ignore_eos": True,
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json(), resp.headers.get("x-warmfleet-instance", "")


def cached_tokens(response: dict[str, Any]) -> int:
    details = response["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def held_blocks(service: KvEventService, instance: str) -> int:
    count: int = service.describe()["instances"][instance]["held_blocks"]
    return count


async def metric_lines(session: aiohttp.ClientSession, url: str) -> list[str]:
    async with session.get(f"{url}/metrics") as resp:
        return [ln for ln in (await resp.text()).splitlines() if "kv_events" in ln]


def two_engines(endpoint: str, capacity_blocks: int) -> EmulatorSpec:
    """Two emulated engines (``BLOCK``-token blocks) publishing KV events to ``endpoint``."""
    return build_spec(
        instances=2,
        preset="tiny-cpu",
        block_size=BLOCK,
        kv_capacity_tokens=capacity_blocks * BLOCK,
        speedup=20.0,
        kv_events={"endpoint": endpoint},
    )


@pytest.fixture
async def exact_setup(
    tmp_path: Path,
) -> AsyncIterator[tuple[StartedApp, EmulatedFleet, str, aiohttp.ClientSession]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    spec = two_engines(endpoint, 64)
    async with EmulatedFleet(spec) as fleet:
        instances = [{"id": f"emu-{i}", "url": u} for i, u in enumerate(fleet.urls)]
        events = {"endpoint": endpoint, "resync_batches": 2, "silence_timeout_s": 30.0}
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(document(instances, kv_events=events)))
        # The emulator's tokenizer stands in for a model directory's (tokenizer_path).
        app = create_app(load_gateway_config(path), config_path=path, tokenizer=EmulatorTokenizer())
        started = await start_app(app)
        try:
            async with aiohttp.ClientSession() as session:
                yield started, fleet, endpoint, session
        finally:
            await started.stop()


async def warm_until_exact(
    started: StartedApp, fleet: EmulatedFleet, session: aiohttp.ClientSession
) -> None:
    """Direct requests to every instance until the gateway's feed is exact for both (events
    sent before the subscription reached an engine are lost: the feed joins late, resyncs)."""
    for attempt in range(200):
        if all(modes(started).get(f"emu-{i}") == "exact" for i in range(2)):
            return
        for url in fleet.urls:
            await chat(session, url, f"warm {attempt} " + words(attempt, 40), "q")
        await asyncio.sleep(0.05)
    raise AssertionError(f"feed never exact: {started.gateway.kv_events.describe()}")  # type: ignore[union-attr]


async def test_exact_mode_from_config_routes_on_engine_events(
    exact_setup: tuple[StartedApp, EmulatedFleet, str, aiohttp.ClientSession],
) -> None:
    started, fleet, _endpoint, session = exact_setup
    service = started.gateway.kv_events
    assert isinstance(service, KvEventService)
    await warm_until_exact(started, fleet, session)
    # Documents cached on alternate instances *behind the gateway's back* (sent directly):
    # only the engines' events can tell the gateway where they are (1 in 16 by chance).
    for d in range(4):
        target = f"emu-{d % 2}"
        doc = f"shared document {d} " + words(7 + d, 200)
        held = held_blocks(service, target)
        direct, _ = await chat(session, fleet.urls[d % 2], doc, "first question")
        assert cached_tokens(direct) == 0
        await wait_until(
            lambda t=target, h=held: held_blocks(service, t) >= h + 12,  # type: ignore[misc]
            step_s=0.02,
            what="doc events",
        )
        response, instance = await chat(session, started.url, doc, "second question")
        assert instance == target
        assert cached_tokens(response) >= 12 * BLOCK  # the engine agrees: a real hit
    lines = await metric_lines(session, started.url)
    assert 'warmfleet_gateway_kv_events_exact{instance_id="emu-0"} 1.0' in lines
    assert 'warmfleet_gateway_kv_events_exact{instance_id="emu-1"} 1.0' in lines
    async with session.get(f"{started.url}/admin/v1/kv-events", headers=HEADERS) as resp:
        admin = await resp.json()
    assert admin["enabled"] is True
    assert admin["modes"] == {"emu-0": "exact", "emu-1": "exact"}
    assert admin["model"] == MODEL
    async with session.get(f"{started.url}/admin/v1/kv-events") as resp:
        assert resp.status == 401


async def inject_gap(endpoint: str, started: StartedApp, instance: str) -> None:
    """Publish an out-of-sequence (empty) batch for ``instance`` on the gateway's socket: the
    same thing the subscriber sees when the network or a slow joiner loses batches."""
    service = started.gateway.kv_events
    assert service is not None
    context = zmq.asyncio.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)
    try:
        before = service.describe()["stats"]["gaps"]
        for _ in range(200):  # PUB drops frames until the subscription has propagated
            last = service.describe()["instances"][instance]["last_seq"]
            frames = [
                f"kv.{instance}".encode(),
                struct.pack(">q", last + 50),
                encode_batch(EventBatch(time.time(), ())),
            ]
            await pub.send_multipart(frames)
            await asyncio.sleep(0.02)
            if service.describe()["stats"]["gaps"] > before:
                return
        raise AssertionError("injected gap never arrived")
    finally:
        pub.close(linger=0)
        context.term()


async def test_gap_falls_back_to_approximate_then_resyncs(
    exact_setup: tuple[StartedApp, EmulatedFleet, str, aiohttp.ClientSession],
) -> None:
    started, fleet, endpoint, session = exact_setup
    await warm_until_exact(started, fleet, session)
    await inject_gap(endpoint, started, "emu-0")
    assert modes(started)["emu-0"] == "approximate"
    assert modes(started)["emu-1"] == "exact"
    lines = await metric_lines(session, started.url)
    assert 'warmfleet_gateway_kv_events_exact{instance_id="emu-0"} 0.0' in lines
    gaps = [ln for ln in lines if ln.startswith("warmfleet_gateway_kv_events_gaps_total ")]
    assert len(gaps) == 1
    assert float(gaps[0].split()[1]) >= 1.0
    assert "# TYPE warmfleet_gateway_kv_events_gaps_total counter" in lines  # not a gauge
    assert "# TYPE warmfleet_gateway_kv_events_replays_total counter" in lines
    async with session.get(f"{started.url}/admin/v1/kv-events", headers=HEADERS) as resp:
        admin = await resp.json()
    assert admin["instances"]["emu-0"]["cause"].startswith("sequence gap")
    # Routing keeps working on the approximate index meanwhile.
    _, instance = await chat(session, started.url, "during the gap " + words(3, 60), "q")
    assert instance in {"emu-0", "emu-1"}
    # New engine batches with consecutive numbers whose blocks translate: exact again.
    for attempt in range(100):
        if modes(started)["emu-0"] == "exact":
            break
        await chat(session, fleet.urls[0], f"resync {attempt} " + words(50 + attempt, 40), "q")
        await asyncio.sleep(0.05)
    assert modes(started)["emu-0"] == "exact"
    # The resynced view is used: a document stored on emu-0 since the gap attracts its questions.
    doc = "after resync " + words(11, 200)
    service = started.gateway.kv_events
    assert service is not None
    held = held_blocks(service, "emu-0")
    await chat(session, fleet.urls[0], doc, "first")
    await wait_until(
        lambda: held_blocks(service, "emu-0") >= held + 12,
        step_s=0.02,
        what="the document's events",
    )
    assert modes(started)["emu-0"] == "exact"
    response, instance = await chat(session, started.url, doc, "second")
    assert instance == "emu-0"
    assert cached_tokens(response) > 0


async def test_lifespan_owns_the_subscriber(tmp_path: Path) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = parse_gateway_config(document(INSTANCES, kv_events={"endpoint": endpoint}), "test")
    for _ in range(2):  # the second bind succeeds only if the first socket was closed
        app = create_app(config, tokenizer=EmulatorTokenizer())
        service = app.gateway.kv_events
        assert service is not None
        assert service.subscriber is None  # nothing bound before the lifespan starts
        started = await start_app(app)
        assert service.subscriber is not None
        assert service.describe()["running"] is True
        await started.stop()
        assert service.subscriber is None
        assert service.describe()["running"] is False


def _gateway_tasks() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("warmfleet-")]


async def test_a_busy_event_port_fails_the_start_naming_the_field_and_stops_the_rest() -> None:
    """The KV-event socket binds last in the runtime's start, after its tasks and its HTTP
    session exist: a busy port must stop them all, not leak them."""
    ctx = zmq.Context()
    holder = ctx.socket(zmq.PUB)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    config = parse_gateway_config(document(INSTANCES, kv_events={"endpoint": endpoint}), "test")
    try:
        app = create_app(config, tokenizer=EmulatorTokenizer())
        with pytest.raises(ConfigError, match=r"spec\.kvEvents\.endpoint: cannot bind"):
            await start_app(app)
        await asyncio.sleep(0)  # cancelled tasks finish
        assert _gateway_tasks() == []
        open_sessions = [
            o for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed
        ]
        assert open_sessions == []
        assert app.gateway.kv_events is not None
        assert app.gateway.kv_events.subscriber is None
    finally:
        holder.close(linger=0)
        ctx.term()
    started = await start_app(create_app(config, tokenizer=EmulatorTokenizer()))  # port free
    await started.stop()


def test_a_relay_that_cannot_bind_closes_what_it_bound() -> None:
    ctx = zmq.Context()
    holder = ctx.socket(zmq.PUB)
    try:
        busy = holder.bind_to_random_port("tcp://127.0.0.1")
        engines = f"tcp://127.0.0.1:{free_port()}"
        with pytest.raises(zmq.ZMQError):
            KvEventRelay(engines, f"tcp://127.0.0.1:{busy}")
        again = ctx.socket(zmq.SUB)
        again.bind(engines)  # the relay's first socket let go of its port
        again.close(linger=0)
    finally:
        holder.close(linger=0)
        ctx.term()


def test_example_vllm_config_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "gateway-vllm.yaml"
    config = load_gateway_config(path)
    assert config.spec.kv_events is not None
    assert config.spec.kv_events_model() == "tiny-llama"
    assert config.spec.tokenizer_path == str(path.parent / "../.cache/tiny-llama")
