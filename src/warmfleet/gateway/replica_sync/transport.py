"""The replicas' ZeroMQ wire: note batches over PUB/SUB, catch-up over ROUTER/DEALER.

- **Batches.** Each replica binds one PUB socket (``spec.replicaSync.listen``) and every peer's
  SUB socket connects to it. A batch is one single-frame message: ``HEADER`` (``TOPIC``, the
  wall-clock time, in seconds, at which the batch's oldest note was queued: its arrival minus
  it is the note's observed propagation delay, batching included; the batch's number, from 1
  for each origin: a receiver that sees one skipped knows it lost notes; the length of the
  origin replica's id), the id (UTF-8) and the payload of ``api.replica_sync.BatchEncoder``.
  One frame, not four: each frame is a send and a receive of its own in pyzmq and libzmq
  (docs/benchmarks.md, "Compiled value-type constructors and one-frame batches"). A batch with
  no notes is a heartbeat. When the SUB socket is read: ``inbound.Inbound``.
- **Catch-up.** Each replica binds a ROUTER on the next port. A DEALER sends ``[LOG_REQUEST]``;
  the answer is ``[LOG_REQUEST, origin, payload, ...]``: the replica's open requests
  (``CATCH_UP_NOTES_PER_FRAME`` a frame), then the batches it keeps for newcomers
  (``PayloadLog``), as they were received or sent.
- **Who may connect.** With the fleet's CURVE key (``curve.py``) every socket authenticates
  and encrypts, and a ZAP handler bound before the servers refuses any other key.

Every decoder here raises ``ReplicaSyncError`` (counted and dropped by the caller), never
another exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from warmfleet.api.replica_sync import BatchEncoder, ReplicaSyncError, decode_batch
from warmfleet.gateway.replica_sync.config import catch_up_endpoint
from warmfleet.gateway.replica_sync.curve import CurveKey, ZapGuard
from warmfleet.routing.replica_notes import SyncNote

TOPIC = b"wf-sync"
LOG_REQUEST = b"wf-sync-log"
# topic, oldest note queued (wall clock, s), batch number, origin length in bytes
HEADER = struct.Struct(f"<{len(TOPIC)}sdQH")
CATCH_UP_NOTES_PER_FRAME = 1024
MAX_ORIGIN_BYTES = 512
CATCH_UP_ANSWERS_QUEUED = 2  # per requester connection
MAX_LOG_REQUEST_BYTES = 1024
CLOSE_LINGER_MS = 200  # the longest closing waits for the last batches to reach the peers
RECEIVE_BURST = 256  # batches read at most in a row before the event loop runs other work
# Catch-up answers given at most: a burst (every peer of a 16-replica fleet resyncing at once,
# twice) then a few a second. Each copies the whole log into ZeroMQ on the event loop (~20 ms
# at the default 32 MiB): a flood of 11-byte requests must not be answered at its own rate.
ANSWERS_BURST, ANSWERS_PER_S = 32, 4.0
# plain ints: pyzmq's constants are Python ``IntFlag``s (``int & zmq.POLLIN`` ~490 ns, ~10 ns so)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, init=False)  # __init__: see core.types
class Batch:
    origin: str
    oldest_queued_s: float  # wall clock
    number: int  # from 1, one by one, per origin
    payload: bytes  # as encoded (kept for newcomers, ``PayloadLog``)
    notes: tuple[SyncNote, ...]

    def __init__(
        self,
        origin: str,
        oldest_queued_s: float,
        number: int,
        payload: bytes,
        notes: tuple[SyncNote, ...],
    ) -> None:
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "oldest_queued_s", oldest_queued_s)
        object.__setattr__(self, "number", number)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "notes", notes)


def batch_message(origin: str, oldest_queued_s: float, number: int, payload: bytes) -> bytes:
    raw = origin.encode()
    return HEADER.pack(TOPIC, oldest_queued_s, number, len(raw)) + raw + payload


def _origin(raw: bytes) -> str:
    if not raw or len(raw) > MAX_ORIGIN_BYTES:
        raise ReplicaSyncError(f"origin: expected 1 to {MAX_ORIGIN_BYTES} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError as err:
        raise ReplicaSyncError(f"origin: not UTF-8: {err}") from err


def parse_batch(message: bytes) -> Batch:
    """A received batch message."""
    if len(message) < HEADER.size:
        raise ReplicaSyncError(f"batch: {len(message)} bytes, shorter than its header")
    topic, stamp, number, origin_bytes = HEADER.unpack_from(message)
    end = HEADER.size + origin_bytes
    if topic != TOPIC or len(message) < end:
        raise ReplicaSyncError(
            "batch: expected [topic, stamp, number, origin length] origin payload"
        )
    if not math.isfinite(stamp):  # an infinite delay would stay in the histogram's sum
        raise ReplicaSyncError(f"batch: stamp {stamp!r} is not a time")
    payload = message[end:]
    return Batch(_origin(message[HEADER.size : end]), stamp, number, payload, decode_batch(payload))


class PayloadLog:
    """The encoded batches a replica keeps for newcomers (its own and those of its peers that
    taught it something), oldest dropped once they total more than ``limit_bytes``: a bound on
    bytes, not notes, since a note's size is its prompt's (8 bytes a block)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.payloads: deque[bytes] = deque()
        self.size_bytes = 0

    def add(self, payload: bytes) -> None:
        self.payloads.append(payload)
        self.size_bytes += len(payload)
        while self.size_bytes > self.limit_bytes and self.payloads:
            self.size_bytes -= len(self.payloads.popleft())


