"""Serve one generation request from its engine requests: one per choice, as vLLM V1 does.

vLLM V1 fans a request with ``n`` > 1 out into ``n`` child requests with the same prompt, added
to the engine one after the other (``v1/engine/async_llm.py``, ``ParentRequest`` in
``v1/engine/parallel_sampling.py``). They are scheduled like any other requests, so with prefix
caching the children after the first reuse the prompt blocks the first one's scheduled chunk
registered (``EngineDriver.submit_n`` does the same with the engine model). Each child counts as
one request in every engine and frontend metric (prefix-cache queries and hits, running and
waiting requests, prompt and generation tokens, time to first token, end-to-end latency,
``request_success``, the per-request ``vllm:request_prompt_tokens``,
``vllm:request_generation_tokens`` and ``vllm:request_params_max_tokens`` histograms); only
``vllm:request_params_n`` and ``vllm:request_max_num_generation_tokens`` (the most tokens any
child generated; for n = 1 the request's own) are observed once per parent, when its last child
finishes (``ParentRequest.observe_finished_request``).

The OpenAI server (``entrypoints/openai/{chat_completion,completion}/serving.py``) reports the
prompt once and sums the completion tokens over the choices. ``cached_tokens`` is the
``num_cached_tokens`` of the ``RequestOutput`` it reads: non-streamed, the aggregated output,
which the child that finishes last builds; streamed, the first output, from the child whose
first token comes first (``RequestOutput.add`` keeps the first one's count when outputs merge).
Streamed chat sends the role chunk of every choice, in index order, at that first output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType

from aiohttp import web

from warmfleet.emulator.driver import EngineDriver, RequestStream
from warmfleet.emulator.metrics import InstanceMetrics
from warmfleet.emulator.protocol import DONE, Job, error_body
from warmfleet.emulator.responses import full_response, writers
from warmfleet.engine.events import EngineEvent, EngineEventKind

SSE_HEADERS = MappingProxyType({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
_REJECTED = "the request cannot fit this engine"


@dataclass(slots=True)
class _Update:
    """What one batch of engine events changed."""

    rejected: bool = False
    first_token: bool = False  # some choice got its first token
    touched: list[int] = field(default_factory=list)  # choices with new tokens, in event order


class Generation:
    """One client request in flight: its job, its engine requests (one per choice, in index
    order, sharing one event queue) and the instance's metrics."""

    def __init__(
        self,
        job: Job,
        streams: list[RequestStream],
        driver: EngineDriver,
        metrics: InstanceMetrics,
    ) -> None:
        self.job = job
        self.streams = streams
        self._driver = driver
        self._metrics = metrics
        self._by_id = {stream.request_id: stream for stream in streams}
        self.produced = [0] * len(streams)  # output tokens per choice so far
        self._cached = [0] * len(streams)
        self.first_cached: int | None = None  # of the first choice to get its first token
        self.last_cached = 0  # of the last choice to finish
        self.unfinished = len(streams)

    @property
    def done(self) -> bool:
        return self.unfinished == 0

    async def next_update(self) -> _Update:
        """Wait for engine events and apply them (metrics included)."""
        update = _Update()
        for event in await self.streams[0].queue.next_batch():
            self._apply(event, update)
        return update

    def _apply(self, event: EngineEvent, update: _Update) -> None:
        stream = self._by_id[event.request_id]
        index = stream.index
        kind = event.kind
        if kind is EngineEventKind.REJECTED:
            update.rejected = True
            return
        produced = min(event.output_tokens, stream.output_tokens)
        if produced > self.produced[index]:
            self._metrics.generation_tokens.inc(produced - self.produced[index])
            self.produced[index] = produced
            if index not in update.touched:
                update.touched.append(index)
        if kind is EngineEventKind.FIRST_TOKEN:
            self._first_token(stream, event)
            update.first_token = True
        elif kind is EngineEventKind.FINISHED:
            self._finished(stream, event)

    def _first_token(self, stream: RequestStream, event: EngineEvent) -> None:
        self._cached[stream.index] = event.cached_tokens
        if self.first_cached is None:
            self.first_cached = event.cached_tokens
        metrics = self._metrics
        metrics.prompt_tokens.inc(stream.prompt_tokens)
        metrics.ttft_s.observe(max(0.0, self._driver.wall_s(event.time_s) - stream.arrival_s))

    def _finished(self, stream: RequestStream, event: EngineEvent) -> None:
        self.last_cached = self._cached[stream.index]
        self.unfinished -= 1
        metrics = self._metrics
        metrics.e2e_s.observe(max(0.0, self._driver.wall_s(event.time_s) - stream.arrival_s))
        metrics.request_finished(self.job.choices[stream.index].finish_reason)
        metrics.request_prompt_tokens.observe(stream.prompt_tokens)
        metrics.request_generation_tokens.observe(self.produced[stream.index])
        if self.job.max_tokens:
            metrics.params_max_tokens.observe(self.job.max_tokens)
        if self.unfinished == 0:
            metrics.params_n.observe(len(self.streams))
            metrics.max_num_generation_tokens.observe(max(self.produced))


async def serve_full(gen: Generation) -> web.Response:
    """Wait for every choice, then answer with all of them."""
    while not gen.done:
        if (await gen.next_update()).rejected:
            return web.json_response(error_body(_REJECTED, 400), status=400)
    return web.json_response(full_response(gen.job, gen.last_cached))


async def serve_stream(request: web.Request, gen: Generation) -> web.StreamResponse:
    """SSE: each choice's chunks as its tokens come, then the usage chunk and ``[DONE]``."""
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    job = gen.job
    chunkers = writers(job)
    sent = [0] * len(chunkers)
    started = False
    while True:
        update = await gen.next_update()
        if update.rejected:
            err = json.dumps(error_body(_REJECTED, 400)).encode()
            await resp.write_eof(b"data: " + err + b"\n\n" + DONE)
            return resp
        out: list[bytes] = []
        if update.first_token and not started:
            started = True
            if job.kind == "chat":
                out.extend(chunker.role() for chunker in chunkers)
        for index in update.touched:
            out.append(chunkers[index].tokens(sent[index], gen.produced[index]))
            sent[index] = gen.produced[index]
        if gen.done:
            if job.include_usage:
                completion = sum(choice.output_tokens for choice in job.choices)
                out.append(chunkers[0].usage(completion, gen.first_cached or 0))
            out.append(DONE)
            await resp.write_eof(b"".join(out))  # last chunks + chunked end: one write
            return resp
        if out:
            await resp.write(b"".join(out))
