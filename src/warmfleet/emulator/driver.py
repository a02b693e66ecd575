"""Drive one ``EngineModel`` in wall-clock time (the only place the emulator touches engine state).

Engine time is ``(time.monotonic() - start) * speedup``: not ``loop.time()``, which uvloop
truncates to whole milliseconds (at a speed-up of 10,000 that is 10 engine seconds, and a
driver waiting for an event a few microseconds ahead would spin until the millisecond ticks).
One task per instance sleeps until the model's next event (or a submit/cancel wakes it),
advances the model to "now" and hands each event to the request's stream. Before any
``submit``/``cancel`` the model is advanced to "now" first, so a request is never admitted
before it arrived.

Streaming: during a fast-forwarded run of decode steps the model's next event is the end of the
run, so while a streaming request is decoding the task also wakes at the next expected token
(last token time plus the last observed inter-token gap); tokens then reach the client when
their step ends, not in a burst at the end of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest, EngineStats
from warmfleet.engine.model import EngineModel
from warmfleet.engine.spec import EngineSpec

_LATE_POLL_FRACTION = 0.05  # a missed token boundary is polled again after 5 % of a step
_TOKEN_SLACK = 1.001  # the next step is a hair longer (its KV read grows)
_MIN_TOKEN_WAKE_WALL_S = 0.0005  # tokens closer than this (wall) share one wake-up and write


class EventQueue:
    """The engine events of one client request (its ``n`` engine requests), in dispatch order.

    A TOKEN event carries its request's running count, so a request's pending TOKEN event is
    replaced by its next one: the queue holds at most one TOKEN event per request."""

    __slots__ = ("_pending", "_tokens", "_waiter")

    def __init__(self) -> None:
        self._pending: list[EngineEvent] = []
        self._tokens: dict[int, int] = {}  # request id -> index of its pending TOKEN event
        self._waiter: asyncio.Future[None] | None = None

    def push(self, event: EngineEvent) -> None:
        pending = self._pending
        if event.kind is EngineEventKind.TOKEN:
            at = self._tokens.get(event.request_id)
            if at is not None:
                pending[at] = event  # keep the latest count
                return
            self._tokens[event.request_id] = len(pending)
        else:
            self._tokens.pop(event.request_id, None)
        pending.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self) -> list[EngineEvent]:
        """Every event not yet taken, waiting for at least one (one write per batch)."""
        while not self._pending:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch, self._pending = self._pending, []
        self._tokens.clear()
        return batch


@dataclass(eq=False)
class RequestStream:
    """One engine request; ``arrival_s`` is wall-clock (``now_wall_s``) time. Its events go to
    ``queue``, which the ``n`` engine requests of one client request share (``submit_n``)."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    wants_tokens: bool
    arrival_s: float
    queue: EventQueue = field(default_factory=EventQueue)
    index: int = 0  # choice index within its client request
    done: bool = False
    decoding: bool = False
    last_token_s: float = -1.0

    def push(self, event: EngineEvent) -> None:
        self.queue.push(event)

    async def next_batch(self) -> list[EngineEvent]:
        """Every event of the shared queue not yet taken (see ``EventQueue.next_batch``)."""
        return await self.queue.next_batch()


class BlockEventSink(Protocol):
    """The engine's block hook plus the request context a KV-event publisher needs."""

    def request_submitted(
        self, request_id: int, block_hashes: tuple[int, ...], token_ids: Sequence[int]
    ) -> None: ...

    def request_done(self, request_id: int) -> None: ...

    def block_stored(self, block_hash: int) -> None: ...

    def blocks_removed(self, block_hashes: Sequence[int]) -> None: ...

    def flush(self) -> None: ...


