"""ZMQ transport: the gateway's SUB socket and a relay for several gateway replicas."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from warmfleet.api.kv_events import (
    END_SEQ,
    TOPIC_PREFIX,
    EventBatch,
    KvEventDecodeError,
    decode_frames,
    instance_of_topic,
    seq_bytes,
)
from warmfleet.core.types import InstanceId
from warmfleet.gateway.kv_events.translator import BatchConsumer
from warmfleet.gateway.kv_events.view import ReplayRequest

# The largest frame read from an engine (a step's batch of a 128k-token prefill is ~1 MB): a
# larger one drops that connection (ZeroMQ's MAXMSGSIZE) instead of being read into memory and
# decoded on the event loop; the engine reconnects and the lost batch is a gap.
MAX_MESSAGE_BYTES = 64 << 20
MAX_REPLAY_BATCHES = 100_000  # vLLM keeps 10,000 by default (``buffer_steps``)
REPLAY_SLICE_BATCHES = 64  # ~1 ms of translation between two chances for requests to run
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplaySource:
    """Where an instance's engine answers replay requests (``endpoint``; None: it has no
    replay socket) and how long one answer may take."""

    endpoint: Callable[[InstanceId], str | None]
    timeout_s: float


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
        replay: ReplaySource | None = None,
        on_delay: Callable[[float], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``replay``: where the consumer's replay requests go, each with its own DEALER socket
        (None: every replay request is answered "none"). ``on_delay``: told, for each batch
        received (not replayed), how long after its engine stamped it (``wall_clock`` minus the
        batch's ``ts``; 0 if the engine's clock is ahead; unstamped batches are not counted)."""
        self.consumer = consumer
        self.on_delay = on_delay
        self.wall_clock = wall_clock
        self.replay = replay
        self.topic_prefix = topic_prefix
        self.frames = 0
        self._closed = False
        self.endpoint = endpoint
        self.bind = bind
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.decode_errors = 0
        self.apply_errors = 0
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic_prefix.encode())
        try:
            if bind:
                self._sock.bind(endpoint)
            else:
                self._sock.connect(endpoint)
        except zmq.ZMQError:  # a busy port, a bad address: nothing stays open
            self.close()
            raise

    def handle(self, frames: Sequence[bytes]) -> None:
        try:
            topic, seq, batch = decode_frames(frames)
        except KvEventDecodeError as err:
            self.decode_errors += 1
            log.warning("dropping a KV event frame: %s", err)
            return
        self.frames += 1
        instance_id = instance_of_topic(topic, self.topic_prefix)
        if instance_id is None:
            return
        if self.on_delay is not None and 0.0 < batch.ts < math.inf:  # 0: no stamp
            self.on_delay(max(self.wall_clock() - batch.ts, 0.0))
        try:
            self.consumer.apply(instance_id, seq, batch, self.clock())
        except Exception:  # a bug must not stop the subscriber (and with it silence checks)
            self.apply_errors += 1
            log.exception("applying a KV event batch of %s failed", instance_id)

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as replays:
                while True:
                    if await self._sock.poll(self.poll_interval_s * 1000.0):
                        self.handle(await self._sock.recv_multipart())
                    for request in self.consumer.take_replay_requests():
                        replays.create_task(self._replay(request))
                    self.consumer.check_silence(self.clock())
        finally:
            self.close()

    async def _replay(self, request: ReplayRequest) -> None:
        """Ask the instance's engine for the batches it missed; the consumer gets them, or
        ``None`` if none could be had (no endpoint, an error, no full answer in time)."""
        batches: list[tuple[int, EventBatch]] | None = None
        replay, endpoint = self.replay, None
        try:
            endpoint = replay.endpoint(request.instance_id) if replay is not None else None
            if replay is not None and endpoint is not None:
                fetch = self._fetch_replay(endpoint, request)
                batches = await asyncio.wait_for(fetch, replay.timeout_s)
        except (TimeoutError, zmq.ZMQError, KvEventDecodeError) as err:
            log.warning(
                "replay of %s from batch %d (%s) failed: %r",
                request.instance_id,
                request.from_seq,
                endpoint,
                err,
            )
        except Exception:  # a bug must not stop the subscriber: the gap is handled as one
            log.exception("replay of %s failed", request.instance_id)
        # applied a slice at a time: a long replay must not stall the gateway's requests
        steps = self.consumer.replay_steps(request, batches, self.clock())
        try:
            for step, _ in enumerate(steps):
                if step % REPLAY_SLICE_BATCHES == REPLAY_SLICE_BATCHES - 1:
                    await asyncio.sleep(0)
        finally:
            for _ in steps:  # cancelled half-way: finish, so no instance is left waiting
                pass

    async def _fetch_replay(
        self, endpoint: str, request: ReplayRequest
    ) -> list[tuple[int, EventBatch]]:
        """vLLM's replay protocol (``warmfleet.api.kv_events``): ask the engine's ROUTER for
        the batches from ``request.from_seq`` on."""
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", seq_bytes(request.from_seq)])
            batches: list[tuple[int, EventBatch]] = []
            while len(batches) < MAX_REPLAY_BATCHES:
                frames = await sock.recv_multipart()
                if len(frames) == 4 and frames[2] == END_SEQ:
                    break
                topic, seq, batch = decode_frames(frames[1:])
                if instance_of_topic(topic, self.topic_prefix) == request.instance_id:
                    batches.append((seq, batch))
            return batches
        finally:
            sock.close(linger=0)

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
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            self._sub.bind(engines_endpoint)
            self._pub.bind(replicas_endpoint)
        except zmq.ZMQError:  # a busy port: neither socket stays open
            self.close()
            raise
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
