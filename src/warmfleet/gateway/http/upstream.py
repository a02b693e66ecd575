"""Pooled HTTP/1.1 connections to instances (asyncio protocols over httptools).

One :class:`UpstreamConnection` carries one exchange at a time. The response head resolves
``Exchange.head``; the body is either collected (``Exchange.done`` gives it) or handed to the
exchange's ``sink`` from inside ``data_received``, so an answer reaches the client without
waiting for a task to wake up (and a stream without a task switch per chunk). Timeouts:
connect, read (no byte for ``read_timeout_s``) and total, all per exchange. Idle connections
are kept per instance address for ``keepalive_s`` and reused most-recently-used first.
"""

from __future__ import annotations

import asyncio
import socket
from time import monotonic
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools


class Origin:
    """Where an instance's requests go: ``http(s)://host[:port][/prefix]`` parsed once;
    ``extra_headers``: request header lines every request to it carries (a pinned DP rank)."""

    __slots__ = ("addr", "extra_headers", "host_header", "prefix", "tls")

    def __init__(self, url: str, data_parallel_rank: int | None = None) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if self.tls else 80)
        self.addr = (host, port, self.tls)
        self.host_header = parts.netloc.rpartition("@")[2].encode("idna")
        self.prefix = parts.path.rstrip("/").encode()
        rank = data_parallel_rank
        self.extra_headers = b"" if rank is None else b"X-Data-Parallel-Rank: %d\r\n" % rank


class UpstreamConnectError(Exception):
    """The instance could not be reached (refused, unreachable, connect timeout)."""


class UpstreamClosedError(Exception):
    """The connection broke (reset, closed, malformed answer) before the exchange ended."""


class UpstreamTimeout(Exception):
    """No byte within the read timeout, or the exchange exceeded the total timeout."""


Addr = tuple[str, int, bool]  # host, port, TLS
# The instance's response headers the relay passes on to the client (docs/gateway.md): its
# request id, processing time, rate limits (every ``x-ratelimit-*``) and retry hints (the
# openai client reads ``retry-after-ms`` and ``retry-after``). Hop-by-hop headers never are.
RELAYED_HEADERS = (
    "content-encoding",
    "x-request-id",
    "openai-processing-ms",
    "openai-version",
    "server-timing",
    "retry-after",
    "retry-after-ms",
)
_RELAYED_PREFIXES = (b"x-ratelimit-",)
# The framing headers the relay reads (``Exchange`` fields; the client's are its own).
FRAMING_HEADERS = ("content-type", "content-length", "transfer-encoding")
# Response headers the relay reads or passes on (lower-case bytes -> str key).
_KEPT_HEADERS = {name.encode(): name for name in (*FRAMING_HEADERS, *RELAYED_HEADERS)}


class Sink(Protocol):
    """Receives an answer inside the connection's callbacks: ``head`` once the headers are
    parsed, ``data`` per decoded body chunk, ``flush`` after each read from the socket (chunks
    that arrived together can leave in one write), ``end`` when the answer is complete (before
    ``Exchange.done`` resolves)."""

    def head(self, ex: Exchange) -> None: ...

    def data(self, chunk: bytes) -> None: ...

    def flush(self) -> None: ...

    def end(self, ex: Exchange) -> None: ...


class ConnectionPool(Protocol):
    """What a connection tells its pool (``upstream_pool.UpstreamPool``, which imports this):
    reusable, gone, or a request whose timeouts the pool's ticker must check."""

    def release(self, conn: UpstreamConnection) -> None: ...

    def forget(self, conn: UpstreamConnection) -> None: ...

    def watch(self, timeout_s: float) -> None: ...


class Exchange:
    """One request/response on one connection. ``headers``: the response headers the relay
    uses (Content-Type/-Length/-Encoding, Transfer-Encoding, X-Request-Id), lower-case."""

    __slots__ = ("body", "chunked", "content_type", "done", "head", "headers", "sink", "status")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[int] = loop.create_future()
        self.done: asyncio.Future[bytes] = loop.create_future()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content_type = "application/octet-stream"
        self.chunked = True  # no Content-Length: the body is streamed
        self.body: list[bytes] = []
        self.sink: Sink | None = None


_BODYLESS = frozenset((204, 304))  # answers that never have a body (RFC 9110 6.4.1)


def _fail(
    fut: asyncio.Future[object] | asyncio.Future[int] | asyncio.Future[bytes], err: BaseException
) -> None:
    if not fut.done():
        fut.set_exception(err)
        fut.exception()  # mark retrieved: the awaiting side may be gone (cancelled)


