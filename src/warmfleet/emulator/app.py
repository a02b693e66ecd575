"""The aiohttp application of one emulated instance: vLLM's OpenAI routes and peers' probes.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/invocations`` (SageMaker style),
``/tokenize``, ``/v1/chat/completions/render``, ``/v1/completions/render``; ``GET /v1/models``,
``/health``, ``/ping``, ``/version``, ``/server_info``, ``/model_info``, ``/metrics``.
The app is served with ``handler_cancellation=True``: a client that disconnects cancels its
handler, whose ``finally`` cancels the engine request.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from warmfleet.core.errors import BadRequestError, NotFoundError
from warmfleet.core.jsonio import loads_body
from warmfleet.emulator.driver import EngineDriver, RequestStream
from warmfleet.emulator.metrics import CONTENT_TYPE, InstanceMetrics
from warmfleet.emulator.protocol import (
    DONE,
    Job,
    Kind,
    ParseContext,
    error_body,
    parse_job,
    tokenize_ids,
)
from warmfleet.emulator.responses import ChunkWriter, full_response
from warmfleet.engine.events import EngineEvent, EngineEventKind

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True, slots=True)
class FaultDecision:
    """What the instance's faults say about one completion request."""

    error: bool = False
    die: bool = False
    spike_s: float = 0.0


class FaultHost(Protocol):
    """What the handlers need from their instance (see ``instance.EmulatedInstance``)."""

    name: str

    @property
    def hanging(self) -> bool: ...

    def on_completion_request(self) -> FaultDecision: ...

    def die_now(self, request: web.Request) -> None: ...


@dataclass
class Runtime:
    """Everything one listener incarnation serves from."""

    host: FaultHost
    ctx: ParseContext
    driver: EngineDriver
    metrics: InstanceMetrics
    created_s: int


@dataclass(slots=True)
class _Batch:
    """What a batch of one request's engine events amounts to."""

    first: EngineEvent | None = None
    finished: EngineEvent | None = None
    rejected: bool = False
    produced: int = 0  # output tokens produced by the end of the batch


def _summarise(events: list[EngineEvent]) -> _Batch:
    batch = _Batch()
    for event in events:
        batch.produced = max(batch.produced, event.output_tokens)
        kind = event.kind
        if kind is EngineEventKind.TOKEN:
            continue
        if kind is EngineEventKind.FIRST_TOKEN:
            batch.first = event
        elif kind is EngineEventKind.FINISHED:
            batch.finished = event
        else:
            batch.rejected = True
    return batch


def _error(message: str, status: int, param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, status, param), status=status)


async def _read_json(request: web.Request) -> Any:
    return loads_body(await request.read())


