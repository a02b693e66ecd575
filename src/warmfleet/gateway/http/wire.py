"""The gateway's HTTP/1.1 server connection: an asyncio protocol over the httptools (llhttp)
parser (why not a framework: ``docs/gateway.md``, 4x the CPU on the same work). Keep-alive,
pipelined requests answered in order, ``Expect: 100-continue``, chunked request bodies, limits
(413 body, 431 head, 408 slow senders, the server's body budget, in which each piece of a body
counts ``PIECE_BYTES`` more), malformed requests (400), idle timeouts, cancellation of the
handler on disconnect, back-pressure, graceful shutdown; ``answers.AnswerWriter`` answers.

A handler gets a :class:`Request` whose body has been read in full and returns a
:class:`Response`, or ``None`` after streaming its answer through ``request.conn``. The module
knows nothing of warmfleet: the error envelope comes from the ``error`` factory it is given.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from time import monotonic, perf_counter
from typing import Protocol, cast

import httptools

from warmfleet.gateway.http.access_log import CLIENT_CLOSED, AccessLog
from warmfleet.gateway.http.answers import AnswerWriter
from warmfleet.gateway.http.messages import ErrorFactory, Handler, Reject, Request, ServerLimits

log = logging.getLogger(__name__)
PIECE_BYTES = 48  # a bytes object and its list slot: 2-byte chunks were ~20x their data


class ConnectionOwner(Protocol):
    """What a connection uses of its server (``listener.HttpServer``, which imports this)."""

    limits: ServerLimits
    handler: Handler
    error: ErrorFactory
    access_log: AccessLog | None
    connections: set[ServerConnection]
    held: deque[ServerConnection]  # not read while over the body budget
    buffered_body_bytes: int

    def admit(self, conn: ServerConnection) -> bool: ...
    def release_held(self) -> None: ...


class ServerConnection(AnswerWriter, asyncio.Protocol):
    """One client connection: parses requests, runs the handler of each in turn, writes answers
    (``AnswerWriter``: streaming handlers use ``start_stream``, ``send``, ``end_stream``)."""

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.limits = server.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # kept once known (on_message_complete)
        self.closed = False
        self.writable: asyncio.Future[None] | None = None
        self.on_pause: Callable[[bool], None] | None = None  # a relay's back-pressure hook
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._reading = False
        self._began = 0.0  # when the request being read started arriving
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._idle_since = monotonic()
        self._chunked_out = False  # a streamed answer is open (chunked, or raw below)
        self._raw_out = False  # ... its body goes out unframed (a declared length, HTTP/1.0)
        self._answered: tuple[int, dict[str, str] | None] = (0, None)  # status, headers sent
        self._continue_due = False
        self._current: Request | None = None  # the request being answered
        self._head_open = False  # the request being read has not finished its head yet
        self._fed = 0  # bytes of that request counted so far (-1: it began in this read)
        self._head_size = 0  # its request line and headers parsed so far, in bytes
        self._counted = 0  # its body bytes in the server's budget (``buffered_body_bytes``)
        self._held = False  # not read while the server is over that budget
        self._failure: tuple[int, str] | None = None  # rejected behind requests in progress
        self._stalled_since = 0.0  # when the client stopped taking our bytes
        self._close_by = 0.0  # closed: dropped at this time if the client has not gone yet

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.server.admit(self):  # refused at once: nothing of it is read
            answer = self.server.error(503, "the gateway holds its maximum of client connections")
            self.write_response(answer, keep_alive=False)
            self.closed = True
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._failure is not None:
            return  # the parser has failed; the answers before the rejected request are due
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as err:
            cause = err.__cause__ or err.__context__
            if isinstance(cause, Reject):
                self._fail(cause.status, str(cause))
            else:
                self._fail(400, f"malformed HTTP request: {err}")
        else:
            if self._reading:  # a request is still incomplete after this read
                self._count_overhead(len(data))

    def _count_overhead(self, size: int) -> None:
        """Bound what a request sends beyond its body data: its head (llhttp has no limit;
        httptools copies a growing header value at every read), chunk framing and trailers.
        The read in which a request begins counts its body and the head parsed so far; the
        parser's callbacks count the head too (``_add_head``): a head over the limit is
        refused whatever the read boundaries."""
        fed = self._fed
        fed = fed + size if fed >= 0 else self._size + self._head_size
        self._fed = fed
        extra = fed - self._size
        limits = self.limits
        if self._head_open:
            if extra > limits.max_head_bytes:
                self._fail(431, f"request head over the limit of {limits.max_head_bytes} bytes")
        elif extra > limits.max_head_bytes + limits.max_body_bytes:
            self._fail(431, "request head, chunk framing and trailers over the limit")

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        self.closed = True
        self.server.connections.discard(self)
        if self._task is not None:
            self._task.cancel()  # the handler stops; the upstream request is cancelled with it
        if self.writable is not None and not self.writable.done():
            self.writable.set_exception(ConnectionResetError("client disconnected"))
            self.writable.exception()  # retrieved: the waiting handler may be cancelled first
        self._release()

    def _release(self) -> None:
        """Drop what a closed connection holds: its bodies and the references that form cycles
        (connection <-> parser, connection <-> request), so reference counting frees it at once
        (``serve`` runs the cycle collector rarely: a rejected 8 MB body once stayed minutes)."""
        self._body = []
        self._uncount()
        self._size = 0
        self._headers = {}
        self._pending.clear()
        self._current = None
        self.on_pause = None
        self.parser = httptools.HttpRequestParser(None)  # holds no reference back

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = asyncio.get_running_loop().create_future()
            self._stalled_since = monotonic()
        if self.on_pause is not None:
            self.on_pause(True)

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        if self.on_pause is not None:
            self.on_pause(False)

    # ---- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reading = True
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._began = monotonic()
        self._head_open = True
        self._fed = -1
        self._head_size = 0

    def _add_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.limits.max_head_bytes:
            raise Reject(431, f"request head over the limit of {self.limits.max_head_bytes} bytes")

    def on_url(self, url: bytes) -> None:
        self._add_head(len(url) + 16)  # with the method and "HTTP/1.1\r\n"
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._head_open:  # a chunked body's trailer: never a header of the request
            return
        size = self._head_size + len(name) + len(value) + 4  # ": " and CRLF
        self._head_size = size
        if size > self.limits.max_head_bytes:  # inline: this runs for every header
            self._add_head(0)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self._head_open = False
        if self.parser.should_upgrade():
            raise Reject(400, "protocol upgrades are not supported")
        coding = self._headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # e.g. "gzip, chunked": the body would be relayed still encoded (RFC 9112 6.1)
            raise Reject(400, f"transfer coding {coding!r} is not supported (only chunked)")
        declared = self._headers.get("content-length")
        limit = self.limits.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Reject.too_large(limit, int(declared))
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport:
            if self._task is None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            else:  # after the answer to the request in progress: responses stay in order
                self._continue_due = True

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._size += size
        limits = self.limits
        if self._size > limits.max_body_bytes:
            raise Reject.too_large(limits.max_body_bytes, None)
        self._body.append(body)
        self._counted += size + PIECE_BYTES
        server = self.server
        server.buffered_body_bytes += size + PIECE_BYTES
        if server.buffered_body_bytes > limits.max_buffered_body_bytes and not self._held:
            self._hold()

    def _hold(self) -> None:
        """Stop reading until the bodies being received fit the budget again: many clients
        sending large bodies at once wait in their socket buffers, not in this process."""
        if self.transport is not None and not self.closed:
            self._held = True
            self.transport.pause_reading()
            self.server.held.append(self)

    def unhold(self) -> None:
        if self._held:
            self._held = False
            if self.transport is not None and not self.closed and self._task is None:
                self.transport.resume_reading()

    def _uncount(self) -> None:
        """The body being received is complete, rejected or dropped: out of the budget."""
        server = self.server
        server.buffered_body_bytes -= self._counted
        self._counted = 0
        if server.held:
            server.release_held()

    def on_message_complete(self) -> None:
        self._reading = False
        if self._counted:
            self._uncount()
        path, _, query = self._url.decode("latin-1").partition("?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self.parser.get_method().decode("latin-1")
        request = Request(
            self,
            method,
            path,
            query=query,
            headers=self._headers,
            body=body,
            keep_alive=self.parser.should_keep_alive(),
            http10=self.parser.get_http_version() == "1.0",
        )
        if self._task is None:  # the loop kept: get_running_loop() is a getpid() call on 3.11
            loop = self._loop = self._loop or asyncio.get_running_loop()
            self._task = loop.create_task(self._serve(request))
        else:
            self._pending.append(request)
            if self.transport is not None:
                self.transport.pause_reading()

    # ---- serving -------------------------------------------------------------------------

    async def _serve(self, request: Request | None) -> None:
        while request is not None:
            self._current = request
            t_start = perf_counter() if self.server.access_log is not None else 0.0
            try:
                response = await self.server.handler(request)
            except asyncio.CancelledError:
                self._log(request, CLIENT_CLOSED, t_start)
                self._task = None
                return
            except Exception:  # a bug must not take the connection's other requests down
                log.exception("handler failed for %s %s", request.method, request.path)
                if self._chunked_out:  # mid-stream: a 500 can no longer be framed; cut it
                    self._log(request, 500, t_start)
                    self._task = None
                    if self.transport is not None:
                        self.transport.abort()
                    return
                response = self.server.error(500, "internal gateway error")
            if self.closed:
                self._log(request, CLIENT_CLOSED, t_start)
                self._task = None
                return
            if response is not None:
                head_only = request.method == "HEAD"
                self.write_response(response, request.keep_alive, request.http10, head_only)
            self._log(request, self._answered[0], t_start)
            self._current = None  # the answered request (and its body) is freed now
            if not request.keep_alive:
                self.close()
                self._task = None
                return
            writable = self.writable
            if writable is not None and not writable.done():
                # The client reads slower than it asks: its next request waits (else a client
                # that pipelines without reading grows the write buffer without bound).
                try:
                    await writable
                except (asyncio.CancelledError, ConnectionError):
                    self._task = None
                    return
            request = self._pending.popleft() if self._pending else None
        self._task = None
        self._idle_since = monotonic()
        if self._failure is not None:  # a request rejected behind the ones just answered
            self._fail(*self._failure)
            return
        if self._reading:
            self._began = self._idle_since  # its clock starts once the connection is its own
        if self.transport is not None and not self.closed:
            if self._continue_due and self._reading:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._continue_due = False
            if not self._held:  # (held: the body budget resumes it)
                self.transport.resume_reading()

    def _log(self, request: Request, status: int, t_start: float) -> None:
        """The request's access-log line (``spec.access_log``), if on."""
        access = self.server.access_log
        if access is not None and t_start:  # 0: it was off when the request began
            access.record(request, status, self._answered[1], perf_counter() - t_start)
        self._answered = (0, None)

    @property
    def idle(self) -> bool:
        """Open between requests: nothing being read or answered."""
        return self._task is None and not self._reading

    @property
    def idle_since(self) -> float:
        return self._idle_since

    @property
    def busy(self) -> bool:
        """A request is being answered (or waits for the client to take its answer)."""
        return self._task is not None

    # ---- timeouts and rejections ---------------------------------------------------------

    def check_timers(self, now: float) -> None:
        """Called by the server's ticker: 408 for a request not received in time, close after
        ``keepalive_timeout_s`` idle. (One ticker for all connections: a timer per request
        costs the gateway ~10 % of its CPU.)"""
        limits = self.limits
        if self.closed:  # still flushing to, or draining, a client that has not gone
            if now >= self._close_by and self.transport is not None:
                self.transport.abort()
            return
        if self.writable is not None and not self.writable.done():
            # An answer waits for a client that reads nothing: it may be gone for good
            # without a FIN; drop it rather than hold its buffer forever.
            if now - self._stalled_since >= limits.keepalive_timeout_s and self.transport:
                self.transport.abort()
            return
        if self._reading:
            # While an earlier pipelined request is answered, the next one's clock waits (a 408
            # now would close the connection under the answer in progress).
            if self._task is None and now - self._began >= limits.body_read_timeout_s:
                self._fail(408, f"request not received within {limits.body_read_timeout_s} s")
        elif self._task is None and now - self._idle_since >= limits.keepalive_timeout_s:
            self.close()

    def _fail(self, status: int, message: str) -> None:
        """Answer a request the parser or a limit rejected, then close: the rest of the
        connection's bytes can no longer be framed. Requests received before it are answered
        first (in order), so this waits while one is in progress."""
        if self.closed:
            return
        self._body = []  # the rejected request's body is never used
        self._uncount()
        if self._task is not None:
            if self._failure is None:
                self._failure = (status, message)
            if self.transport is not None:
                self.transport.pause_reading()
            return
        head = self._reading and bool(self._url) and self.parser.get_method() == b"HEAD"
        self.write_response(self.server.error(status, message), False, False, head)
        self._linger()