class EngineDriver:
    """Owns an ``EngineModel`` and the task that advances it; start with ``run()`` in a task."""

    def __init__(
        self,
        spec: EngineSpec,
        *,
        speedup: float = 1.0,
        block_sink: BlockEventSink | None = None,
    ) -> None:
        self.spec = spec
        self.speedup = speedup
        self._sink = block_sink
        # Two token events per run of decode steps keep ``_dispatch``'s view exact: a stream's
        # latest count and the gap between its last two tokens (all ``RequestStream`` keeps).
        # Blocks are cached when their chunk is scheduled, as vLLM V1 does.
        self._model = EngineModel(
            spec,
            emit_token_events=True,
            block_listener=block_sink,
            token_event_steps=2,
        )
        self._loop = asyncio.get_running_loop()
        self._clock = time.monotonic
        self._start_s = self._clock()
        self._wake = asyncio.Event()
        self._streams: dict[int, RequestStream] = {}
        self._ids = itertools.count(1)
        self._streaming_decoders = 0
        self._token_gap_s = spec.step_overhead_s  # engine seconds between a request's tokens
        self._last_token_s = 0.0

    # ------------------------------------------------------------------ time

    def now_wall_s(self) -> float:
        """The driver's wall clock (``time.monotonic``): stamp arrivals with it."""
        return self._clock()

    def engine_now_s(self) -> float:
        return (self._clock() - self._start_s) * self.speedup

    def wall_s(self, engine_s: float) -> float:
        """Wall-clock (``now_wall_s``) time at which engine time ``engine_s`` happens."""
        return self._start_s + engine_s / self.speedup

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        block_hashes: tuple[int, ...],
        prompt_tokens: int,
        output_tokens: int,
        *,
        wants_tokens: bool,
        arrival_s: float | None = None,
        prompt_ids: Sequence[int] = (),
    ) -> RequestStream:
        """Queue a request now; ``prompt_ids`` only feed KV events (``token_ids``)."""
        return self.submit_n(
            block_hashes,
            prompt_tokens,
            (output_tokens,),
            wants_tokens=wants_tokens,
            arrival_s=arrival_s,
            prompt_ids=prompt_ids,
        )[0]

    def submit_n(
        self,
        block_hashes: tuple[int, ...],
        prompt_tokens: int,
        output_tokens: Sequence[int],
        *,
        wants_tokens: bool,
        arrival_s: float | None = None,
        prompt_ids: Sequence[int] = (),
    ) -> list[RequestStream]:
        """Queue one engine request per entry of ``output_tokens``, all with this prompt, in
        order and as one arrival (``EngineModel.submit_many``: vLLM fans ``n`` > 1 out into
        child requests this way); their events share one ``EventQueue``."""
        now_s = self._catch_up()
        arrival = self._clock() if arrival_s is None else arrival_s
        queue = EventQueue()
        sink = self._sink
        streams: list[RequestStream] = []
        requests: list[EngineRequest] = []
        for index, tokens in enumerate(output_tokens):
            rid = next(self._ids)
            stream = RequestStream(rid, prompt_tokens, tokens, wants_tokens, arrival, queue, index)
            self._streams[rid] = stream
            streams.append(stream)
            if sink is not None:
                sink.request_submitted(rid, block_hashes, prompt_ids)
            requests.append(
                EngineRequest(rid, block_hashes, prompt_tokens, tokens, token_events=wants_tokens)
            )
        self._model.submit_many(requests, now_s)
        if sink is not None:
            sink.flush()
        self._wake.set()
        return streams

    def cancel(self, *streams: RequestStream) -> None:
        """Forget ``streams`` (their client went away); finished ones are left alone."""
        if all(stream.done for stream in streams):
            return
        now_s = self._catch_up()
        for stream in streams:
            if not stream.done:
                self._model.cancel(stream.request_id, now_s)
                self._close(stream)
        self._wake.set()

    def stats(self) -> EngineStats:
        return self._model.stats()

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        return self._model.cached_prefix_blocks(block_hashes)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def reset_prefix_cache(self) -> bool:
        """Discard the KV cache (``/sleep``); False while requests are in flight."""
        if self._streams or not self._model.reset_prefix_cache():
            return False
        if self._sink is not None:
            self._sink.flush()  # the removals reach KV-event subscribers now
        return True

    # ------------------------------------------------------------------ the task

    async def run(self) -> None:
        """Advance the model forever (cancel the task to stop)."""
        loop = self._loop
        while True:
            self._wake.clear()
            now_s = self._catch_up()
            wake_at_s = self._next_wake_s(now_s)
            if wake_at_s is None:
                await self._wake.wait()
                continue
            delay_s = (wake_at_s - now_s) / self.speedup
            if delay_s <= 0:
                await asyncio.sleep(0)
                continue
            timer = loop.call_later(delay_s, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _catch_up(self) -> float:
        now_s = self.engine_now_s()
        events = self._model.advance(now_s)
        if events:
            self._dispatch(events)
        if self._sink is not None:
            self._sink.flush()
        return now_s

    def _next_wake_s(self, now_s: float) -> float | None:
        next_s = self._model.next_event_s()
        if self._streaming_decoders <= 0:
            return next_s
        token_s = self._last_token_s + self._token_gap_s * _TOKEN_SLACK
        if token_s <= now_s:
            token_s = now_s + self._token_gap_s * _LATE_POLL_FRACTION
        token_s = max(token_s, now_s + _MIN_TOKEN_WAKE_WALL_S * self.speedup)
        return token_s if next_s is None else min(next_s, token_s)

    def _dispatch(self, events: list[EngineEvent]) -> None:
        streams = self._streams
        for event in events:
            stream = streams.get(event.request_id)
            if stream is None:
                continue
            kind = event.kind
            if kind is EngineEventKind.TOKEN:
                if not stream.wants_tokens:
                    continue  # only streams need per-token events
                if stream.last_token_s >= 0 and event.time_s > stream.last_token_s:
                    self._token_gap_s = event.time_s - stream.last_token_s
                stream.last_token_s = event.time_s
                self._last_token_s = max(self._last_token_s, event.time_s)
            elif kind is EngineEventKind.FIRST_TOKEN:
                stream.last_token_s = event.time_s
                self._last_token_s = max(self._last_token_s, event.time_s)
                if stream.wants_tokens and not stream.decoding:
                    stream.decoding = True
                    self._streaming_decoders += 1
            stream.push(event)
            if kind in (EngineEventKind.FINISHED, EngineEventKind.REJECTED):
                self._close(stream)

    def _close(self, stream: RequestStream) -> None:
        stream.done = True
        if stream.decoding:
            stream.decoding = False
            self._streaming_decoders -= 1
        self._streams.pop(stream.request_id, None)
        if self._sink is not None:
            self._sink.request_done(stream.request_id)


@contextlib.asynccontextmanager
async def running_driver(
    spec: EngineSpec,
    *,
    speedup: float = 1.0,
    block_sink: BlockEventSink | None = None,
) -> AsyncIterator[EngineDriver]:
    """A driver whose task runs for the duration of the ``async with`` block."""
    driver = EngineDriver(spec, speedup=speedup, block_sink=block_sink)
    task = asyncio.create_task(driver.run(), name="emulator-engine")
    try:
        yield driver
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
