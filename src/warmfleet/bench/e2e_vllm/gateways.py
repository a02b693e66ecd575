"""In-process warmfleet gateway replicas for the e2e (the public app factory + router hook).

Each replica is ``gateway.app.create_app`` with a router factory that builds routing-core
``Router``s with the served model's tokenizer (``tokens`` key mode) and, in exact mode, a
``KvEventFeed`` whose SUB socket connects to the KV-event relay that the engines publish to.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from warmfleet.bench.e2e_vllm.engines import MODEL_NAME, EngineSpec, reset_prefix_cache
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.kv_events import KvEventFeed, KvEventSubscriber
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.server import StartedApp, start_app
from warmfleet.gateway.state import RouterFactory
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.router import Router

BLOCK_SIZE = 128


def gateway_document(
    strategy: dict[str, Any], engines: Sequence[EngineSpec], seed: int
) -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "seed": seed,
            "health": {"interval_s": 5.0, "timeout_s": 4.0},
            "limits": {"upstream_read_timeout_s": 120.0},
            "endpoints": [
                {
                    "name": "e2e",
                    "variants": [
                        {
                            "name": "main",
                            "routing": {
                                "strategy": strategy,
                                "key": {"mode": "tokens", "block_size": BLOCK_SIZE},
                            },
                            "instances": [{"id": e.instance_id, "url": e.url} for e in engines],
                        }
                    ],
                }
            ],
        },
    }


@dataclass
class Replica:
    started: StartedApp
    feed: KvEventFeed | None
    subscriber_task: asyncio.Task[None] | None

    @property
    def url(self) -> str:
        return self.started.url

    @property
    def gateway(self) -> Gateway:
        return self.started.gateway

    async def stop(self) -> None:
        if self.subscriber_task is not None:
            self.subscriber_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.subscriber_task
        await self.started.stop()


def _plain_factory(tokenizer: HfChatTokenizer) -> RouterFactory:
    def factory(config: RoutingConfig, rng: random.Random) -> Router:
        return Router(config, rng, tokenizer)

    return factory


async def start_replica(
    strategy: dict[str, Any],
    engines: Sequence[EngineSpec],
    tokenizer: HfChatTokenizer,
    *,
    relay_endpoint: str | None,
    seed: int,
) -> Replica:
    """One gateway; with ``relay_endpoint`` its KV-event feed subscribes there (exact mode)."""
    feed = KvEventFeed(MODEL_NAME) if relay_endpoint is not None else None
    factory: RouterFactory = (
        feed.router_factory(tokenizer) if feed is not None else _plain_factory(tokenizer)
    )
    config = parse_gateway_config(gateway_document(strategy, engines, seed), "e2e gateway")
    app = create_app(config, router_factory=factory)
    started = await start_app(app)
    task = None
    if feed is not None and relay_endpoint is not None:
        feed.register_metrics(started.gateway.metrics.registry)
        subscriber = KvEventSubscriber(feed, relay_endpoint, bind=False)
        task = asyncio.create_task(subscriber.run(), name="warmfleet-kv-events")
    return Replica(started, feed, task)


async def sync_exact(
    replicas: Sequence[Replica],
    engines: Sequence[EngineSpec],
    session: aiohttp.ClientSession,
    timeout_s: float = 60.0,
) -> float:
    """Reset every engine's prefix cache until every replica's feed is exact for every engine
    (the reset's ``AllBlocksCleared`` is the resync point; a subscriber that just connected may
    miss the first frames, so this repeats). Returns the seconds it took."""
    start = time.monotonic()
    wanted = {e.instance_id for e in engines}
    while True:
        for engine in engines:
            await reset_prefix_cache(session, engine.url)
        await asyncio.sleep(0.5)
        if all(_exact_ids(r) >= wanted for r in replicas):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            modes = [r.feed.describe() if r.feed else {} for r in replicas]
            raise RuntimeError(f"KV-event feeds not in sync after {timeout_s:.0f} s: {modes}")
        await asyncio.sleep(1.0)


def _exact_ids(replica: Replica) -> set[str]:
    if replica.feed is None:
        return set()
    return {iid for iid, mode in replica.feed.modes().items() if mode == "exact"}
