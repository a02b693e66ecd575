"""A tiny vLLM-like backend for load-generator tests (127.0.0.1, port 0), and the small gsp
workload those tests send it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from warmfleet.sim.workloads.base import WorkloadRequest
from warmfleet.sim.workloads.synthetic import GspConfig, gsp


@dataclass
class FakeEngine:
    """Answers chat/completions (streamed or not) with ``tokens`` words.

    Prefix-cache accounting: a prompt's "tokens" are its words; the hit count is the longest
    prefix (in words) shared with any earlier prompt. Every ``fail_every``-th request gets a 500.
    ``instance_header`` adds ``x-warmfleet-instance`` like our gateway.
    """

    name: str
    tokens: int = 4
    fail_every: int = 0
    instance_header: bool = False
    stream_error_every: int = 0
    port: int = 0
    requests: int = 0
    hits: int = 0
    queries: int = 0
    seen_prompts: list[list[str]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)  # `warmfleet bench` picks the model here
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _account(self, words: list[str]) -> int:
        best = 0
        for earlier in self.seen_prompts:
            shared = 0
            for a, b in zip(earlier, words, strict=False):
                if a != b:
                    break
                shared += 1
            best = max(best, shared)
        self.seen_prompts.append(words)
        self.hits += best
        self.queries += len(words)
        return best

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.requests += 1
        if self.fail_every and self.requests % self.fail_every == 0:
            return web.json_response({"error": {"message": "injected"}}, status=500)
        text = body["messages"][0]["content"] if "messages" in body else body["prompt"]
        words = text.split()
        cached = self._account(words)
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": min(self.tokens, body["max_tokens"]),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        headers = {"x-warmfleet-instance": self.name} if self.instance_header else {}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "ok " * 3}}
            return web.json_response({"choices": [choice], "usage": usage}, headers=headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        broken = self.stream_error_every and self.requests % self.stream_error_every == 0
        role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        await resp.write(b"data: " + json.dumps(role).encode() + b"\n\n")
        for i in range(usage["completion_tokens"]):
            if broken and i == 1:
                err = {"error": {"message": "engine died"}}
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                return resp
            chunk = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0)
        final = {"choices": [], "usage": usage}
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "model", "object": "model"}]})

    async def _metrics(self, _request: web.Request) -> web.Response:
        text = (
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.\n"
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {float(self.queries)}\n'
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {float(self.hits)}\n'
            f'vllm:request_success_total{{finished_reason="length"}} {float(self.requests)}\n'
            'vllm:request_success_total{finished_reason="stop"} 0.0\n'
            "vllm:num_requests_running 0.0\n"
        )
        return web.Response(text=text, content_type="text/plain")


def small_gsp(count: int = 24, output_tokens: int = 4) -> tuple[WorkloadRequest, ...]:
    config = GspConfig(
        groups=3, prompts_per_group=8, system_prompt_tokens=40, question_tokens=8,
        output_tokens=output_tokens,
    )  # fmt: skip
    return gsp(config, seed=1)[:count]
