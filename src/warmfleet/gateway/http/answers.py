"""Writing answers on a client connection: whole responses, chunked streams, streams of a
declared length or to an HTTP/1.0 client (unframed), and closing after an answer (flushed, or
lingering after an error answer). A mixin of ``wire.ServerConnection``, kept apart so the
protocol's reading side and its writing side are each a readable size; it uses only the
connection attributes declared below."""

from __future__ import annotations

import asyncio
from time import monotonic

from warmfleet.gateway.http.messages import Request, Response, ServerLimits, head_bytes

_BODYLESS = frozenset((204, 304))
# After an error answer the connection stops reading requests but keeps draining the client's
# bytes this long (until the client closes): closing with unread input makes the kernel send
# a reset, which can destroy the answer before the client has read it.
LINGER_S = 2.0


class AnswerWriter:
    """The writing half of a client connection (``wire.ServerConnection``)."""

    transport: asyncio.Transport | None
    limits: ServerLimits
    closed: bool
    _close_by: float  # closed: dropped at this time if the client has not gone yet
    _failure: tuple[int, str] | None  # rejected behind requests in progress
    writable: asyncio.Future[None] | None
    _current: Request | None  # the request being answered
    _answered: tuple[int, dict[str, str] | None]  # status, headers sent
    _chunked_out: bool  # a streamed answer is open (chunked, or raw below)
    _raw_out: bool  # ... its body goes out unframed (a declared length, HTTP/1.0)

    def write_response(
        self,
        response: Response,
        keep_alive: bool = True,
        http10: bool = False,
        head_only: bool = False,
        length: int = -1,
    ) -> None:
        """``head_only``: the answer to a HEAD request (its length, not its body); ``length``:
        that length when the body was not kept (-1: the body's)."""
        if self.transport is None or self.closed:
            return
        body = response.body
        if not keep_alive:
            connection = b"Connection: close\r\n"
        else:
            connection = b"Connection: keep-alive\r\n" if http10 else b""
        status = response.status
        self._answered = (status, response.headers)
        if status in _BODYLESS:  # no body and no length (RFC 9110 8.6, 15.4.5)
            tail = connection + b"\r\n"
            body = b""
        else:
            size = len(body) if length < 0 else length
            tail = b"Content-Length: %d\r\n%s\r\n" % (size, connection)
            if head_only:
                body = b""
        head = head_bytes(status, response.content_type, response.headers, tail)
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)

    def start_stream(
        self,
        status: int,
        content_type: str,
        headers: dict[str, str],
        first: bytes,
        *,
        end: bool = False,
        length: int | None = None,
    ) -> None:
        """Send the head of a chunked response, with its first bytes; ``end``: and the
        last-chunk marker, all in one write. (An HTTP/1.0 client gets the body unframed, ended
        by closing the connection.) ``length``: the body's declared length instead: sent as
        ``Content-Length`` and the body unframed (a large answer relayed as it arrives)."""
        assert self.transport is not None
        self._chunked_out = not end
        self._answered = (status, headers)
        current = self._current
        http10 = current is not None and current.http10
        if length is not None or http10:
            self._raw_out = not end
            tail = b"Content-Length: %d\r\n" % length if length is not None else b""
            if http10:
                assert current is not None
                current.keep_alive = False
                tail += b"Connection: close\r\n"
            self.transport.write(head_bytes(status, content_type, headers, tail + b"\r\n") + first)
            return
        head = head_bytes(status, content_type, headers, b"Transfer-Encoding: chunked\r\n\r\n")
        out = head + b"%x\r\n%s\r\n" % (len(first), first) if first else head
        self.transport.write(out + b"0\r\n\r\n" if end else out)

    def send(self, data: bytes, *, end: bool = False) -> None:
        """One chunk of a chunked response; ``end``: and the last-chunk marker, in one write.
        (Unframed: the data as it is; the declared length or the close ends the body.)"""
        if self._raw_out:
            if data and self.transport is not None and not self.closed:
                self.transport.write(data)
            if end:
                self._chunked_out = self._raw_out = False
            return
        if self.transport is not None and not self.closed:
            if data:
                chunk = b"%x\r\n%s\r\n" % (len(data), data)
                self.transport.write(chunk + b"0\r\n\r\n" if end else chunk)
            elif end:
                self.transport.write(b"0\r\n\r\n")
        if end:
            self._chunked_out = False

    def end_stream(self) -> None:
        self.send(b"", end=True)

    async def drain(self) -> None:
        """Wait while the client reads slower than the upstream writes."""
        if self.writable is not None and not self.writable.done():
            await self.writable

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self._close_by = monotonic() + self.limits.keepalive_timeout_s
            self.transport.close()  # flushes first: connection_lost once the client has read

    def _linger(self) -> None:
        """Close after an error answer without losing it (``LINGER_S``): send FIN after the
        answer, discard what the client still sends, close when it closes or the time is up."""
        transport = self.transport
        if transport is None or self.closed:
            return
        if not transport.can_write_eof():
            self.close()
            return
        self.closed = True
        self._close_by = monotonic() + LINGER_S
        if self._failure is None:
            self._failure = (0, "")  # data_received discards from now on
        transport.write_eof()
        transport.resume_reading()
