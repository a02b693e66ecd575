"""The aiohttp application of one emulated instance: vLLM's OpenAI routes and peers' probes.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses``
(``responses_api``), ``/v1/embeddings`` (``embeddings``), ``/invocations`` (SageMaker style),
``/tokenize``, ``/detokenize``, ``/v1/chat/completions/render``, ``/v1/completions/render``;
``GET /v1/models``, ``/health``, ``/ping``, ``/version``, ``/server_info``, ``/model_info``,
``/metrics``; vLLM's sleep mode: ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``
(``sleep``: while asleep the generation routes answer 503).
The app is served with ``handler_cancellation=True``: a client that disconnects cancels its
handler, whose ``finally`` cancels its engine requests (one per choice, ``generation``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from warmfleet.core.errors import BadRequestError, NotFoundError
from warmfleet.core.jsonio import loads_body
from warmfleet.emulator.detokenize import Detokenizer
from warmfleet.emulator.driver import EngineDriver
from warmfleet.emulator.embeddings import embeddings_answer
from warmfleet.emulator.generation import Generation, serve_full, serve_stream
from warmfleet.emulator.metrics import CONTENT_TYPE, InstanceMetrics
from warmfleet.emulator.protocol import (
    Job,
    Kind,
    ParseContext,
    error_body,
    parse_job,
    tokenize_ids,
)
from warmfleet.emulator.responses_api import ResponsesCall, responses_call, serve_responses
from warmfleet.emulator.sleep import SleepRoutes, SleepState, sleeping_response


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
    sleep_state: SleepState = field(default_factory=SleepState)

    def reset_kv_cache(self) -> bool:
        return self.driver.reset_prefix_cache()

    def requests_in_flight(self) -> int:
        return self.driver.in_flight

    def wake_wall_s(self, level: int) -> float:
        return self.ctx.spec.wake_s(level) / self.driver.speedup


def _error(message: str, status: int, param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, status, param), status=status)


async def _read_json(request: web.Request) -> Any:
    return loads_body(await request.read())


class Handlers:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.detokenizer = Detokenizer(rt.ctx.tokenizer)

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

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", responses=True)

    async def _generate(
        self, request: web.Request, kind: Kind | None, *, responses: bool = False
    ) -> web.StreamResponse:
        """A generation request: chat, completions, SageMaker style (``kind`` None: chat if the
        body has ``messages``) or, with ``responses``, a Responses request (its chat)."""
        rt = self.rt
        arrival_s = rt.driver.now_wall_s()
        await self._hang_if_asked()
        if rt.sleep_state.refuses_generation:
            return sleeping_response()
        action = rt.host.on_completion_request()
        if action.die:
            rt.metrics.faults.labels("die").inc()
            rt.host.die_now(request)
            raise web.HTTPServiceUnavailable()
        if action.error:
            rt.metrics.faults.labels("error").inc()
            return _error("injected fault: internal server error", 500)
        parsed = await self._job(request, kind, responses=responses)
        if isinstance(parsed, web.Response):
            return parsed
        job, call = parsed
        if action.spike_s > 0:
            rt.metrics.faults.labels("latency_spike").inc()
            await asyncio.sleep(action.spike_s)
        streams = rt.driver.submit_n(
            job.block_hashes,
            len(job.prompt_ids),
            [choice.output_tokens for choice in job.choices],
            wants_tokens=job.stream,
            arrival_s=arrival_s,
            prompt_ids=job.prompt_ids,
        )
        gen = Generation(job, streams, rt.driver, rt.metrics)
        try:
            if call is not None:
                return await serve_responses(request, gen, call)
            if job.stream:
                return await serve_stream(request, gen)
            return await serve_full(gen)
        finally:
            rt.driver.cancel(*streams)  # no-op once finished; cancels on client disconnect

    async def _job(
        self, request: web.Request, kind: Kind | None, *, responses: bool
    ) -> tuple[Job, ResponsesCall | None] | web.Response:
        """The request's job (and its Responses call), or the 400/404 answer."""
        try:
            body = await _read_json(request)
            call: ResponsesCall | None = None
            if responses:
                call = responses_call(body, self.rt.ctx)
                job = call.job
            else:
                if kind is None:
                    kind = "chat" if isinstance(body, dict) and "messages" in body else "completion"
                job = parse_job(body, kind, self.rt.ctx)
            self._check_fits(job)
        except BadRequestError as err:
            return _error(str(err), 400, err.param)
        except NotFoundError as err:
            return _error(str(err), 404, "model")
        return job, call

    def _check_fits(self, job: Job) -> None:
        """Each choice is an engine request of its own: the longest must fit the KV cache."""
        spec = self.rt.ctx.spec
        total = len(job.prompt_ids) + max(job.max_output_tokens, 1)
        if -(-total // spec.block_tokens) > spec.capacity_blocks:
            raise BadRequestError(
                f"the request needs {total} tokens of KV cache; this instance holds "
                f"{spec.capacity_blocks * spec.block_tokens}",
                param="messages" if job.kind == "chat" else "prompt",
            )

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

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/detokenize``: ``{"tokens"}`` -> ``{"prompt"}`` (``detokenize``)."""
        await self._hang_if_asked()
        try:
            answer = self.detokenizer.answer(await _read_json(request), self.rt.ctx.model)
        except BadRequestError as err:
            return _error(str(err), 400, err.param)
        except NotFoundError as err:
            return _error(str(err), 404, "model")
        return web.json_response(answer)

    async def embeddings(self, request: web.Request) -> web.Response:
        """``/v1/embeddings``: deterministic vectors of the inputs' token ids (``embeddings``)."""
        await self._hang_if_asked()
        if self.rt.sleep_state.refuses_generation:
            return sleeping_response()
        try:
            answer = embeddings_answer(await _read_json(request), self.rt.ctx)
        except BadRequestError as err:
            return _error(str(err), 400, err.param)
        except NotFoundError as err:
            return _error(str(err), 404, "model")
        return web.json_response(answer)

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
            "sampling_params": {"max_tokens": job.choices[0].output_tokens},
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
    sleep = SleepRoutes(rt)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    r = app.router
    r.add_post("/sleep", sleep.sleep)
    r.add_post("/wake_up", sleep.wake_up)
    r.add_get("/is_sleeping", sleep.is_sleeping)
    r.add_post("/v1/chat/completions", handlers.chat)
    r.add_post("/v1/completions", handlers.completions)
    r.add_post("/v1/responses", handlers.responses)
    r.add_post("/v1/embeddings", handlers.embeddings)
    r.add_post("/invocations", handlers.invocations)
    r.add_post("/tokenize", handlers.tokenize)
    r.add_post("/detokenize", handlers.detokenize)
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
