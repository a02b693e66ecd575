"""The HTTP layer on raw sockets, after the request is read: a handler that raises (before or
mid-stream, alone or in a pipeline), streamed answers and the next request on the connection,
a client that disconnects (its handler is cancelled), the keep-alive idle timeout, and a
graceful stop (idle connections closed, requests in flight finished)."""

from __future__ import annotations

import asyncio
import time

import pytest
from wire_support import (
    LIMIT,
    WAIT_S,
    assert_envelope,
    client,
    echo,
    get,
    read_answer,
    read_to_eof,
    read_until_closed,
    serving,
)

from support.waiting import wait_until
from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.listener import HttpServer
from warmfleet.gateway.http.messages import Request, Response, ServerLimits

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
