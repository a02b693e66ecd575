"""One emulated engine instance: its listener, engine driver, metrics and faults.

``start()`` binds (the first bound port is kept, so ``restart()`` comes back on the same URL
with a fresh, empty engine, as a restarted vLLM would); ``kill()`` dies abruptly: the listener
closes, every open connection is reset (in-flight streams are cut), the engine is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass
from typing import Any

import zmq
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from warmfleet.emulator.app import FaultDecision, Runtime, create_app, created_now_s
from warmfleet.emulator.config import EmulatorSpec, FaultSpec
from warmfleet.emulator.driver import EngineDriver
from warmfleet.emulator.kv_events import KvEventPublisher
from warmfleet.emulator.metrics import InstanceMetrics
from warmfleet.emulator.protocol import ParseContext
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.engine.events import EngineStats
from warmfleet.engine.spec import EngineSpec

log = logging.getLogger(__name__)
_SHUTDOWN_TIMEOUT_S = 1.0


class _HttpLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log, with malformed-HTTP/1 probes at debug level, not as tracebacks.

    sglang-router probes every worker for gRPC with an HTTP/2 preface; aiohttp answers 400 and
    would log an ERROR traceback for each probe.
    """

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), BadHttpMessage):
            self.debug(msg, *args, **kwargs)
            return
        super().exception(msg, *args, **kwargs)


@dataclass
class _Live:
    runner: web.AppRunner
    runtime: Runtime
    driver_task: asyncio.Task[None]
    publisher: KvEventPublisher | None
    replay_task: asyncio.Task[None] | None = None


class EmulatedInstance:
    """An emulated vLLM server on ``host:port``; see the module docstring for the lifecycle."""

    def __init__(
        self,
        index: int,
        config: EmulatorSpec,
        *,
        engine_spec: EngineSpec | None = None,
        tokenizer: EmulatorTokenizer | None = None,
        zmq_context: zmq.Context[Any] | None = None,
    ) -> None:
        self.index = index
        self.name = f"emu-{index}"
        self.config = config
        self.engine_spec = engine_spec if engine_spec is not None else config.engine_spec()
        self.host = config.host
        self.port = config.port_for(index)
        self.faults = config.faults_for(index)
        self.completion_requests = 0  # since start or the last set_faults
        self._rng = random.Random(config.seed * 1_000_003 + index)
        self._tokenizer = tokenizer if tokenizer is not None else EmulatorTokenizer()
        self._zmq_context = zmq_context
        self._own_zmq_context: zmq.Context[Any] | None = None
        self._live: _Live | None = None
        self._kill_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ state

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._live is not None

    @property
    def hanging(self) -> bool:
        return self.faults.hang

    @property
    def driver(self) -> EngineDriver | None:
        return None if self._live is None else self._live.runtime.driver

    @property
    def metrics(self) -> InstanceMetrics | None:
        return None if self._live is None else self._live.runtime.metrics

    def stats(self) -> EngineStats | None:
        """The engine's counters and gauges (None while the instance is down)."""
        driver = self.driver
        return None if driver is None else driver.stats()

    def set_faults(self, faults: FaultSpec) -> None:
        """Change this instance's faults now; ``die_after_requests`` counts from here."""
        self.faults = faults
        self.completion_requests = 0

    # ------------------------------------------------------------------ faults (handlers)

    def on_completion_request(self) -> FaultDecision:
        faults = self.faults
        self.completion_requests += 1
        die_after = faults.die_after_requests
        if die_after is not None and self.completion_requests > die_after:
            return FaultDecision(die=True)
        rng = self._rng
        if faults.error_rate > 0 and rng.random() < faults.error_rate:
            return FaultDecision(error=True)
        if faults.latency_spike_prob > 0 and rng.random() < faults.latency_spike_prob:
            return FaultDecision(spike_s=faults.latency_spike_ms / 1000.0)
        return FaultDecision()

    def die_now(self, request: web.Request) -> None:
        """Reset the triggering connection at once and kill the instance in the background."""
        if request.transport is not None:
            request.transport.abort()
        live = self._live
        if live is not None and (self._kill_task is None or self._kill_task.done()):
            self._kill_task = asyncio.create_task(self._kill_if_current(live), name=self.name)

    async def _kill_if_current(self, live: _Live) -> None:
        """Kill ``live`` unless a restart already replaced it."""
        if self._live is live:
            await self.kill()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._live is not None:
            return
        spec = self.engine_spec
        config = self.config
        publisher = None
        if config.kv_events is not None:
            publisher = KvEventPublisher(config.kv_events, spec.block_tokens, self._zmq())
        driver = EngineDriver(spec, speedup=config.speedup, block_sink=publisher)
        task = asyncio.create_task(driver.run(), name=f"{self.name}-engine")
        ctx = ParseContext(
            self._tokenizer,
            spec,
            config.model,
            config.hash_seed,
            config.eos_min_tokens,
            config.eos_max_tokens,
        )
        metrics = InstanceMetrics(config.model, spec, driver.stats)
        runtime = Runtime(self, ctx, driver, metrics, created_now_s())
        runner = web.AppRunner(
            create_app(runtime),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
            logger=_HttpLog(logging.getLogger("aiohttp.server"), {}),
        )
        live = _Live(runner, runtime, task, publisher)
        try:
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port, backlog=1024, reuse_address=True)
            await site.start()
            self.port = int(runner.addresses[0][1])
            if publisher is not None:
                publisher.start(name=self.name, index=self.index, port=self.port, host=self.host)
                live.replay_task = asyncio.create_task(
                    publisher.serve_replays(), name=f"{self.name}-kv-replay"
                )
        except BaseException:
            await self._teardown(live)
            raise
        self.completion_requests = 0
        self._live = live

    async def kill(self) -> None:
        """Die abruptly (connection resets, streams cut); ``restart()`` brings it back."""
        live, self._live = self._live, None
        if live is not None:
            await self._teardown(live)

    async def restart(self) -> None:
        await self.kill()
        await self.start()

    async def close(self) -> None:
        """Stop for good (also waits for a kill triggered by ``die_after_requests``)."""
        kill_task = self._kill_task
        if kill_task is not None and kill_task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await kill_task
        await self.kill()
        context, self._own_zmq_context = self._own_zmq_context, None
        if context is not None:
            context.term()

    def _zmq(self) -> zmq.Context[Any]:
        if self._zmq_context is not None:
            return self._zmq_context
        if self._own_zmq_context is None:
            self._own_zmq_context = zmq.Context()
        return self._own_zmq_context

    async def _teardown(self, live: _Live) -> None:
        runner = live.runner
        for site in list(runner.sites):
            await site.stop()
        server = runner.server
        if server is not None:
            for connection in server.connections:
                if connection.transport is not None:
                    connection.transport.abort()
        await runner.cleanup()
        for task in (live.driver_task, live.replay_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if live.publisher is not None:
            live.publisher.close()
        log.info("emulated instance %s stopped", self.name)
