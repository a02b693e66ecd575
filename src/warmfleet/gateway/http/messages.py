"""HTTP messages of the gateway's server (``wire``): requests, responses, the head encoder.

Kept apart from the protocol so handlers, routes and error mapping depend on plain data types,
not on the connection machinery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Protocol

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}

# The response headers that say which instance answered and why it was chosen (the routing reason).
INSTANCE_HEADER = "x-warmfleet-instance"
REASON_HEADER = "x-warmfleet-reason"


class ClientConnection(Protocol):
    """The connection a request came on, as its handler sees it (``wire.ServerConnection`` is
    the one implementation; declared here so these messages do not import the protocol):
    answer it whole or stream the answer, hook its back-pressure, see whether it is gone."""

    transport: asyncio.Transport | None
    closed: bool
    on_pause: Callable[[bool], None] | None  # a relay's back-pressure hook

    def write_response(
        self,
        response: Response,
        keep_alive: bool = True,
        http10: bool = False,
        head_only: bool = False,
        length: int = -1,
    ) -> None: ...

    def start_stream(
        self,
        status: int,
        content_type: str,
        headers: dict[str, str],
        first: bytes,
        *,
        end: bool = False,
        length: int | None = None,
    ) -> None: ...

    def send(self, data: bytes, *, end: bool = False) -> None: ...

    def end_stream(self) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class Request:
    """One parsed request; ``headers`` has lower-case names (repeated headers joined by ", ")."""

    __slots__ = (
        "body",
        "conn",
        "headers",
        "http10",
        "keep_alive",
        "match_info",
        "method",
        "path",
        "query",
    )

    def __init__(
        self,
        conn: ClientConnection,
        method: str,
        path: str,
        *,
        query: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
        http10: bool = False,
    ) -> None:
        self.conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10  # an HTTP/1.0 client: no chunked coding, keep-alive only if asked
        self.match_info: dict[str, str] = {}


class Response:
    """A complete response. ``headers`` excludes Content-Type/Length (given separately)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


Handler = Callable[[Request], Awaitable[Response | None]]
# Builds the answer to a request the HTTP layer itself rejects: (status, message) -> response.
ErrorFactory = Callable[[int, str], Response]


def head_bytes(
    status: int, content_type: str, headers: dict[str, str] | None, tail: bytes
) -> bytes:
    """Status line and headers; ``tail`` ends the head (framing headers and the blank line)."""
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()]) if headers else ""
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type.encode("latin-1"),
        lines.encode("latin-1"),
        tail,
    )


class ServerLimits:
    """``max_head_bytes`` bounds a request's head (request line and headers) and, with
    ``max_body_bytes``, what a chunked body adds beyond its data (chunk framing, trailers);
    ``keepalive_timeout_s`` is also how long a client may leave an answer unread;
    ``max_buffered_body_bytes`` bounds the bodies of all connections still being received."""

    __slots__ = (
        "body_read_timeout_s",
        "keepalive_timeout_s",
        "max_body_bytes",
        "max_buffered_body_bytes",
        "max_head_bytes",
    )

    def __init__(
        self,
        max_body_bytes: int,
        body_read_timeout_s: float,
        keepalive_timeout_s: float = 75.0,
        max_head_bytes: int = 64 * 1024,
        max_buffered_body_bytes: int = 32 << 20,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.max_buffered_body_bytes = max_buffered_body_bytes
        self.body_read_timeout_s = body_read_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.max_head_bytes = max_head_bytes


class Reject(Exception):
    """A request the parser or a limit rejects: answered with ``status`` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def too_large(cls, limit: int, declared: int | None) -> Reject:
        what = f"request body of {declared} bytes" if declared is not None else "request body"
        return cls(413, f"{what} exceeds the limit of {limit} bytes")