# An answer's status line and headers at most (httptools sets no bound, and every byte restarts
# the read timeout: a head that never ends was held whole until the total timeout).
MAX_ANSWER_HEAD_BYTES = 64 << 10


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, pool: ConnectionPool, addr: Addr) -> None:
        self.pool = pool
        self.addr = addr
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # kept once known (start)
        self.exchange: Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self._last_data = 0.0
        self._deadline = 0.0
        self._read_timeout_s = 0.0
        self._paused = False  # the client takes the answer slower than the instance sends it
        self._head_bytes = 0  # read while the answer's head was not complete
        self._stray = False  # bytes beyond the answer: the connection is never reused

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._last_data = monotonic()
        ex = self.exchange
        if ex is None:  # an answer nobody asked for (a second one): never reuse
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._broken(UpstreamClosedError(f"malformed answer from {self.addr}: {err}"))
        except httptools.HttpParserUpgrade:  # not an HttpParserError; never asked for
            self._broken(UpstreamClosedError(f"unrequested protocol switch from {self.addr}"))
        if not ex.status and self.exchange is ex:  # its head still not complete: bounded
            self._head_bytes += len(data)
            if self._head_bytes > MAX_ANSWER_HEAD_BYTES:
                self._broken(UpstreamClosedError(f"answer head over 64 KiB from {self.addr}"))
                return
        if ex.sink is not None:
            ex.sink.flush()
        if self._stray:  # the same read went on past the answer: the next one would get it
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        ex = self.exchange
        if ex is None:
            return
        if exc is None and ex.status and _close_delimited(ex.headers):
            self.on_message_complete()  # RFC 9112 6.3: the body ends where the connection does
        else:
            self._broken(UpstreamClosedError(f"connection to {self.addr} lost: {exc!r}"))

    def pause_reading(self, paused: bool) -> None:
        """Back-pressure from the client side of a relay. While paused the read timeout does
        not run (the instance is not the one that is slow); the total timeout does."""
        self._paused = paused
        if not paused:
            self._last_data = monotonic()
        if self.transport is not None and not self.closed:
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # ---- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.exchange is None:  # a second answer in the read that ended the first
            self._stray = True

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        key = _KEPT_HEADERS.get(lower)  # only what the relay needs is decoded
        if key is None:
            if not lower.startswith(_RELAYED_PREFIXES):
                return
            key = lower.decode("latin-1")
        ex = self.exchange
        if ex is not None:
            ex.headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        ex = self.exchange
        if ex is None:
            return
        status = self.parser.get_status_code()
        if status < 200:  # interim (100 Continue, 103 Early Hints): the answer follows
            ex.headers.clear()
            return
        ex.status = status
        ex.content_type = ex.headers.get("content-type", ex.content_type)
        # 204 and 304 have no body whatever their headers say: relayed whole, not streamed
        ex.chunked = "content-length" not in ex.headers and status not in _BODYLESS
        if ex.sink is not None:
            ex.sink.head(ex)
        if not ex.head.done():
            ex.head.set_result(ex.status)

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        if ex is not None:
            if ex.sink is not None:
                ex.sink.data(body)
            else:
                ex.body.append(body)

    def on_message_complete(self) -> None:
        ex = self.exchange
        if ex is None or not ex.status:  # not an answer yet: an interim 1xx (or none at all)
            return
        self.exchange = None
        if ex.sink is not None:
            ex.sink.end(ex)  # the client has its answer before anyone wakes up
        if not ex.head.done():
            ex.head.set_result(ex.status)
        if not ex.done.done():
            ex.done.set_result(b"".join(ex.body))
        if self._paused and not self.closed and self.transport is not None:
            self._paused = False  # the client fell behind at the end: idle, the pooled
            self.transport.resume_reading()  # connection must see the instance close it
        if self.parser.should_keep_alive():
            self.pool.release(self)
        else:
            self.close()

    # ---- exchanges -----------------------------------------------------------------------

    def start(
        self,
        request: bytes,
        read_timeout_s: float,
        total_timeout_s: float,
        sink: Sink | None = None,
    ) -> Exchange:
        """Send ``request``; the exchange fails with ``UpstreamTimeout`` if no byte arrives for
        ``read_timeout_s`` or it lasts over ``total_timeout_s`` (checked by the pool's ticker).
        Without a ``sink`` the body is collected and ``done`` gives it."""
        assert self.transport is not None
        if self._paused:  # the last answer's client fell behind as it ended
            self._paused = False
            self.transport.resume_reading()
        # the loop kept: get_running_loop() is a getpid() call on 3.11 (as in ServerConnection)
        loop = self._loop = self._loop or asyncio.get_running_loop()
        ex = Exchange(loop)
        ex.sink = sink
        self.exchange = ex
        self._head_bytes = 0
        now = monotonic()
        self._last_data = now
        self._deadline = now + total_timeout_s
        self._read_timeout_s = read_timeout_s
        self.pool.watch(min(read_timeout_s, total_timeout_s))
        self.transport.write(request)
        return ex

    def check_timeout(self, now: float) -> None:
        if self.exchange is None:
            return
        if now >= self._deadline or (
            not self._paused and now - self._last_data >= self._read_timeout_s
        ):
            self._broken(UpstreamTimeout(f"instance at {self.addr} timed out"))

    def _broken(self, err: Exception) -> None:
        ex, self.exchange = self.exchange, None
        if ex is not None:
            _fail(ex.head, err)
            _fail(ex.done, err)
        self.close()

    def abort(self) -> None:
        """Drop the exchange in progress (the client left): the instance sees a reset."""
        self.exchange = None
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self.pool.forget(self)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self.pool.forget(self)


def _close_delimited(headers: dict[str, str]) -> bool:
    """A response body framed by neither Content-Length nor chunked coding."""
    return (
        "content-length" not in headers
        and "chunked" not in headers.get("transfer-encoding", "").lower()
    )
