"""A small bounded closed-loop client for the local fleet's acceptance runs: ``concurrency``
workers send non-streamed chat completions through the gateway until stopped (or
``max_requests``), each request tagged with the phase it was sent in."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp


@dataclass
class SteadyLoad:
    url: str
    model: str
    concurrency: int = 4
    max_requests: int = 100_000
    timeout_s: float = 30.0
    phase: str = "warmup"
    sent: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._worker(session, i) for i in range(self.concurrency)))

    async def _worker(self, session: aiohttp.ClientSession, index: int) -> None:
        n = 0
        while not self._stop.is_set() and sum(self.sent.values()) < self.max_requests:
            n += 1
            phase = self.phase
            self.sent[phase] += 1
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": f"worker {index} request {n}"}],
                "max_tokens": 16,
            }
            started = time.perf_counter()
            try:
                async with session.post(self.url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        self._fail(phase, f"http_{resp.status}")
            except (aiohttp.ClientError, TimeoutError) as err:
                self._fail(phase, type(err).__name__)
            if time.perf_counter() - started < 0.01:
                await asyncio.sleep(0.01)

    def _fail(self, phase: str, what: str) -> None:
        self.failed[phase] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{phase}: {what}")