class Handlers:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def _hang_if_asked(self) -> None:
        if self.rt.host.hanging:
            self.rt.metrics.faults.labels("hang").inc()
            await asyncio.get_running_loop().create_future()  # until the client gives up

    # ------------------------------------------------------------------ generation

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def invocations(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, None)

    async def _generate(self, request: web.Request, kind: Kind | None) -> web.StreamResponse:
        rt = self.rt
        arrival_s = rt.driver.now_wall_s()
        await self._hang_if_asked()
        action = rt.host.on_completion_request()
        if action.die:
            rt.metrics.faults.labels("die").inc()
            rt.host.die_now(request)
            raise web.HTTPServiceUnavailable()
        if action.error:
            rt.metrics.faults.labels("error").inc()
            return _error("injected fault: internal server error", 500)
        try:
            body = await _read_json(request)
            if kind is None:
                kind = "chat" if isinstance(body, dict) and "messages" in body else "completion"
            job = parse_job(body, kind, rt.ctx)
            self._check_fits(job)
        except BadRequestError as err:
            return _error(str(err), 400, err.param)
        except NotFoundError as err:
            return _error(str(err), 404, "model")
        if action.spike_s > 0:
            rt.metrics.faults.labels("latency_spike").inc()
            await asyncio.sleep(action.spike_s)
        stream = rt.driver.submit(
            job.block_hashes,
            len(job.prompt_ids),
            job.output_tokens,
            wants_tokens=job.stream,
            arrival_s=arrival_s,
            prompt_ids=job.prompt_ids,
        )
        try:
            if job.stream:
                return await self._stream(request, job, stream)
            return await self._full(job, stream)
        finally:
            rt.driver.cancel(stream)  # no-op once finished; cancels on client disconnect

    def _check_fits(self, job: Job) -> None:
        spec = self.rt.ctx.spec
        total = len(job.prompt_ids) + max(job.output_tokens, 1)
        if -(-total // spec.block_tokens) > spec.capacity_blocks:
            raise BadRequestError(
                f"the request needs {total} tokens of KV cache; this instance holds "
                f"{spec.capacity_blocks * spec.block_tokens}",
                param="messages" if job.kind == "chat" else "prompt",
            )

    def _on_first_token(self, stream: RequestStream, time_s: float) -> None:
        metrics = self.rt.metrics
        metrics.prompt_tokens.inc(stream.prompt_tokens)
        metrics.ttft_s.observe(max(0.0, self.rt.driver.wall_s(time_s) - stream.arrival_s))

    def _on_finished(self, job: Job, stream: RequestStream, time_s: float) -> None:
        metrics = self.rt.metrics
        metrics.e2e_s.observe(max(0.0, self.rt.driver.wall_s(time_s) - stream.arrival_s))
        metrics.request_finished(job.finish_reason)

    async def _full(self, job: Job, stream: RequestStream) -> web.Response:
        cached = 0
        produced = 0
        while True:
            batch = _summarise(await stream.next_batch())
            if batch.rejected:
                return _error("the request cannot fit this engine", 400)
            if batch.first is not None:
                cached = batch.first.cached_tokens
                self._on_first_token(stream, batch.first.time_s)
            if batch.produced > produced:
                self.rt.metrics.generation_tokens.inc(batch.produced - produced)
                produced = batch.produced
            if batch.finished is not None:
                self._on_finished(job, stream, batch.finished.time_s)
                return web.json_response(full_response(job, job.output_tokens, cached))

    async def _stream(
        self, request: web.Request, job: Job, stream: RequestStream
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        await resp.prepare(request)
        writer = ChunkWriter(job)
        cached = 0
        sent = 0
        while True:
            batch = _summarise(await stream.next_batch())
            if batch.rejected:
                err = error_body("the request cannot fit this engine", 400)
                await resp.write_eof(b"data: " + json.dumps(err).encode() + b"\n\n" + DONE)
                return resp
            out: list[bytes] = []
            if batch.first is not None:
                cached = batch.first.cached_tokens
                self._on_first_token(stream, batch.first.time_s)
                if job.kind == "chat":
                    out.append(writer.role())
            upto = min(batch.produced, job.output_tokens)
            if upto > sent:
                self.rt.metrics.generation_tokens.inc(upto - sent)
                out.append(writer.tokens(sent, upto))
                sent = upto
            if batch.finished is not None:
                self._on_finished(job, stream, batch.finished.time_s)
                if job.include_usage:
                    out.append(writer.usage(job.output_tokens, cached))
                out.append(DONE)
                await resp.write_eof(b"".join(out))  # last chunks + chunked end: one write
                return resp
            if out:
                await resp.write(b"".join(out))

    # ------------------------------------------------------------------ tokens

    async def tokenize(self, request: web.Request) -> web.Response:
        await self._hang_if_asked()
        try:
            ids = tokenize_ids(await _read_json(request), self.rt.ctx)
        except BadRequestError as err:
            return _error(str(err), 400, err.param)
        except NotFoundError as err:
            return _error(str(err), 404, "model")
        spec = self.rt.ctx.spec
        return web.json_response(
            {"count": len(ids), "max_model_len": spec.max_model_len, "tokens": ids}
        )

    async def render_chat(self, request: web.Request) -> web.Response:
        return await self._render(request, "chat")

    async def render_completions(self, request: web.Request) -> web.Response:
        return await self._render(request, "completion")

    async def _render(self, request: web.Request, kind: Kind) -> web.Response:
        """vLLM's render routes: chat -> one GenerateRequest, completions -> a list of them."""
        await self._hang_if_asked()
        try:
            job = parse_job(await _read_json(request), kind, self.rt.ctx)
        except BadRequestError as err:
            return _error(str(err), 400, err.param)
        except NotFoundError as err:
            return _error(str(err), 404, "model")
        rendered = {
            "request_id": job.response_id,
            "model": job.model,
            "token_ids": job.prompt_ids,
            "sampling_params": {"max_tokens": job.output_tokens},
        }
        return web.json_response(rendered if kind == "chat" else [rendered])

    # ------------------------------------------------------------------ info

    async def health(self, _request: web.Request) -> web.Response:
        await self._hang_if_asked()
        return web.Response(status=200)

    async def models(self, _request: web.Request) -> web.Response:
        await self._hang_if_asked()
        rt = self.rt
        card = {
            "id": rt.ctx.model,
            "object": "model",
            "created": rt.created_s,
            "owned_by": "vllm",
            "root": rt.ctx.model,
            "parent": None,
            "max_model_len": rt.ctx.spec.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    def _info(self) -> dict[str, Any]:
        spec = self.rt.ctx.spec
        return {
            "served_model_name": self.rt.ctx.model,
            "is_generation": True,
            "max_model_len": spec.max_model_len,
            "max_total_num_tokens": spec.kv_capacity_tokens,
            "page_size": spec.block_tokens,
            "block_size": spec.block_tokens,
            "max_num_seqs": spec.max_num_seqs,
            "max_num_batched_tokens": spec.max_num_batched_tokens,
            "tp_size": 1,
            "dp_size": 1,
            "engine": "warmfleet-emulator",
            "engine_preset": spec.name,
            "instance": self.rt.host.name,
        }

    async def server_info(self, _request: web.Request) -> web.Response:
        # No ``model_path``: sglang-router would try to download a tokenizer for it.
        await self._hang_if_asked()
        return web.json_response(self._info())

    async def model_info(self, _request: web.Request) -> web.Response:
        await self._hang_if_asked()
        return web.json_response(
            {"served_model_name": self.rt.ctx.model, "is_generation": True, "model_type": "llama"}
        )

    async def version(self, _request: web.Request) -> web.Response:
        await self._hang_if_asked()
        return web.json_response({"version": "warmfleet-emulator"})

    async def metrics(self, _request: web.Request) -> web.Response:
        await self._hang_if_asked()
        return web.Response(body=self.rt.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


def create_app(rt: Runtime) -> web.Application:
    handlers = Handlers(rt)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    r = app.router
    r.add_post("/v1/chat/completions", handlers.chat)
    r.add_post("/v1/completions", handlers.completions)
    r.add_post("/invocations", handlers.invocations)
    r.add_post("/tokenize", handlers.tokenize)
    r.add_post("/v1/chat/completions/render", handlers.render_chat)
    r.add_post("/v1/completions/render", handlers.render_completions)
    r.add_get("/v1/models", handlers.models)
    r.add_get("/health", handlers.health)
    r.add_get("/ping", handlers.health)
    r.add_get("/version", handlers.version)
    r.add_get("/server_info", handlers.server_info)
    r.add_get("/get_server_info", handlers.server_info)
    r.add_get("/model_info", handlers.model_info)
    r.add_get("/get_model_info", handlers.model_info)
    r.add_get("/metrics", handlers.metrics)
    return app


def created_now_s() -> int:
    return int(time.time())
