"""Live load generator: drives a workload against OpenAI-compatible URLs and records each request.

The workload is the simulator's (``WorkloadRequest`` segments rendered to text by
``render_prompt_text``), so the same scenario drives both. Closed loop: ``concurrency`` workers
each send their next request when the previous one finished. Open loop: each request is sent at
its ``arrival_s`` (Poisson, gamma or trace timestamps from the scenario). Turns of one session are
never sent before the previous turn finished. Every run is bounded in count and wall time.

One keep-alive ``aiohttp`` session carries all requests (aiohttp sets TCP_NODELAY on every
connection); request bodies are encoded before the clock starts so the client spends its CPU on
sending and timing only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from warmfleet.bench.loadgen_errors import envelope_message, exception_detail, http_error_detail
from warmfleet.sim.workloads.base import WorkloadRequest, render_segment_text

INSTANCE_HEADER = "x-warmfleet-instance"
REASON_HEADER = "x-warmfleet-reason"
ApiKind = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """How to send a workload. ``urls`` are base URLs; several = client-side round robin."""

    urls: tuple[str, ...]
    url_names: tuple[str, ...] = ()  # instance name of each URL in direct mode (default: URL)
    model: str = "model"
    api: ApiKind = "chat"
    stream: bool = False
    concurrency: int | None = None  # closed loop with N workers; None = open loop (arrival_s)
    max_duration_s: float = 300.0
    request_timeout_s: float = 120.0
    max_output_tokens: int | None = None  # caps each request's max_tokens
    ignore_eos: bool = False  # vLLM extension: always generate max_tokens
    headers: Mapping[str, str] = field(default_factory=dict)
    max_in_flight: int = 4096  # open-loop safety bound

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("LoadSpec.urls: give at least one URL")
        if self.url_names and len(self.url_names) != len(self.urls):
            raise ValueError("LoadSpec.url_names: one name per URL")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("LoadSpec.concurrency must be >= 1")


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times are seconds; ``start_s`` is since the run began."""

    request_id: int
    start_s: float
    e2e_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    status: int = 0
    error: str | None = None  # the error class: http_NNN, timeout, connection, ...
    detail: str | None = None  # one line saying why (the server's message, the exception)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    instance: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(slots=True)
class LoadResult:
    results: list[RequestResult]
    submitted: int  # requests the workload offered
    not_sent: int  # cut by the time bound
    wall_s: float
    client_balanced: bool = False  # several URLs: the client itself picked each instance


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    request: WorkloadRequest
    path: str
    body: bytes
    after: int | None  # index of the session's previous turn (sent only after it finished)


def _payload(req: WorkloadRequest, text: str, spec: LoadSpec) -> dict[str, Any]:
    max_tokens = req.output_tokens
    if spec.max_output_tokens is not None:
        max_tokens = min(max_tokens, spec.max_output_tokens)
    body: dict[str, Any] = {"model": spec.model, "max_tokens": max_tokens, "temperature": 0.0}
    if spec.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def prepare_requests(requests: Sequence[WorkloadRequest], spec: LoadSpec) -> list[PreparedRequest]:
    """Render and encode every body up front (segment texts memoised during rendering only)."""
    texts: dict[tuple[int, int], str] = {}
    last_turn: dict[int, int] = {}
    path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
    out = []
    for index, req in enumerate(requests):
        parts = []
        for seg in req.segments:
            key = (seg.content_id, seg.tokens)
            text = texts.get(key)
            if text is None:
                text = texts[key] = render_segment_text(seg)
            parts.append(text)
        body = json.dumps(_payload(req, " ".join(parts), spec)).encode()
        after = None
        if req.session_id is not None:
            after = last_turn.get(req.session_id)
            last_turn[req.session_id] = index
        out.append(PreparedRequest(req, path, body, after))
    return out