def log_frames(origin: str, open_notes: Sequence[SyncNote], log: PayloadLog) -> list[bytes]:
    """The answer to a catch-up request (without the ROUTER's identity frame): the replica's
    open requests, then its log."""
    step, encode = CATCH_UP_NOTES_PER_FRAME, BatchEncoder().encode_valid
    chunks = [encode(open_notes[i : i + step])[0] for i in range(0, len(open_notes), step)]
    return [LOG_REQUEST, origin.encode(), *chunks, *log.payloads]


def parse_log(frames: Sequence[bytes]) -> tuple[str, Sequence[bytes]]:
    """The origin of a catch-up answer and its payloads, not decoded yet (``decode_batch``
    each in turn: a whole log at once would hold the event loop for up to a second)."""
    if len(frames) < 2 or frames[0] != LOG_REQUEST:
        raise ReplicaSyncError("catch-up answer: expected [request, origin, payload, ...]")
    return _origin(frames[1]), frames[2:]


def decoded_batches(
    payloads: Iterable[bytes], on_bad: Callable[[str], None]
) -> Iterator[tuple[SyncNote, ...]]:
    """The notes of each payload of a catch-up answer in turn; one that does not decode is
    skipped (``on_bad("catch_up_bad_frame")``): the rest of the log still counts."""
    for payload in payloads:
        try:
            notes = decode_batch(payload)
        except ReplicaSyncError as err:
            on_bad("catch_up_bad_frame")
            log.warning("replica sync: a bad batch in a catch-up answer: %s", err)
            continue
        yield notes


