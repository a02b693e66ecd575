"""A gateway's KV-event service, built from ``spec.kv_events``: the feed, its ZMQ subscriber and
the task that runs it. The gateway lifespan calls ``start`` (binds or connects the SUB socket,
starts the task; a busy port is a ``ConfigError`` naming the field) and ``stop`` (cancels the
task, closes the socket)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import zmq

from warmfleet.core.errors import ConfigError
from warmfleet.core.types import InstanceId
from warmfleet.gateway.kv_config import KvEventsConfig, KvReplayConfig
from warmfleet.gateway.kv_events.transport import KvEventSubscriber, ReplaySource
from warmfleet.gateway.kv_events.wiring import KvEventFeed
from warmfleet.gateway.variant import RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.keys import Tokenizer
from warmfleet.routing.router import Router


class KvEventService:
    def __init__(self, config: KvEventsConfig, model: str) -> None:
        self.config = config
        self.feed = KvEventFeed(
            model,
            resync_batches=config.resync_batches,
            silence_timeout_s=config.silence_timeout_s,
            replay=config.replay is not None,
        )
        self.subscriber: KvEventSubscriber | None = None
        self._task: asyncio.Task[None] | None = None

    def router_factory(
        self, tokenizer: Tokenizer | None
    ) -> Callable[[RoutingConfig, random.Random], RouterLike]:
        """Routers keyed by token ids are fed by the events; the others are plain ``Router``s."""
        exact = self.feed.router_factory(tokenizer)

        def factory(config: RoutingConfig, rng: random.Random) -> RouterLike:
            if config.key.mode == "tokens":
                return exact(config, rng)
            return Router(config, rng, tokenizer)

        return factory

    async def start(self, instance_url: Callable[[InstanceId], str | None]) -> None:
        """Bind (engines connect) or connect (to a relay) and start the subscriber task.
        ``instance_url`` finds an instance's URL (its host is where its replay socket is)."""
        replay = self.config.replay
        source = None
        if replay is not None:
            endpoint = partial(_replay_endpoint, replay, instance_url)
            source = ReplaySource(endpoint, replay.timeout_s)
        try:
            self.subscriber = KvEventSubscriber(
                self.feed,
                self.config.endpoint,
                bind=self.config.bind,
                topic_prefix=self.config.topic_prefix,
                replay=source,
                on_delay=self.feed.observe_delay,
            )
        except zmq.ZMQError as err:
            how = "bind" if self.config.bind else "connect to"
            raise ConfigError(
                f"spec.kvEvents.endpoint: cannot {how} {self.config.endpoint}: "
                f"{zmq.strerror(err.errno) if err.errno else err}"
            ) from err
        self._task = asyncio.create_task(self.subscriber.run(), name="warmfleet-gateway-kv-events")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.subscriber is not None:
            self.subscriber.close()
            self.subscriber = None

    def describe(self) -> dict[str, Any]:
        """The admin view: configuration, per-instance mode and cause, translator counters."""
        state = self.feed.describe()
        sub = self.subscriber
        return {
            "endpoint": self.config.endpoint,
            "bind": self.config.bind,
            "topic_prefix": self.config.topic_prefix,
            "model": self.feed.model,
            "running": self._task is not None and not self._task.done(),
            "frames": sub.frames if sub is not None else 0,
            "decode_errors": sub.decode_errors if sub is not None else 0,
            "modes": self.feed.modes(),
            **state,
        }


def _replay_endpoint(
    replay: KvReplayConfig,
    instance_url: Callable[[InstanceId], str | None],
    instance_id: InstanceId,
) -> str | None:
    url = instance_url(instance_id)
    return replay.endpoint(url) if url is not None else None
