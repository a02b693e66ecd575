"""The HTTP layer on raw sockets: ``listener.HttpServer`` and ``wire.ServerConnection``
(keep-alive, pipelining, 100-continue, chunked bodies, limits, malformed requests, cancellation,
shutdown) and ``upstream.UpstreamPool`` (reuse, connection limit, timeouts, broken connections,
idle sweep)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from gateway_support import MODEL, backends_running, gateway_config, gateway_running

from support.waiting import wait_until
from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.listener import HttpServer
from warmfleet.gateway.http.messages import Request, Response, ServerLimits
from warmfleet.gateway.http.upstream import (
    Addr,
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamTimeout,
)
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


# ---- server: keep-alive, pipelining, 100-continue, chunked bodies --------------------------------


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    log: list[str] = []

    async def handler(request: Request) -> Response:
        log.append(f"start {request.path}")
        if request.path == "/slow":
            await asyncio.sleep(0.05)  # the later requests must still wait their turn
        log.append(f"end {request.path}")
        return await echo(request)

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/slow") + post("/b", b"bee") + get("/c"))
        answers = [await read_answer(reader) for _ in range(3)]
        assert [a.body for a in answers] == [b"GET /slow ", b"POST /b bee", b"GET /c "]
        assert all(a.status == 200 and "connection" not in a.headers for a in answers)
        assert log == ["start /slow", "end /slow", "start /b", "end /b", "start /c", "end /c"]
        # reading resumed after the pipeline drained: the same connection serves another one
        writer.write(get("/d"))
        assert (await read_answer(reader)).body == b"GET /d "


async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        body = b'{"x": 1}'
        writer.write(
            b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await read_answer(reader)  # the body has not been sent yet
        assert interim.status == 100
        writer.write(body)
        final = await read_answer(reader)
        assert (final.status, final.body) == (200, b"POST /e " + body)


async def test_100_continue_is_not_sent_ahead_of_an_earlier_pipelined_response() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: Request) -> Response:
        if request.path == "/first":
            started.set()
            await release.wait()
        return await echo(request)

    second = (
        b"POST /second HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
    )
    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/first") + second)  # both heads are parsed before /first is answered
        await asyncio.wait_for(started.wait(), WAIT_S)
        release.set()
        first = await read_answer(reader)
        assert (first.status, first.body) == (200, b"GET /first ")
        writer.write(b"abc")
        final = await read_answer(reader)
        if final.status == 100:  # sent now, in order: fine
            final = await read_answer(reader)
        assert (final.status, final.body) == (200, b"POST /second abc")


async def test_chunked_request_body_reaches_the_handler_whole() -> None:
    seen: list[Request] = []

    async def handler(request: Request) -> Response:
        seen.append(request)
        return await echo(request)

    head = b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    parts = [b"hello ", b"chunked ", b"world"]
    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(head)
        for part in parts:  # separate writes: the body arrives over several data_received
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, b"POST /c hello chunked world")
        assert len(seen) == 1
        assert seen[0].body == b"hello chunked world"
        assert seen[0].headers["transfer-encoding"] == "chunked"


async def test_http11_keeps_the_connection_alive_by_default() -> None:
    async with serving() as (server, port), client(port) as (reader, writer):
        for i in range(3):
            writer.write(get(f"/{i}"))
            answer = await read_answer(reader)
            assert answer.body == f"GET /{i} ".encode()
            assert "connection" not in answer.headers
        assert len(server.connections) == 1


@pytest.mark.parametrize(
    "request_bytes",
    [get("/bye", "Connection: close"), get("/bye", version="1.0")],
    ids=["connection-close", "http10"],
)
async def test_connection_close_is_announced_and_honoured(request_bytes: bytes) -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(request_bytes)
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, b"GET /bye ")
        assert answer.headers["connection"] == "close"
        assert await read_to_eof(reader) == b""


async def test_http10_with_keep_alive_stays_open() -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(get("/a", "Connection: keep-alive", version="1.0"))
        first = await read_answer(reader)
        assert first.body == b"GET /a "
        assert first.headers["connection"] == "keep-alive"  # else a 1.0 client would not reuse
        writer.write(get("/b", "Connection: keep-alive", version="1.0"))
        assert (await read_answer(reader)).body == b"GET /b "


async def test_http10_stream_is_unframed_and_ends_with_the_connection() -> None:
    """HTTP/1.0 has no chunked coding: a streamed answer goes out as is, ended by the close."""

    async def stream(request: Request) -> None:
        request.conn.start_stream(200, "text/event-stream", {}, b"data: 1\n\n")
        request.conn.send(b"data: 2\n\n")
        request.conn.end_stream()

    async with serving(stream) as (_, port), client(port) as (reader, writer):
        writer.write(get("/s", "Connection: keep-alive", version="1.0"))
        raw = await read_to_eof(reader)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head.lower()
        assert b"Connection: close" in head
        assert body == b"data: 1\n\ndata: 2\n\n"


# ---- server: limits and rejections ------------------------------------------------------------


async def test_declared_content_length_over_limit_is_413_and_closes() -> None:
    calls: list[Request] = []

    async def handler(request: Request) -> Response:
        calls.append(request)
        return await echo(request)

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        # only the head: the server must refuse on the declared length, not wait for the body
        writer.write(
            f"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: {LIMIT + 1}\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        answer = await read_answer(reader)  # a 413, never "100 Continue"
        assert_envelope(answer, 413)
        assert answer.headers["connection"] == "close"
        assert await read_to_eof(reader) == b""
        assert calls == []


async def test_body_at_the_limit_is_accepted() -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(post("/ok", b"x" * LIMIT))
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, b"POST /ok " + b"x" * LIMIT)


async def test_chunked_body_growing_over_limit_is_413_and_closes() -> None:
    calls: list[Request] = []

    async def handler(request: Request) -> Response:
        calls.append(request)
        return await echo(request)

    chunk = b"y" * (LIMIT // 2 + 1)
    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(b"POST /grow HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))  # under the limit so far
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))  # now over it
        await assert_refused_and_closed(reader, 413)
        assert calls == []


async def test_slow_body_is_408_and_closes() -> None:
    async with serving(body_read_timeout_s=0.2) as (_, port), client(port) as (reader, writer):
        writer.write(b"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        started = time.monotonic()
        answer = await read_answer(reader)
        assert time.monotonic() - started >= 0.15
        assert_envelope(answer, 408)
        assert await read_to_eof(reader) == b""


async def test_partial_pipelined_request_does_not_cut_the_answer_in_progress() -> None:
    """The next request's body deadline waits while an earlier request is answered: a 408
    then would close the connection under the answer in progress."""
    release = asyncio.Event()

    async def slow_first(request: Request) -> Response:
        if request.path == "/first":
            await release.wait()
        return await echo(request)

    async with (
        serving(slow_first, body_read_timeout_s=0.2) as (_, port),
        client(port) as (reader, writer),
    ):
        writer.write(
            get("/first") + b"POST /second HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab"
        )
        await asyncio.sleep(0.6)  # three deadlines pass while /first is still being answered
        release.set()
        assert (await read_answer(reader)).body == b"GET /first "
        writer.write(b"cd")  # the rest arrives within the deadline that starts now
        assert (await read_answer(reader)).body == b"POST /second abcd"


@pytest.mark.parametrize(
    "garbage",
    [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n", b"\x16\x03\x01\x02\x00"],
    ids=["request-line", "header", "tls-hello"],
)
async def test_malformed_request_is_400_envelope_and_closes(garbage: bytes) -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(garbage)
        await assert_refused_and_closed(reader, 400)


async def test_malformed_request_after_a_good_one_is_400() -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(get("/fine"))
        assert (await read_answer(reader)).status == 200
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        assert_envelope(await read_answer(reader), 400)
        assert await read_to_eof(reader) == b""


async def test_upgrade_request_is_refused_with_400() -> None:
    """Regression: llhttp completes an upgrade request before raising HttpParserUpgrade, so the
    request used to reach the handler (with its body skipped) and no 400 was written."""
    calls: list[Request] = []

    async def handler(request: Request) -> Response:
        calls.append(request)
        return await echo(request)

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/ws", "Upgrade: websocket", "Connection: Upgrade"))
        data = await read_to_eof(reader)
        assert data.startswith(b"HTTP/1.1 400 "), data
        assert b'"error"' in data
        assert calls == []


# ---- server: handler failures, disconnects, idle and shutdown ---------------------------------


async def test_handler_exception_is_500_envelope_and_the_connection_survives() -> None:
    async def handler(request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("handler bug")
        return await echo(request)

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/boom"))
        answer = await read_answer(reader)
        assert_envelope(answer, 500)
        assert "connection" not in answer.headers
        assert "handler bug" not in answer.body.decode()  # no internals leak to the client
        writer.write(get("/after"))
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, b"GET /after ")


async def test_handler_exception_in_a_pipeline_does_not_drop_later_requests() -> None:
    async def handler(request: Request) -> Response:
        if request.path == "/boom":
            raise ValueError("bug")
        return await echo(request)

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/a") + get("/boom") + get("/c"))
        answers = [await read_answer(reader) for _ in range(3)]
        assert [a.status for a in answers] == [200, 500, 200]
        assert answers[2].body == b"GET /c "


async def test_handler_failing_mid_stream_closes_instead_of_writing_a_500() -> None:
    """Regression: a 500 used to be written into the open chunked body (and the connection
    kept alive with its framing broken)."""

    async def handler(request: Request) -> Response | None:
        request.conn.start_stream(200, "text/plain", {}, b"partial")
        raise RuntimeError("bug after the head went out")

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/stream"))  # keep-alive: the server must still cut the connection
        data, closed = await read_until_closed(reader)
        assert closed, data
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"7\r\npartial\r\n" in data
        assert b"HTTP/1.1 500" not in data  # a second status line inside a chunked body
        assert not data.endswith(b"0\r\n\r\n")  # and the truncated body is not made to look whole


async def test_streamed_response_then_next_request_on_same_connection() -> None:
    async def handler(request: Request) -> Response | None:
        if request.path != "/stream":
            return await echo(request)
        conn = request.conn
        conn.start_stream(200, "text/event-stream", {"Cache-Control": "no-cache"}, b"data: 1\n\n")
        await asyncio.sleep(0)
        conn.send(b"data: 2\n\n")
        conn.end_stream()
        await conn.drain()
        return None

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/stream"))
        answer = await read_answer(reader)
        assert answer.headers["transfer-encoding"] == "chunked"
        assert answer.headers["cache-control"] == "no-cache"
        assert answer.body == b"data: 1\n\ndata: 2\n\n"
        writer.write(get("/next"))
        assert (await read_answer(reader)).body == b"GET /next "


async def test_stream_started_and_ended_at_once_is_one_write_then_keep_alive() -> None:
    """A stream whose whole answer is at hand (``end=True``) leaves in a single write, framed
    and terminated; the connection then serves the next request."""
    writes: list[bytes] = []

    async def handler(request: Request) -> Response | None:
        if request.path != "/stream":
            return await echo(request)
        conn = request.conn
        assert conn.transport is not None
        real_write = conn.transport.write

        def recording_write(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            real_write(data)

        conn.transport.write = recording_write  # type: ignore[method-assign]
        try:
            conn.start_stream(200, "text/event-stream", {}, b"data: 1\n\ndata: 2\n\n", end=True)
        finally:
            conn.transport.write = real_write  # type: ignore[method-assign]
        return None

    async with serving(handler) as (_, port), client(port) as (reader, writer):
        writer.write(get("/stream"))
        answer = await read_answer(reader)
        assert answer.headers["transfer-encoding"] == "chunked"
        assert answer.body == b"data: 1\n\ndata: 2\n\n"
        assert len(writes) == 1
        assert writes[0].endswith(b"\r\n0\r\n\r\n")
        writer.write(get("/next"))
        assert (await read_answer(reader)).body == b"GET /next "


async def test_client_disconnect_cancels_the_handler() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    finished = asyncio.Event()

    async def handler(request: Request) -> Response:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        finally:
            finished.set()
        return await echo(request)

    async with serving(handler) as (server, port):
        async with client(port) as (_, writer):
            writer.write(get("/wait"))
            await asyncio.wait_for(started.wait(), WAIT_S)
        # the client has gone: the handler is cancelled promptly, not after its 30 s sleep
        await asyncio.wait_for(cancelled.wait(), WAIT_S)
        assert finished.is_set()
        await wait_until(lambda: not server.connections, timeout_s=WAIT_S)


async def test_idle_keep_alive_connection_is_closed_after_the_timeout() -> None:
    async with (
        serving(keepalive_timeout_s=0.15) as (server, port),
        client(port) as (reader, writer),
    ):
        writer.write(get("/once"))
        assert (await read_answer(reader)).status == 200
        assert await read_to_eof(reader) == b""
        await wait_until(lambda: not server.connections, timeout_s=WAIT_S)


async def test_busy_connection_is_not_closed_by_the_idle_timeout() -> None:
    async def handler(request: Request) -> Response:
        await asyncio.sleep(0.4)  # longer than the keep-alive timeout
        return await echo(request)

    async with (
        serving(handler, keepalive_timeout_s=0.1) as (_, port),
        client(port) as (reader, writer),
    ):
        writer.write(get("/long"))
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, b"GET /long ")


async def test_stop_closes_idle_keep_alive_connections() -> None:
    limits = ServerLimits(LIMIT, 5.0, 30.0)
    server = HttpServer(echo, limits, plain_error)
    port = await server.start("127.0.0.1", 0)
    try:
        async with client(port) as (reader, writer), client(port) as (reader2, _):
            writer.write(get("/x"))
            assert (await read_answer(reader)).status == 200
            await wait_until(lambda: len(server.connections) == 2, timeout_s=WAIT_S)
            started = time.monotonic()
            await server.stop(grace_s=5.0)
            assert time.monotonic() - started < 1.0  # nothing in flight: no grace wait
            assert await read_to_eof(reader) == b""
            assert await read_to_eof(reader2) == b""
            assert not server.connections
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", port)
    finally:
        await server.stop(grace_s=0.1)


async def test_stop_lets_a_request_in_flight_finish() -> None:
    started = asyncio.Event()

    async def handler(request: Request) -> Response:
        started.set()
        await asyncio.sleep(0.1)
        return await echo(request)

    async with serving(handler) as (server, port), client(port) as (reader, writer):
        writer.write(get("/inflight"))
        await asyncio.wait_for(started.wait(), WAIT_S)
        await server.stop(grace_s=2.0)
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, b"GET /inflight ")
        assert await read_to_eof(reader) == b""


# ---- the full gateway on a raw socket -----------------------------------------------------------


async def test_gateway_pipelined_chat_and_http_errors() -> None:
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    ctype = "Content-Type: application/json"
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends, limits={"max_body_bytes": 4096})) as gw,
    ):
        async with client(gw.port) as (reader, writer):
            writer.write(
                post("/v1/chat/completions", chat, ctype)
                + get("/health")
                + post("/v1/chat/completions", chat, ctype)
            )
            answers = [await read_answer(reader) for _ in range(3)]
            assert [a.status for a in answers] == [200, 200, 200]
            assert answers[0].headers["x-warmfleet-instance"] == "a"
            assert answers[2].json()["choices"] == answers[0].json()["choices"]
        async with client(gw.port) as (reader, writer):
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5000\r\n\r\n")
            answer = await read_answer(reader)
            assert_envelope(answer, 413)
            assert answer.headers["x-warmfleet-reason"] == "rejected"
            assert await read_to_eof(reader) == b""
        async with client(gw.port) as (reader, writer):
            writer.write(b"\x00\x01garbage\r\n\r\n")
            assert_envelope(await read_answer(reader), 400)
            assert await read_to_eof(reader) == b""
        metrics = gw.gateway.metrics.render().decode()
        assert any("413" in line and "rejected" in line for line in metrics.splitlines())
        assert backends[0].stats.requests == 2


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


async def test_second_exchange_reuses_the_idle_connection() -> None:
    async with Upstream(answer_ok) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 1.0, 5.0)
        assert await ex.head == 200
        assert await ex.done == b"ok"
        assert not ex.chunked
        assert ex.content_type == "text/plain"
        assert list(pool.idle[up.addr]) == [conn]

        again = await pool.acquire(up.addr)
        assert again is conn
        assert len(pool.open) == 1
        ex = again.start(REQ, 1.0, 5.0)
        assert await ex.done == b"ok"
        assert up.accepted == 1


async def test_idle_connections_are_reused_most_recent_first() -> None:
    async with Upstream(answer_ok) as up, pool_for() as pool:
        first = await pool.acquire(up.addr)
        second = await pool.acquire(up.addr)
        assert first is not second
        for conn in (first, second):
            await conn.start(REQ, 1.0, 5.0).done
        assert await pool.acquire(up.addr) is second
        assert await pool.acquire(up.addr) is first


async def test_max_connections_makes_a_second_acquire_wait_for_the_release() -> None:
    async with Upstream(answer_ok) as up, pool_for(max_connections=1) as pool:
        conn = await pool.acquire(up.addr)
        waiting = asyncio.create_task(pool.acquire(up.addr))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert len(pool.open) == 1
        await conn.start(REQ, 1.0, 5.0).done  # completes -> released -> handed to the waiter
        assert await asyncio.wait_for(waiting, WAIT_S) is conn
        assert up.accepted == 1


async def test_max_connections_waiter_gets_a_slot_when_a_connection_breaks() -> None:
    async with Upstream(answer_ok) as up, pool_for(max_connections=1) as pool:
        conn = await pool.acquire(up.addr)
        waiting = asyncio.create_task(pool.acquire(up.addr))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        conn.close()  # gone, not released: the slot frees and the waiter connects anew
        fresh = await asyncio.wait_for(waiting, WAIT_S)
        assert fresh is not conn
        assert pool.open == {fresh}


async def test_max_connections_evicts_an_idle_connection_to_another_address() -> None:
    async with (
        Upstream(answer_ok) as one,
        Upstream(answer_ok) as two,
        pool_for(max_connections=1) as pool,
    ):
        conn = await pool.acquire(one.addr)
        await conn.start(REQ, 1.0, 5.0).done  # idle now
        other = await asyncio.wait_for(pool.acquire(two.addr), WAIT_S)
        assert conn.closed
        assert pool.open == {other}


async def test_max_connections_holds_for_concurrent_acquires() -> None:
    """Regression: the limit used to count established connections only, so acquires still
    connecting all passed the check and opened more than max_connections."""
    async with Upstream(answer_ok) as up, pool_for(max_connections=1) as pool:
        tasks = [asyncio.create_task(pool.acquire(up.addr)) for _ in range(2)]
        await asyncio.wait(tasks, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.05)  # time enough for a second connect, if one were started
        try:
            assert [t.done() for t in tasks].count(True) == 1
            assert len(pool.open) == 1
            assert up.accepted == 1
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_cancelled_waiter_passes_its_wake_up_on() -> None:
    """Regression: a waiter woken by a release but cancelled before it ran used to swallow the
    wake-up, leaving the next waiter asleep forever next to an idle connection."""
    async with Upstream(answer_ok) as up, pool_for(max_connections=1) as pool:
        conn = await pool.acquire(up.addr)
        first = asyncio.create_task(pool.acquire(up.addr))
        second = asyncio.create_task(pool.acquire(up.addr))
        await asyncio.sleep(0.02)
        assert not first.done()
        assert not second.done()
        pool.release(conn)  # wakes `first` ...
        first.cancel()  # ... whose client leaves before it gets to run
        try:
            assert await asyncio.wait_for(second, 0.5) is conn
        finally:
            await asyncio.gather(first, second, return_exceptions=True)


async def test_read_timeout_when_the_instance_never_answers() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept, read, never answer; ends when the pool hangs up

    async with Upstream(silent) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        started = time.monotonic()
        ex = conn.start(REQ, 0.2, 10.0)
        with pytest.raises(UpstreamTimeout):
            await asyncio.wait_for(ex.head, WAIT_S)
        elapsed = time.monotonic() - started
        assert 0.15 <= elapsed < 1.0
        with pytest.raises(UpstreamTimeout):
            await ex.done
        assert conn.closed
        assert conn not in pool.open
        assert await pool.acquire(up.addr) is not conn  # never reused


async def test_total_timeout_while_bytes_keep_trickling() -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(100):
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
                await asyncio.sleep(0.03)

    async with Upstream(trickle) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        started = time.monotonic()
        ex = conn.start(REQ, 0.5, 0.3)  # each byte is in time, the exchange as a whole is not
        assert await ex.head == 200
        assert ex.chunked
        with pytest.raises(UpstreamTimeout):
            await asyncio.wait_for(ex.done, WAIT_S)
        assert 0.25 <= time.monotonic() - started < 1.0
        assert conn.closed


async def test_connect_refused_is_upstream_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
        port = sock.getsockname()[1]
        async with pool_for() as pool:
            with pytest.raises(UpstreamConnectError, match="failed"):
                await pool.acquire(("127.0.0.1", port, False))
            assert not pool.open


async def test_connection_closed_mid_body_is_upstream_closed_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"z" * 10)
        await writer.drain()
        # return: the connection closes with 90 bytes of the body missing

    async with Upstream(cut) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 2.0, 5.0)
        assert await ex.head == 200
        with pytest.raises(UpstreamClosedError):
            await asyncio.wait_for(ex.done, WAIT_S)
        assert conn.closed
        assert conn not in pool.open
        assert not [c for c in pool.idle.get(up.addr, ()) if not c.closed]


async def test_connection_closed_before_the_head_is_upstream_closed_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")

    async with Upstream(hang_up) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 2.0, 5.0)
        with pytest.raises(UpstreamClosedError):
            await asyncio.wait_for(ex.head, WAIT_S)
        with pytest.raises(UpstreamClosedError):
            await ex.done


async def test_malformed_answer_is_upstream_closed_error() -> None:
    async def nonsense(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with Upstream(nonsense) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 2.0, 5.0)
        with pytest.raises(UpstreamClosedError, match="malformed"):
            await asyncio.wait_for(ex.head, WAIT_S)
        assert conn.closed


async def test_connection_close_answer_is_not_pooled() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye")
        await writer.drain()
        await reader.read()

    async with Upstream(once) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        assert await conn.start(REQ, 2.0, 5.0).done == b"bye"
        assert conn.closed
        assert conn not in pool.open
        assert await pool.acquire(up.addr) is not conn


async def test_close_delimited_answer_ends_at_eof() -> None:
    """Regression: a body framed by neither Content-Length nor chunked coding ends at EOF
    (RFC 9112 6.3); that EOF used to be reported as UpstreamClosedError."""

    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nwhole body")
        await writer.drain()

    async with Upstream(close_delimited) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 2.0, 5.0)
        assert await ex.head == 200
        assert await asyncio.wait_for(ex.done, WAIT_S) == b"whole body"


async def test_sweep_closes_connections_idle_longer_than_keepalive() -> None:
    async with Upstream(answer_ok) as up, pool_for(keepalive_s=0.2) as pool:
        old, new, busy = [await pool.acquire(up.addr) for _ in range(3)]
        await old.start(REQ, 1.0, 5.0).done  # idle from now on
        await asyncio.sleep(0.3)  # `old` is now idle for longer than keepalive_s
        await new.start(REQ, 1.0, 5.0).done  # idle, but only just
        # `busy` stays checked out (open longer than keepalive_s, but never idle)
        pool.sweep()
        assert old.closed
        assert old not in pool.open
        assert not new.closed
        assert not busy.closed
        assert pool.open == {new, busy}
        assert list(pool.idle[up.addr]) == [new]
        assert await pool.acquire(up.addr) is new


async def test_reloaded_body_limit_applies_to_the_next_request() -> None:
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 3000}]})
    ctype = "Content-Type: application/json"
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends, limits={"max_body_bytes": 8192})) as gw,
        client(gw.port) as (reader, writer),
    ):
        writer.write(post("/v1/chat/completions", chat.encode(), ctype))
        assert (await read_answer(reader)).status == 200
        gw.gateway.apply(gateway_config(backends, limits={"max_body_bytes": 1024}), "test")
        writer.write(post("/v1/chat/completions", chat.encode(), ctype))
        assert_envelope(await read_answer(reader), 413)
