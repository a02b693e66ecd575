"""The HTTP layer on raw sockets: ``listener.HttpServer`` and ``wire.ServerConnection``
(keep-alive, pipelining, 100-continue, chunked bodies, ``Connection: close`` and HTTP/1.0, then
the limits and rejections: 413, 408, 400, upgrades) and the full gateway on a raw socket
(pipelined chats beside HTTP errors, a reloaded body limit)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from gateway_support import MODEL, backends_running, gateway_config, gateway_running
from wire_support import (
    LIMIT,
    WAIT_S,
    assert_envelope,
    assert_refused_and_closed,
    client,
    echo,
    get,
    post,
    read_answer,
    read_to_eof,
    serving,
)

from warmfleet.gateway.http.messages import Request, Response

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
