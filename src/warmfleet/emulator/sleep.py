"""vLLM's sleep mode on an emulated instance: ``POST /sleep?level=1|2``, ``POST /wake_up``
(optionally ``?tags=weights&tags=kv_cache``), ``GET /is_sleeping``.

vLLM's semantics (docs/features/sleep_mode.md of vLLM):

- level 1 offloads the weights to host memory and discards the KV cache; level 2 discards both;
- while asleep, the routes that need the weights (chat, completions, responses, embeddings,
  invocations) answer 503; ``/tokenize``, ``/detokenize``, ``/v1/models``, ``/health`` work;
- ``/wake_up`` without tags wakes everything; with tags, only those (``weights``, ``kv_cache``),
  and the engine is asleep until every tag is awake;
- waking the weights costs time: after level 1 the engine spec's ``wake_from_host_s`` (copy back
  from host memory), after level 2 its ``wake_from_disk_s`` (read again from disk), both engine
  seconds divided by the instance's speed-up.

The emulator's own choices where vLLM leaves it open: ``/sleep`` first refuses new generation
requests, then waits (bounded by ``SLEEP_DRAIN_TIMEOUT_S``) for the running ones to finish
before it discards the KV cache (the prefix cache's blocks are removed, and KV-event subscribers
told); a second ``/sleep`` while asleep keeps the deeper level.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from warmfleet.emulator.protocol import error_body

TAGS = ("weights", "kv_cache")
SLEEP_DRAIN_TIMEOUT_S = 60.0
_DRAIN_POLL_S = 0.01


class SleepError(ValueError):
    """A bad ``level`` or ``tags`` parameter."""


@dataclass
class SleepState:
    """Which parts of the engine are asleep, and at which level (pure)."""

    level: int = 0  # 0: awake
    asleep_tags: set[str] = field(default_factory=set)
    entering: bool = False  # /sleep accepted, waiting for running requests

    @property
    def is_sleeping(self) -> bool:
        return bool(self.asleep_tags)

    @property
    def refuses_generation(self) -> bool:
        return self.entering or self.is_sleeping

    @staticmethod
    def parse_level(raw: str | None) -> int:
        if raw is None or raw == "":
            return 1
        if raw not in ("1", "2"):
            raise SleepError(f"level must be 1 or 2, got {raw!r}")
        return int(raw)

    @staticmethod
    def parse_tags(raw: list[str]) -> set[str]:
        tags = set(raw) or set(TAGS)
        unknown = tags - set(TAGS)
        if unknown:
            raise SleepError(f"unknown tags {sorted(unknown)}; known: {list(TAGS)}")
        return tags

    def sleep(self, level: int) -> None:
        self.level = max(self.level, level)
        self.asleep_tags = set(TAGS)
        self.entering = False

    def wake(self, tags: set[str]) -> bool:
        """Wake ``tags``; True if the weights were woken (the caller pays the wake time)."""
        weights = "weights" in tags and "weights" in self.asleep_tags
        self.asleep_tags -= tags
        return weights

    def finish_wake(self) -> None:
        if not self.asleep_tags:
            self.level = 0


class SleepHost(Protocol):
    """What the sleep routes need from the instance's runtime."""

    @property
    def sleep_state(self) -> SleepState: ...

    def reset_kv_cache(self) -> bool: ...

    def requests_in_flight(self) -> int: ...

    def wake_wall_s(self, level: int) -> float: ...


def sleeping_response() -> web.Response:
    """The answer of a route that needs the weights while the engine sleeps (vLLM: 503)."""
    body = error_body("the model is sleeping; POST /wake_up first", 503)
    body["error"]["type"] = "ServiceUnavailableError"
    return web.json_response(body, status=503)


def _bad(err: SleepError) -> web.Response:
    return web.json_response(error_body(str(err), 400), status=400)


class SleepRoutes:
    def __init__(self, host: SleepHost) -> None:
        self.host = host
        self._lock = asyncio.Lock()  # one sleep or wake at a time

    async def sleep(self, request: web.Request) -> web.Response:
        try:
            level = SleepState.parse_level(request.query.get("level"))
        except SleepError as err:
            return _bad(err)
        async with self._lock:
            state = self.host.sleep_state
            if not state.is_sleeping:
                state.entering = True
                try:
                    await self._drain()
                except TimeoutError:
                    state.entering = False
                    msg = f"requests still running after {SLEEP_DRAIN_TIMEOUT_S:.0f} s"
                    return web.json_response(error_body(msg, 500), status=500)
                except asyncio.CancelledError:
                    state.entering = False  # the client gave up: stay awake, serve again
                    raise
            state.sleep(level)
        return web.Response(status=200)

    async def _drain(self) -> None:
        async with asyncio.timeout(SLEEP_DRAIN_TIMEOUT_S):
            while self.host.requests_in_flight() or not self.host.reset_kv_cache():
                await asyncio.sleep(_DRAIN_POLL_S)

    async def wake_up(self, request: web.Request) -> web.Response:
        try:
            tags = SleepState.parse_tags(request.query.getall("tags", []))
        except SleepError as err:
            return _bad(err)
        async with self._lock:
            state = self.host.sleep_state
            level = state.level
            if state.wake(tags):
                await asyncio.sleep(self.host.wake_wall_s(level))
            state.finish_wake()
        return web.Response(status=200)

    async def is_sleeping(self, _request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.host.sleep_state.is_sleeping})
