"""Raw-socket helpers for the HTTP-layer tests (``test_gateway_wire*.py``,
``test_gateway_upstream_pool.py``, ``test_gateway_hostile_wire.py``): a client that writes
requests byte for byte and reads answers off the connection, a ``listener.HttpServer`` with a tiny
handler, the error-envelope checks, and a scripted raw upstream with an ``UpstreamPool`` in front
of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.listener import HttpServer
from warmfleet.gateway.http.messages import Request, Response, ServerLimits
from warmfleet.gateway.http.upstream import Addr
from warmfleet.gateway.http.upstream_pool import UpstreamPool

LIMIT = 64  # max_body_bytes of the servers below
WAIT_S = 1.5  # liveness bound for a single read in these tests (never a timing assertion)


# ---- client-side helpers ----------------------------------------------------------------------


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One response (or interim 1xx) off a raw connection; Content-Length or chunked framing."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    lines = head.decode("latin-1").split("\r\n")
    version, status, _ = lines[0].split(" ", 2)
    assert version == "HTTP/1.1"
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    code = int(status)
    if code < 200:
        return Answer(code, headers, b"")
    if headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int(await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S), 16)
            data = await asyncio.wait_for(reader.readexactly(size + 2), WAIT_S)
            if size == 0:
                break
            parts.append(data[:-2])
        return Answer(code, headers, b"".join(parts))
    length = int(headers.get("content-length", "0"))
    return Answer(code, headers, await asyncio.wait_for(reader.readexactly(length), WAIT_S))


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (fails the test if it does not close)."""
    return await asyncio.wait_for(reader.read(), WAIT_S)


async def read_until_closed(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """Everything the server sends, and whether it then closed (EOF or reset) within WAIT_S."""
    parts = []
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), WAIT_S):
            parts.append(chunk)
    except TimeoutError:
        return b"".join(parts), False
    except ConnectionResetError:
        pass
    return b"".join(parts), True


@asynccontextmanager
async def client(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def get(path: str, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: t", *extra, "", ""]
    return "\r\n".join(lines).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}", *extra, "", ""]
    return "\r\n".join(lines).encode() + body


# ---- a server with a tiny handler ---------------------------------------------------------------


async def echo(request: Request) -> Response:
    """Answers ``METHOD PATH BODY`` (the body as received)."""
    return Response(200, f"{request.method} {request.path} ".encode() + request.body, "text/plain")


@asynccontextmanager
async def serving(
    handler: Callable[[Request], Awaitable[Response | None]] = echo,
    *,
    max_body_bytes: int = LIMIT,
    body_read_timeout_s: float = 5.0,
    keepalive_timeout_s: float = 30.0,
) -> AsyncIterator[tuple[HttpServer, int]]:
    limits = ServerLimits(max_body_bytes, body_read_timeout_s, keepalive_timeout_s)
    server = HttpServer(handler, limits, plain_error)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.stop(grace_s=0.5)


def assert_envelope(answer: Answer, status: int) -> None:
    assert answer.status == status
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert isinstance(error, dict)
    assert error["code"] == status
    assert isinstance(error["message"], str)
    assert error["message"]
    assert set(error) == {"message", "type", "param", "code"}


async def assert_refused_and_closed(reader: asyncio.StreamReader, status: int) -> Answer:
    """The next answer is a ``status`` envelope that closes the connection, and it does."""
    answer = await read_answer(reader)
    assert_envelope(answer, status)
    assert answer.headers["connection"] == "close"
    assert await read_to_eof(reader) == b""
    return answer


# ---- upstream pool ------------------------------------------------------------------------------

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
REQ = b"GET /u HTTP/1.1\r\nHost: up\r\n\r\n"


async def answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive: answer each request with a two-byte body, until the client closes."""
    while True:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()


class Upstream:
    """A raw asyncio server on 127.0.0.1; every connection runs ``script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.accepted = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.server: asyncio.Server | None = None
        self.addr: Addr = ("127.0.0.1", 0, False)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.script(reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.addr = ("127.0.0.1", self.server.sockets[0].getsockname()[1], False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        if self.tasks:  # scripts end when the pool closes its side; cancel any that did not
            _, pending = await asyncio.wait(set(self.tasks), timeout=1.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.server.wait_closed()
        await asyncio.sleep(0)


@asynccontextmanager
async def pool_for(**kwargs: float) -> AsyncIterator[UpstreamPool]:
    pool = UpstreamPool(
        connect_timeout_s=float(kwargs.pop("connect_timeout_s", 1.0)),
        max_connections=int(kwargs.pop("max_connections", 0)),
        keepalive_s=float(kwargs.pop("keepalive_s", 60.0)),
    )
    assert not kwargs
    try:
        yield pool
    finally:
        pool.close()
        await asyncio.sleep(0)
