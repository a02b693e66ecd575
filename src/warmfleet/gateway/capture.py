"""Privacy-safe traffic capture (``spec.capture``, docs/gateway.md): one trace line
(docs/trace-format.md) per answered request, written off the request path.

The proxy calls ``Capture.offer`` once a request is answered: a sampling check and one
``Captured`` tuple appended to a bounded queue; a full queue drops the line and counts it
(``warmfleet_gateway_capture_dropped_total``), never waits. One writer task per capture lets
lines gather (``_GATHER_S``, or a batch), then takes everything queued and formats and writes
it on a worker thread (``asyncio.to_thread``), so neither formatting nor file I/O runs on the
event loop. ``CaptureSwitch`` owns the capture in
force: a reload that turns it on, off or changes it closes the old one (its queue is written
out) and starts the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable
from time import monotonic, perf_counter

from prometheus_client import CollectorRegistry

from warmfleet.gateway.capture_config import CaptureConfig
from warmfleet.gateway.capture_file import Captured, CaptureFile, WriteResult
from warmfleet.gateway.metrics import FastCounter, FastValue
from warmfleet.gateway.relay import Attempt, Relay
from warmfleet.gateway.variant import RouterFactory, RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.router import Router

log = logging.getLogger(__name__)

USAGE_BYTES = 1024  # of an answer, from its last "usage" on: what the writer parses
_HEADER_TTL_S = 1.0  # the header (fleet, block size) is recomputed at most this often
_STOP_TIMEOUT_S = 10.0
# Once woken, the writer lets lines gather this long (until ``_FULL_BATCH`` lines, or half the
# queue, are waiting, or the capture closes) before it hands them to its thread: each hand-off
# wakes a thread and the event loop and makes them trade the GIL, which cost more than
# formatting a line when the batches were a few lines each.
_GATHER_S = 0.05
_FULL_BATCH = 1024


class CaptureMetrics:
    """The capture's counters (one set per gateway, kept across reloads)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> FastValue:
            return FastCounter(f"warmfleet_gateway_capture_{name}", doc, (), registry).labels()

        self.lines = counter("lines", "Capture lines written")
        self.dropped = counter("dropped", "Capture lines lost (queue full or write failed)")
        self.bytes = counter("bytes", "Bytes written to capture files (headers included)")
        self.rotations = counter("rotations", "Capture files rotated")


class Capture:
    """One capture: its queue, its writer task's loop (``run``) and its file."""

    def __init__(
        self, config: CaptureConfig, metrics: CaptureMetrics, header: Callable[[], str]
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.file = CaptureFile(config)
        self.closed = False
        self._queue: deque[Captured] = deque()
        self._limit = config.queue_size
        self._batch = max(1, min(_FULL_BATCH, config.queue_size // 2))  # wakes a gathering writer
        self._fraction = config.sample_fraction
        self._credit = 0.0
        self._wake = asyncio.Event()
        self._idle = False
        self._header_fn = header
        self._header = ""
        self._header_at_s = -_HEADER_TTL_S

    def offer(self, call: Attempt, relay: Relay, status: int) -> None:
        """On the request path, once the request was answered: queue its line (or drop it).
        A call without a model is a utility route's (``/tokenize``, ``/version``): no line."""
        if self.closed or call.model is None:
            return
        if self._fraction < 1.0:  # every 1/fraction-th request, deterministically
            self._credit += self._fraction
            if self._credit < 1.0:
                return
            self._credit -= 1.0
        queue = self._queue
        if len(queue) >= self._limit:
            self.metrics.dropped.inc()
            return
        tail = relay.last
        at = tail.rfind(b'"usage"')
        if at < 0:  # a stream's usage event, then [DONE] in a read of its own
            tail = relay.tail
            at = tail.rfind(b'"usage"')
        variant = call.variant
        key_spec = variant.routing_config.key
        ticket = call.ticket  # flow control's, if the variant runs it
        queue.append(
            Captured(
                call.t_start,
                relay.t_first,
                perf_counter(),
                call.key,
                call.decision,
                call.inst.instance_id,
                variant.name,
                key_spec.salt,
                status,
                tail[at : at + USAGE_BYTES] if at >= 0 else None,
                call.request.headers.get(key_spec.tenant_header.lower()),
                call.model,
                *(
                    ()
                    if ticket is None
                    else (ticket.priority, ticket.deadline_ms, ticket.predicted_s)
                ),
            )
        )
        if self._idle:
            self._idle = False
            self._wake.set()
        elif len(queue) == self._batch:
            self._wake.set()

    def close(self) -> None:
        """Take no more lines; ``run`` writes what is queued and ends."""
        self.closed = True
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                queue = self._queue
                if not queue:
                    if self.closed:
                        return
                    self._idle = True
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if len(queue) < self._batch and not self.closed:
                    await self._gather()
                batch = list(queue)
                queue.clear()
                self._count(await asyncio.to_thread(self.file.write, batch, self._fresh_header()))
        finally:
            await asyncio.to_thread(self.file.close)  # waits for a write still running

    async def _gather(self) -> None:
        """Wait ``_GATHER_S`` for more lines (less once a batch is queued or the capture is
        closed)."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), _GATHER_S)

    def _fresh_header(self) -> str:
        now = monotonic()
        if now - self._header_at_s >= _HEADER_TTL_S:
            self._header = self._header_fn()
            self._header_at_s = now
        return self._header

    def _count(self, result: WriteResult) -> None:
        m = self.metrics
        m.lines.inc(result.lines)
        m.bytes.inc(result.bytes)
        m.rotations.inc(result.rotations)
        if result.failed:
            m.dropped.inc(result.failed)


class CaptureSwitch:
    """The capture in force (``current``; ``None``: off), switched by each applied config."""

    def __init__(self, metrics: CaptureMetrics, header: Callable[[], str]) -> None:
        self.metrics = metrics
        self.header = header
        self.current: Capture | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_switch: Callable[[Capture | None], None] = lambda _capture: None

    def apply(self, config: CaptureConfig | None) -> None:
        """Start, stop or replace the capture (on the event loop); same config: nothing."""
        old = self.current
        if (old.config if old is not None else None) == config:
            return
        if old is not None:
            old.close()
            log.info("capture to %s stopped", old.config.path)
        new = Capture(config, self.metrics, self.header) if config is not None else None
        if new is not None:
            task = asyncio.create_task(new.run(), name="warmfleet-gateway-capture")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            log.info("capturing traffic to %s", new.config.path)
        self.current = new
        self.on_switch(new)

    async def stop(self) -> None:
        """Close the capture and wait for its queue to be written (bounded)."""
        if self.current is not None:
            self.current.close()
            self.current = None
            self.on_switch(None)
        tasks = list(self._tasks)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def hash_blocks_for_capture(router: RouterLike, capturing: bool) -> None:
    """While capturing, a router's keys carry their block hashes even when its strategy reads
    none (``random``, ``round_robin``, the load-only ones): the capture writes them."""
    if isinstance(router, Router):
        router.keys.hash_blocks = capturing or router.strategy.reads_block_hashes


def capture_aware(factory: RouterFactory, capturing: Callable[[], bool]) -> RouterFactory:
    """``factory`` whose routers hash blocks while ``capturing()``."""

    def build(routing: RoutingConfig, rng: random.Random) -> RouterLike:
        router = factory(routing, rng)
        hash_blocks_for_capture(router, capturing())
        return router

    return build


def rekey_for_capture(routers: Iterable[RouterLike], capturing: bool) -> None:
    for router in routers:
        hash_blocks_for_capture(router, capturing)
