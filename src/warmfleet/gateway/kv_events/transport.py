"""ZMQ transport: the gateway's SUB socket and a relay for several gateway replicas."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from warmfleet.gateway.kv_events.translator import BatchConsumer
from warmfleet.gateway.kv_events.wire import (
    TOPIC_PREFIX,
    KvEventDecodeError,
    decode_frames,
    instance_of_topic,
)

log = logging.getLogger(__name__)


class KvEventSubscriber:
    """One SUB socket (``bind`` for engines that connect, or ``connect`` to a relay) feeding a
    ``BatchConsumer`` (a translator or a gateway's ``KvEventFeed``). ``run()`` is a task owned
    by the caller's lifespan."""

    def __init__(
        self,
        consumer: BatchConsumer,
        endpoint: str,
        *,
        bind: bool = True,
        clock: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 0.5,
        topic_prefix: str = TOPIC_PREFIX,
    ) -> None:
        self.consumer = consumer
        self.topic_prefix = topic_prefix
        self.frames = 0
        self._closed = False
        self.endpoint = endpoint
        self.bind = bind
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.decode_errors = 0
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic_prefix.encode())
        if bind:
            self._sock.bind(endpoint)
        else:
            self._sock.connect(endpoint)

    def handle(self, frames: Sequence[bytes]) -> None:
        try:
            topic, seq, batch = decode_frames(frames)
        except KvEventDecodeError as err:
            self.decode_errors += 1
            log.warning("dropping a KV event frame: %s", err)
            return
        self.frames += 1
        instance_id = instance_of_topic(topic, self.topic_prefix)
        if instance_id is not None:
            self.consumer.apply(instance_id, seq, batch, self.clock())

    async def run(self) -> None:
        try:
            while True:
                if await self._sock.poll(self.poll_interval_s * 1000.0):
                    self.handle(await self._sock.recv_multipart())
                self.consumer.check_silence(self.clock())
        finally:
            self.close()

    def close(self) -> None:
        """Idempotent (a task cancelled before it ran never reaches ``run``'s ``finally``)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(zmq.ZMQError):
            self._sock.close(linger=0)
        self._ctx.term()


class KvEventRelay:
    """Fan-in/fan-out for several gateway replicas: binds ``engines_endpoint`` (engines connect)
    and republishes every frame on ``replicas_endpoint`` (replicas' subscribers connect)."""

    def __init__(self, engines_endpoint: str, replicas_endpoint: str) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.bind(engines_endpoint)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(replicas_endpoint)
        self.frames = 0

    async def run(self) -> None:
        try:
            while True:
                frames = await self._sub.recv_multipart()
                await self._pub.send_multipart(frames)
                self.frames += 1
        except asyncio.CancelledError:
            raise
        finally:
            self.close()

    def close(self) -> None:
        for sock in (self._sub, self._pub):
            with contextlib.suppress(zmq.ZMQError):
                sock.close(linger=0)
        self._ctx.term()
