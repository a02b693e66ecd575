"""The gateway's own reads of its instances hold a bounded number of sockets at once, however
many instances hang: each reader (health probes, ``/v1/models`` answers, KV capacity and
engine-stats ``/metrics`` reads) has its share of ``gateway.probes.READ_SLOTS`` (320 in all),
and reads that hang hold their own reader's share only. Before, each reader had an unlimited
pool and 256 reads in flight: 1,024 sockets with every path of 200 instances hung."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from gateway_support import gateway_doc, gateway_running

from support.waiting import wait_until
from warmfleet.gateway.config import InstanceSpec, parse_gateway_config
from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.kv_capacity import metrics_text
from warmfleet.gateway.probes import MAX_BACKGROUND_READS, READ_SLOTS, Prober, ReaderPools

HUNG = 200  # instances per reader: more than any reader's share
TIMEOUT_S = 8.0  # the reads stay hung while the test looks (health.timeoutS: the KV reads')


class Hung:
    """A server on which every read hangs until ``release``; counts the reads in flight per
    reader, by path: ``/h<k>/health``, ``/m<k>/v1/models``, ``/s<k>/metrics`` (engine
    stats), any other ``/metrics`` (KV capacity, the gateway's own instance's included)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.peak_total = 0

    @staticmethod
    def reader(path: str) -> str:
        if path.endswith("/health"):
            return "health"
        if path.endswith("/v1/models"):
            return "models"
        return "engine_stats" if path.startswith("/s") else "kv_capacity"

    async def serve(self, request: web.Request) -> web.Response:
        reader = self.reader(request.path)
        self.now[reader] += 1
        self.peak[reader] = max(self.peak[reader], self.now[reader])
        self.peak_total = max(self.peak_total, self.now.total())
        try:
            await self.release.wait()  # (a handler cancelled when its client leaves)
            return web.Response(status=503)
        finally:
            self.now[reader] -= 1

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.serve)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            self.release.set()
            await runner.cleanup()


def _doc(url: str) -> dict[str, Any]:
    """One variant whose one instance hangs too (the gateway's own rounds read it)."""
    doc = gateway_doc([], health={"intervalS": TIMEOUT_S, "timeoutS": TIMEOUT_S})
    doc["spec"]["endpoints"][0]["variants"][0]["instances"] = [{"id": "bg", "url": f"{url}/bg"}]
    return doc


async def test_hung_instances_hold_at_most_the_read_budget_each_reader_its_share() -> None:
    """200 hung addresses for each of the four readers of the running gateway: at most 320
    reads are in flight at once, and each reader has its whole share in flight (the others'
    hung reads took none of it)."""
    server = Hung()
    async with server.running() as url, gateway_running(parse_gateway_config(_doc(url))) as app:
        gateway = app.gateway
        metrics, names = gateway.state.metrics, ("main", "v1")
        reads: list[Any] = []
        for k in range(HUNG):
            reads.append(gateway.health.check(f"{url}/h{k}/health", TIMEOUT_S))
            inst = InstanceRuntime(InstanceSpec(id=f"m{k}", url=f"{url}/m{k}"), metrics, *names)
            reads.append(gateway.models._fetch(inst, TIMEOUT_S))
            reads.append(gateway.kv_capacity.read(f"{url}/k{k}"))
            reads.append(gateway.engine_stats.read(f"{url}/s{k}", TIMEOUT_S))
        running = asyncio.gather(*reads)
        try:
            await wait_until(
                lambda: server.now.total() >= MAX_BACKGROUND_READS, what="the reads in flight"
            )
            await asyncio.sleep(0.5)  # room for any read over the budget to arrive
            assert server.peak_total <= MAX_BACKGROUND_READS == 320
            assert dict(server.peak) == READ_SLOTS
        finally:
            server.release.set()
            await running


async def test_the_rare_readers_close_their_connections_after_each_read() -> None:
    """The models cache's and the KV capacity reads' pools keep no idle connection (they read
    every 10 s and every 10 min: each read on a new one); the health probes' and engine-stats
    reads' keep theirs (three reads, one connection)."""
    seen: list[int] = []

    async def metrics(request: web.Request) -> web.Response:
        seen.append(id(request.transport))
        return web.Response(text="vllm:num_requests_waiting 1\n")

    app = web.Application()
    app.router.add_get("/{tail:.*}", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    pools = ReaderPools.open()
    try:
        kept_by = {pools.health: True, pools.engine_stats: True}
        for session in pools.sessions():
            kept = kept_by.get(session, False)
            seen.clear()
            prober = Prober(session)
            for _ in range(3):
                assert await metrics_text(prober, url, 5.0) is not None
            assert (len(set(seen)) == 1) is kept, session
    finally:
        for session in pools.sessions():
            await session.close()
        await runner.cleanup()