def _loads(raw: bytes) -> Any:
    """orjson (the client's CPU is part of every measurement); the standard library for what
    only orjson refuses (integers beyond 64 bits, NaN). ``ValueError`` if not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _usage(result: RequestResult, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("completion_tokens"), int):
        result.output_tokens = usage["completion_tokens"]
    if isinstance(usage.get("prompt_tokens"), int):
        result.prompt_tokens = usage["prompt_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        result.cached_tokens = details["cached_tokens"]


# Fields of a chat delta that carry generated tokens: the answer, a reasoning model's thinking
# (vLLM's reasoning parsers: ``reasoning_content``, newer ``reasoning``) and tool calls. The
# first chunk (``role`` only) and the usage-only chunk carry none.
_DELTA_TOKENS = ("content", "reasoning_content", "reasoning", "tool_calls")


def _has_content(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(delta.get(field) for field in _DELTA_TOKENS):
            return True
        if choice.get("text"):
            return True
    return False


async def _read_stream(resp: aiohttp.ClientResponse, result: RequestResult, sent: float) -> None:
    """Parse SSE: TTFT at the first chunk with content, ITL between content chunks."""
    last = sent
    chunks = 0
    usage_seen = False
    done = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        now = time.perf_counter()
        try:
            event = _loads(data)
        except ValueError:
            result.error, result.detail = "bad_stream_event", "an SSE event that is not JSON"
            return
        if not isinstance(event, dict):
            continue
        if event.get("error") is not None:
            result.error = "stream_error"
            result.detail = envelope_message(event) or "an error event in the stream"
            return
        if event.get("usage"):
            _usage(result, event["usage"])
            usage_seen = True
        if _has_content(event):
            if result.ttft_s is None:
                result.ttft_s = now - sent
            else:
                result.itl_s.append(now - last)
            last = now
            chunks += 1
    if not usage_seen:
        result.output_tokens = chunks
    if not done:
        result.error, result.detail = "stream_broken", "the stream ended without data: [DONE]"


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    prepared: PreparedRequest,
    spec: LoadSpec,
    result: RequestResult,
) -> None:
    """Send one request and fill ``result`` (errors are recorded, never raised)."""
    headers = {"Content-Type": "application/json", **spec.headers}
    if prepared.request.tenant is not None:
        headers["x-prefix-aware-id"] = prepared.request.tenant
    sent = time.perf_counter()
    try:
        async with session.post(url + prepared.path, data=prepared.body, headers=headers) as resp:
            result.status = resp.status
            result.instance = resp.headers.get(INSTANCE_HEADER, result.instance)
            result.reason = resp.headers.get(REASON_HEADER)
            if resp.status != 200:
                result.error = f"http_{resp.status}"
                result.detail = http_error_detail(resp.status, await resp.read())
            elif spec.stream:
                await _read_stream(resp, result, sent)
            else:
                payload = _loads(await resp.read())
                if not isinstance(payload, dict) or payload.get("error") is not None:
                    result.error = "bad_response"
                    result.detail = envelope_message(payload) or "a 200 answer with no completion"
                elif not payload.get("choices"):
                    result.error, result.detail = "no_tokens", "a 200 answer with no choices"
                else:
                    result.ttft_s = time.perf_counter() - sent  # not streamed: first = last
                    _usage(result, payload.get("usage"))
    except TimeoutError:
        result.error = "timeout"
        result.detail = f"no complete answer within --timeout-s {spec.request_timeout_s:g}"
    except aiohttp.ClientPayloadError as err:
        result.error, result.detail = "stream_broken", exception_detail(err)
    except (aiohttp.ClientError, OSError) as err:
        result.error, result.detail = "connection", exception_detail(err)
    except ValueError as err:  # undecodable JSON body, over-long SSE line
        result.error, result.detail = "bad_response", exception_detail(err)
    result.e2e_s = time.perf_counter() - sent
    if result.error is None and result.ttft_s is None:
        result.error, result.detail = "no_tokens", "the answer carried no generated token"


@dataclass
class _Run:
    spec: LoadSpec
    prepared: list[PreparedRequest]
    session: aiohttp.ClientSession
    on_done: Callable[[RequestResult], None]
    started: float = 0.0
    deadline: float = 0.0
    results: list[RequestResult | None] = field(default_factory=list)
    done_events: dict[int, asyncio.Event] = field(default_factory=dict)
    sent_count: int = 0

    def url_for(self, index: int) -> tuple[str, str | None]:
        urls = self.spec.urls
        if len(urls) == 1:
            return urls[0], None
        slot = index % len(urls)
        names = self.spec.url_names or urls
        return urls[slot], names[slot]  # direct mode: the client picked the instance

    async def execute(self, index: int) -> None:
        prepared = self.prepared[index]
        if prepared.after is not None:
            event = self.done_events.get(prepared.after)
            if event is not None:
                left_s = self.deadline - time.perf_counter()
                try:
                    await asyncio.wait_for(event.wait(), max(left_s, 0.0))
                except TimeoutError:
                    return
        if time.perf_counter() >= self.deadline:
            return
        url, instance = self.url_for(self.sent_count)
        self.sent_count += 1
        result = RequestResult(prepared.request.request_id, time.perf_counter() - self.started)
        result.instance = instance
        await send_one(self.session, url, prepared, self.spec, result)
        self.results[index] = result
        self.on_done(result)
        if index in self.done_events:
            self.done_events[index].set()


async def _closed_loop(run: _Run, concurrency: int) -> None:
    queue = iter(range(len(run.prepared)))

    async def worker() -> None:
        for index in queue:
            if time.perf_counter() >= run.deadline:
                return
            await run.execute(index)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, len(run.prepared))):
            group.create_task(worker())


async def _open_loop(run: _Run) -> None:
    limit = asyncio.Semaphore(run.spec.max_in_flight)

    async def one(index: int) -> None:
        try:
            await run.execute(index)
        finally:
            limit.release()

    async with asyncio.TaskGroup() as group:
        for index, prepared in enumerate(run.prepared):
            at = run.started + prepared.request.arrival_s
            delay_s = at - time.perf_counter()
            if at >= run.deadline:
                break
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            await limit.acquire()
            group.create_task(one(index))


def make_session(spec: LoadSpec) -> aiohttp.ClientSession:
    """A keep-alive session sized for the run; every call is bounded by ``request_timeout_s``."""
    limit = spec.concurrency or spec.max_in_flight
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60.0)
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s, sock_connect=10.0)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=["User-Agent"],
    )


async def run_load(
    requests: Sequence[WorkloadRequest],
    spec: LoadSpec,
    on_done: Callable[[RequestResult], None] | None = None,
) -> LoadResult:
    """Send ``requests`` per ``spec``; stop launching at ``max_duration_s`` (in-flight requests
    end by their own timeout)."""
    prepared = prepare_requests(requests, spec)
    async with make_session(spec) as session:
        run = _Run(spec, prepared, session, on_done or (lambda _r: None))
        run.results = [None] * len(prepared)
        run.done_events = {p.after: asyncio.Event() for p in prepared if p.after is not None}
        run.started = time.perf_counter()
        run.deadline = run.started + spec.max_duration_s
        if spec.concurrency is not None:
            await _closed_loop(run, spec.concurrency)
        else:
            await _open_loop(run)
        wall_s = time.perf_counter() - run.started
    results = [r for r in run.results if r is not None]
    not_sent = len(prepared) - len(results)
    return LoadResult(results, len(prepared), not_sent, wall_s, len(spec.urls) > 1)
