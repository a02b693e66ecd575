"""vLLM-compatible KV-cache event publisher (ZMQ PUB, msgpack), one per emulated instance.

The wire format is ``warmfleet.api.kv_events`` (the same definition the gateway decodes with):
``AllBlocksCleared`` when an instance (re)starts with an empty cache (like any event sent before
the subscription reaches the publisher, it can be lost), then ``BlockStored``/``BlockRemoved``
in vLLM's array form, one batch per ``flush()``; the data-parallel rank is always 0.

Block hashes are the emulator's chained 64-bit block hashes (``tokenizer.prompt_block_hashes``),
so a subscriber can also recompute them from ``token_ids``. As vLLM does with a concrete host, the
PUB socket *connects* to ``endpoint``: one subscriber that binds there collects every instance.
PUB drops messages nobody receives yet (a subscriber must tolerate gaps; ``seq`` shows them).
With ``replay_port_offset``, as vLLM with ``replay_endpoint``, a ROUTER socket at the instance's
port plus the offset keeps the last ``buffer_batches`` batches and answers replay requests.

The engine calls ``block_stored``/``blocks_removed`` synchronously while it advances; events are
buffered and sent as one batch per ``flush()`` (the driver flushes after every advance).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from warmfleet.api.kv_events import (
    CLEARED_EVENT,
    END_SEQ,
    extend_stored,
    pack_batch,
    removed_event,
    seq_bytes,
    stored_event,
)
from warmfleet.core.errors import ConfigError
from warmfleet.emulator.config import KvEventsSpec

log = logging.getLogger(__name__)
MEDIUM = "GPU"
DATA_PARALLEL_RANK = 0  # one engine per instance: vLLM's rank 0


@dataclass(slots=True)
class _BlockMeta:
    parent: int | None
    token_ids: Sequence[int]
    start: int
    refs: int


class KvEventPublisher:
    """Publishes one instance's BlockStored/BlockRemoved events (see the module docstring)."""

    def __init__(self, spec: KvEventsSpec, block_size: int, context: zmq.Context[Any]) -> None:
        self.spec = spec
        self.block_size = block_size
        self._topic = b""
        self._context = context
        self._socket: zmq.Socket[Any] | None = None
        self._seq = 0
        self._events: list[Sequence[object]] = []
        self._meta: dict[int, _BlockMeta] = {}
        self._requests: dict[int, tuple[int, ...]] = {}
        self.sent_batches = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=spec.buffer_batches)
        self._router: zmq.Socket[Any] | None = None  # the replay socket
        self.replays = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, name: str, index: int, port: int, host: str = "127.0.0.1") -> None:
        """Connect and announce an empty cache; the topic template is filled in here. With
        ``replay_port_offset`` the replay socket is bound too (``serve_replays`` answers)."""
        self._topic = self.spec.topic.format(name=name, index=index, port=port).encode()
        if self.spec.replay_port_offset is not None:
            router = self._context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            address = f"tcp://{host}:{port + self.spec.replay_port_offset}"
            try:
                router.bind(address)
            except zmq.ZMQError as err:
                router.close(linger=0)
                raise ConfigError(
                    f"spec.kvEvents.replayPortOffset: cannot bind {address} "
                    f"(port {port} + {self.spec.replay_port_offset}): "
                    f"{zmq.strerror(err.errno) if err.errno else err}"
                ) from err
            self._router = router
        socket = self._context.socket(zmq.PUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 100_000)
        try:
            socket.connect(self.spec.endpoint)
        except zmq.ZMQError as err:  # an endpoint ZeroMQ cannot parse
            socket.close(linger=0)
            raise ConfigError(
                f"spec.kvEvents.endpoint: cannot connect to {self.spec.endpoint}: {err.strerror}"
            ) from err
        self._socket = socket
        self._events.append(CLEARED_EVENT)
        self.flush()

    def close(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            socket.close(linger=0)
        router, self._router = self._router, None
        if router is not None:
            router.close(linger=0)

    async def serve_replays(self) -> None:
        """Answer replay requests until cancelled (a task of the instance's lifespan)."""
        if self._router is None:
            return
        sock = zmq.asyncio.Socket.shadow(self._router.underlying)
        try:
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    continue
                client, _empty, start = frames
                first = int.from_bytes(start, "big", signed=True)
                self.replays += 1
                for seq, payload in list(self._buffer):
                    if seq >= first:
                        frames = [client, b"", self._topic, seq_bytes(seq), payload]
                        await sock.send_multipart(frames)
                await sock.send_multipart([client, b"", b"", END_SEQ, b""])
        except zmq.ZMQError as err:  # the instance goes on without replays
            log.warning("KV-event replay socket failed: %s", err)

    # ------------------------------------------------------------------ request bookkeeping

    def request_submitted(
        self, request_id: int, block_hashes: tuple[int, ...], token_ids: Sequence[int]
    ) -> None:
        """Remember where each prompt block's tokens are, until the request is done."""
        meta = self._meta
        size = self.block_size
        parent: int | None = None
        for index, block_hash in enumerate(block_hashes):
            entry = meta.get(block_hash)
            if entry is None:
                meta[block_hash] = _BlockMeta(parent, token_ids, index * size, 1)
            else:
                entry.refs += 1
            parent = block_hash
        self._requests[request_id] = block_hashes

    def request_done(self, request_id: int) -> None:
        hashes = self._requests.pop(request_id, ())
        meta = self._meta
        for block_hash in hashes:
            entry = meta.get(block_hash)
            if entry is not None:
                entry.refs -= 1
                if entry.refs <= 0:
                    del meta[block_hash]

    # ------------------------------------------------------------------ engine hook

    def block_stored(self, block_hash: int) -> None:
        entry = self._meta.get(block_hash)
        if entry is None:  # not a prompt block of a known request (cannot happen in practice)
            return
        tokens = list(entry.token_ids[entry.start : entry.start + self.block_size])
        events = self._events
        if events and extend_stored(events[-1], block_hash, entry.parent, tokens):
            return
        events.append(stored_event(block_hash, entry.parent, tokens, self.block_size, MEDIUM))

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        if block_hashes:
            self._events.append(removed_event(block_hashes, MEDIUM))

    # ------------------------------------------------------------------ sending

    def flush(self) -> None:
        """Send the buffered events as one or more batches (never blocks; PUB drops if full)."""
        socket = self._socket
        if not self._events:
            return
        events, self._events = self._events, []
        if socket is None:
            return
        step = self.spec.max_batch_events
        for start in range(0, len(events), step):
            payload = pack_batch(time.time(), events[start : start + step], DATA_PARALLEL_RANK)
            frames = [self._topic, seq_bytes(self._seq), payload]
            with contextlib.suppress(zmq.Again):  # a gap the subscriber sees in ``seq``
                socket.send_multipart(frames, flags=zmq.NOBLOCK)
            self._buffer.append((self._seq, payload))  # a lost one can still be replayed
            self._seq += 1
            self.sent_batches += 1
