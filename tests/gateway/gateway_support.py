"""Test support for the gateway: fake OpenAI backends, gateway documents and a running gateway
on 127.0.0.1, a fake router, chat bodies with a JSON POST (the body-limit tests), and the failover
tests' health settings. Gateways on a background thread or in a subprocess are in
``gateway_process_support.py``."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import GatewayConfig, parse_gateway_config
from warmfleet.gateway.server import StartedApp, start_app
from warmfleet.gateway.variant import RouterFactory, RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.request import ChatRequest, CompletionsRequest, KeyRequest

MODEL = "fake-model"


@dataclass
class BackendStats:
    requests: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    disconnects: int = 0
    health_probes: int = 0
    metrics_reads: int = 0
    bodies: list[bytes] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[Mapping[str, str]] = field(default_factory=list)


class FakeBackend:
    """A tiny OpenAI-compatible server with controllable behaviour.

    ``chunks``/``chunk_delay_s`` shape streams; ``gate`` (if set) holds every stream after its
    first chunk until set; ``healthy`` drives ``/health``; ``fail_status`` answers every
    completion with that status; ``kill()`` closes the listener and every open connection
    abruptly, ``restart()`` listens again on the same port.
    """

    def __init__(self, name: str, *, chunks: int = 4, chunk_delay_s: float = 0.0) -> None:
        self.name = name
        self.chunks = chunks
        self.chunk_delay_s = chunk_delay_s
        self.gate: asyncio.Event | None = None
        self.healthy = True
        self.fail_status: int | None = None
        self.models = [MODEL]
        self.metrics_text: str | None = None  # ``/metrics`` (None: a 404)
        self.stats = BackendStats()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._transports: set[asyncio.BaseTransport] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/invocations", self._invocation)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self._app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def kill(self) -> None:
        """Die abruptly: refuse new connections and reset every open one."""
        for transport in list(self._transports):
            transport.abort()  # type: ignore[attr-defined]
        self._transports.clear()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.shutdown()
            for site in list(runner.sites):
                await site.stop()
            await runner.cleanup()

    async def restart(self) -> None:
        await self.start()

    async def _health(self, request: web.Request) -> web.Response:
        self.stats.health_probes += 1
        self._track(request)
        return web.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": 1, "owned_by": self.name} for m in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _metrics(self, _request: web.Request) -> web.Response:
        self.stats.metrics_reads += 1
        if self.metrics_text is None:
            return web.Response(status=404)
        return web.Response(text=self.metrics_text, content_type="text/plain")

    def _track(self, request: web.Request) -> None:
        if request.transport is not None:
            self._transports.add(request.transport)

    async def _invocation(self, request: web.Request) -> web.Response:
        self._track(request)
        raw = await request.read()
        self.stats.requests += 1
        self.stats.bodies.append(raw)
        self.stats.paths.append(request.path)
        return web.json_response({"echo_bytes": len(raw), "backend": self.name})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        self._track(request)
        raw = await request.read()
        self.stats.requests += 1
        self.stats.bodies.append(raw)
        self.stats.paths.append(request.path)
        self.stats.headers.append(dict(request.headers))
        if self.fail_status is not None:
            return web.json_response({"error": {"message": "injected"}}, status=self.fail_status)
        body = json.loads(raw)
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            return web.json_response(self._full(body, chat))
        return await self._stream(request, body, chat)

    def _full(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        text = f"hello from {self.name}"
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            kind = "text_completion"
        return {
            "id": f"cmpl-{self.name}",
            "object": kind,
            "created": 1,
            "model": body["model"],
            "choices": [choice],
            "usage": usage,
        }

    def _chunk(self, body: dict[str, Any], chat: bool, i: int, last: bool) -> bytes:
        piece = f"{self.name}-{i} "
        finish = "stop" if last else None
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": piece},
                "finish_reason": finish,
                "logprobs": None,
            }
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}
            kind = "text_completion"
        event = {
            "id": f"cmpl-{self.name}",
            "object": kind,
            "created": 1,
            "model": body["model"],
            "choices": [choice],
        }
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool
    ) -> web.StreamResponse:
        self.stats.streams_started += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                await resp.write(self._chunk(body, chat, i, i == self.chunks - 1))
                if i == 0 and self.gate is not None:
                    await self.gate.wait()
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.stats.disconnects += 1
            raise
        self.stats.streams_completed += 1
        return resp


def gateway_doc(
    backends: Sequence[FakeBackend],
    *,
    strategy: Mapping[str, Any] | None = None,
    health: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    admin_token: str | None = None,
    variants: Sequence[Mapping[str, Any]] | None = None,
    models: Sequence[str] = (MODEL,),
) -> dict[str, Any]:
    """A Gateway document with one endpoint ``main`` (one variant ``v1`` unless given)."""
    instances = [{"id": b.name, "url": b.url} for b in backends]
    if variants is None:
        variants = [
            {
                "name": "v1",
                "models": list(models),
                "routing": {"strategy": dict(strategy or {"type": "round_robin"})},
                "instances": instances,
            }
        ]
    spec: dict[str, Any] = {
        "health": dict(health or {"intervalS": 0.2, "timeoutS": 0.2}),
        "limits": dict(limits or {}),
        "endpoints": [{"name": "main", "variants": list(variants)}],
    }
    if admin_token is not None:
        spec["admin"] = {"token": admin_token}
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


def gateway_file(directory: Path, doc: dict[str, Any]) -> Path:
    """``doc``, listening on a free port of 127.0.0.1, written to ``directory/gateway.yaml``
    (the config of a ``GatewayProcess``; ``doc`` keeps the listen address for a rewrite)."""
    doc["spec"]["listen"] = {"host": "127.0.0.1", "port": 0}
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def gateway_config(backends: Sequence[FakeBackend], **kwargs: Any) -> GatewayConfig:
    return parse_gateway_config(gateway_doc(backends, **kwargs))


@asynccontextmanager
async def backends_running(*names: str, **kwargs: Any) -> AsyncIterator[list[FakeBackend]]:
    backends = [FakeBackend(n, **kwargs) for n in names]
    for b in backends:
        await b.start()
    try:
        yield backends
    finally:
        for b in backends:
            await b.stop()


@asynccontextmanager
async def gateway_running(
    config: GatewayConfig, factory: RouterFactory | None = None, **kwargs: Any
) -> AsyncIterator[StartedApp]:
    started = await start_app(create_app(config, router_factory=factory, **kwargs))
    try:
        yield started
    finally:
        await started.stop()


def parse_sse(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE byte stream, in order."""
    out = []
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[6:].decode())
    return out