class AnswerBudget:
    """A token bucket of catch-up answers: ``burst`` at once, refilled at ``per_s``."""

    def __init__(
        self, clock: Callable[[], float], burst: int = ANSWERS_BURST, per_s: float = ANSWERS_PER_S
    ) -> None:
        self._clock, self.burst, self.per_s = clock, burst, per_s
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        """Whether an answer may be given now (it is counted if so)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class Sockets:
    """This replica's sockets: ``pub`` (bound), ``sub`` (connected to the peers), ``router``
    (bound on the next port, answers catch-up requests). ``close`` is idempotent."""

    def __init__(
        self,
        endpoint: str,
        *,
        send_hwm: int = 10_000,
        curve: CurveKey | None = None,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        self.endpoint = endpoint
        self.ctx = zmq.asyncio.Context()
        self._closed = False
        self._guard: ZapGuard | None = None
        self.curve = curve is not None  # the sockets authenticate and encrypt
        try:
            if curve is not None:  # the handler first: no handshake goes unchecked
                self._guard = ZapGuard(self.ctx, curve, on_refused)
            # A plain (blocking-API) socket: a PUB send never blocks (past its high-water mark
            # it drops), so the hot path sends without awaiting.
            self.pub: zmq.Socket[bytes] = zmq.Socket(self.ctx, zmq.PUB)
            self.pub.setsockopt(zmq.LINGER, 0)
            self.pub.setsockopt(zmq.SNDHWM, send_hwm)
            # Plain too: read without a future per message (``receive_ready``) when the event
            # loop reports its descriptor readable (``sub_fd``); pyzmq's asyncio wrapper was
            # half the receiving task's time.
            self.sub: zmq.Socket[bytes] = zmq.Socket(self.ctx, zmq.SUB)
            self.sub.setsockopt(zmq.LINGER, 0)
            self.sub.setsockopt(zmq.RECONNECT_IVL, 20)  # a peer that (re)starts: heard soon
            self.sub.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            # An answer is the whole log (up to ``logBytes``), copied into ZeroMQ: a requester
            # that asks again and again without reading must not queue ~1,000 of them
            # (ROUTER drops an answer past this); a request is one short frame.
            self.router.setsockopt(zmq.SNDHWM, CATCH_UP_ANSWERS_QUEUED)
            self.router.setsockopt(zmq.MAXMSGSIZE, MAX_LOG_REQUEST_BYTES)
            if (guard := self._guard) is not None:
                guard.serve_as(self.pub)
                guard.serve_as(self.router)
                guard.connect_as(self.sub)
            self.pub.bind(endpoint)
            self.router.bind(catch_up_endpoint(endpoint))
        except BaseException:
            self.close()
            raise
        self.connected: set[str] = set()

    def send(self, message: bytes) -> None:
        """Publish ``message`` to every peer, never waiting: past a peer's high-water mark a
        PUB socket drops it silently (no ``zmq.Again``), and that peer sees a gap in the batch
        numbers."""
        self.pub.send(message, flags=zmq.NOBLOCK)

    @property
    def sub_fd(self) -> int:
        """The SUB socket's descriptor: readable when its state may have changed (ZeroMQ's
        edge-triggered signal: reading ``zmq.EVENTS`` re-arms it)."""
        return int(self.sub.getsockopt(zmq.FD))

    def receive_ready(self, limit: int = RECEIVE_BURST) -> list[bytes]:
        """The batch messages already received (at most ``limit``), without waiting. Fewer
        than ``limit``: none is left, and ``sub_fd`` is re-armed. (It asks ZeroMQ's state
        before each read instead of reading until ``zmq.Again``: an exception a wake-up.)"""
        out: list[bytes] = []
        sub = self.sub
        while len(out) < limit and int(sub.getsockopt(_EVENTS)) & _POLLIN:
            try:
                out.append(sub.recv(zmq.NOBLOCK))
            except zmq.Again:  # not expected once POLLIN is set; read again on the next wake
                break
        return out

    async def serve_log_requests(
        self,
        answer: Callable[[], list[bytes]],
        budget: AnswerBudget,
        on_dropped: Callable[[str], None],
    ) -> None:
        """Answer each catch-up request on the ROUTER with ``answer()`` while ``budget``
        allows (``on_dropped("catch_up_limited")`` past it: the requester times out;
        ``on_dropped("bad_frame")`` for a message that is no request), until the sockets
        close."""
        router = self.router
        while not self._closed:
            frames = await router.recv_multipart()
            if len(frames) != 2 or frames[1] != LOG_REQUEST:
                on_dropped("bad_frame")
            elif not budget.take():
                on_dropped("catch_up_limited")
            else:
                frames_out = answer()
                try:  # a ROUTER drops what it cannot deliver: this never waits in practice
                    await asyncio.wait_for(router.send_multipart([frames[0], *frames_out]), 5.0)
                except TimeoutError:
                    log.warning("replica sync: a catch-up answer was not sent in 5 s")

    def set_peers(self, endpoints: Iterable[str]) -> None:
        wanted = set(endpoints)
        for gone in self.connected - wanted:
            with contextlib.suppress(zmq.ZMQError):
                self.sub.disconnect(gone)
        connected = self.connected & wanted
        for new in wanted - self.connected:
            try:  # one endpoint ZeroMQ refuses must not keep the others unsubscribed
                self.sub.connect(new)
            except zmq.ZMQError as err:
                log.error("replica sync: cannot subscribe to peer %s: %s", new, err)
                continue
            connected.add(new)
        self.connected = connected

    async def fetch_log(self, endpoint: str, timeout_s: float) -> list[bytes]:
        """Ask the peer whose sync socket is ``endpoint`` for its log (``TimeoutError`` after
        ``timeout_s``)."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self._guard is not None:
            self._guard.connect_as(sock)

        async def ask() -> list[bytes]:
            await sock.send_multipart([LOG_REQUEST])  # waits for the connection
            frames: list[bytes] = await sock.recv_multipart()
            return frames

        try:
            sock.connect(catch_up_endpoint(endpoint))
            return await asyncio.wait_for(ask(), timeout_s)
        finally:
            sock.close(linger=0)

    async def fetch_answer(
        self, endpoint: str, timeout_s: float, on_bad: Callable[[str], None]
    ) -> tuple[str, Sequence[bytes]] | None:
        """The peer's catch-up answer (``fetch_log``), parsed; None if it gave none in time or
        one that is not an answer (``on_bad("catch_up_bad_frame")``)."""
        try:
            return parse_log(await self.fetch_log(endpoint, timeout_s))
        except ReplicaSyncError as err:
            on_bad("catch_up_bad_frame")
            log.warning("replica sync: bad catch-up answer from %s: %s", endpoint, err)
        except (TimeoutError, zmq.ZMQError) as silent:
            log.warning("replica sync: no catch-up answer from %s: %r", endpoint, silent)
        return None

    def close(self) -> None:
        """Close every socket: the PUB's last batches (a graceful stop's ends) get
        ``CLOSE_LINGER_MS`` to leave, the rest is dropped at once."""
        if self._closed:
            return
        self._closed = True
        for name in ("pub", "sub", "router"):
            sock: Any = getattr(self, name, None)
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close(linger=CLOSE_LINGER_MS if name == "pub" else 0)
        if self._guard is not None:
            self._guard.close()
        self.ctx.term()

    async def serve_zap(self) -> None:
        """Answer the CURVE handshakes' ZAP requests until cancelled (nothing without a key)."""
        if self._guard is not None:
            await self._guard.serve()