class FakeRouter:
    """A RouterLike for unit tests: round robin over the snapshot, records what it saw."""

    def __init__(self, config: RoutingConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.cursor = 0
        self.keys: list[RoutingKey] = []
        self.tenants: list[str | None] = []
        self.instance_sets: list[list[InstanceId]] = []
        self.fleets: list[FleetSnapshot] = []

    def _key(self, data: bytes, tenant: str | None) -> RoutingKey:
        self.tenants.append(tenant)
        key = RoutingKey((hash(data),), 1, len(data), max(1, len(data) // 4), hash(data), 7)
        self.keys.append(key)
        return key

    def key(self, request: KeyRequest) -> RoutingKey:
        if isinstance(request, ChatRequest):
            return self._key(json.dumps(request.messages, sort_keys=True).encode(), request.tenant)
        if isinstance(request, CompletionsRequest):
            return self._key(json.dumps(request.prompts).encode(), request.tenant)
        return self._key(request.raw, request.tenant)

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        self.fleets.append(fleet)
        inst = fleet.instances[self.cursor % len(fleet.instances)]
        self.cursor += 1
        return Decision(
            inst.instance_id, Reason.ROUND_ROBIN, predicted_cached_blocks=1, spilled=True
        )

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        pass

    def adopt(self, previous: object) -> None:
        pass

    @property
    def engine_stats_interval_s(self) -> float | None:
        return None  # reads no engine figures

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.instance_sets.append(list(instance_ids))


class FakeRouterFactory:
    """Keeps every FakeRouter it built (the last one is the live one)."""

    def __init__(self) -> None:
        self.routers: list[FakeRouter] = []

    def __call__(self, config: RoutingConfig, rng: random.Random) -> RouterLike:
        router = FakeRouter(config, rng)
        self.routers.append(router)
        return router


# ---- chat bodies and a JSON POST (the body-limit tests) ----------------------------------

CHAT = "/v1/chat/completions"


def chat(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **fields}


def nested(levels: int) -> Any:
    """``levels`` arrays nested in one another (``[[...]]``)."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


async def post(url: str, path: str, body: Mapping[str, Any] | bytes) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + path, data=data, headers={"Content-Type": "application/json"}) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


# ---- health settings (the failover tests) -----------------------------------------------

# Probes get a quarter second: on a loaded 2-core box a 0.1 s probe timeout fails healthy probes.
HEALTH = {"interval_s": 0.25, "timeout_s": 0.25, "unhealthy_threshold": 2, "healthy_threshold": 2}
