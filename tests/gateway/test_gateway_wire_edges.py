"""HTTP/1.1 edge cases of the gateway's own protocol layer: clients that do not read their
answers, oversized heads and trailers, pipelined requests after a bad one, HEAD, and interim or
bodiless answers from an instance (1xx, 101, 204, 304)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import pytest
from gateway_support import MODEL, gateway_running
from wire_support import (
    REQ,
    Upstream,
    assert_envelope,
    assert_refused_and_closed,
    client,
    echo,
    get,
    pool_for,
    post,
    read_answer,
    read_to_eof,
    serving,
)

from support.waiting import wait_until
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.messages import Request, Response
from warmfleet.gateway.http.routes import Routes
from warmfleet.gateway.http.upstream import UpstreamClosedError, UpstreamConnection

WAIT_S = 1.5

# ---- a client that sends requests but does not read the answers ------------------------------


def _flood(port: int, seconds: float) -> tuple[socket.socket, int]:
    """Pipeline small GETs for ``seconds`` without reading a byte (tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(0.05)
    batch = get("/big") * 100
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            sent += sock.send(batch)
    return sock, sent


async def _big(_request: Request) -> Response:
    return Response(200, b"x" * 16384, "text/plain")


async def test_pipelined_answers_wait_for_a_client_that_does_not_read() -> None:
    """Regression: answers were written whether or not the client read them, so a client
    pipelining requests without reading grew the gateway's write buffer without bound
    (1.8 GB in 3 s); now the next request waits until the client has taken the answer."""
    async with serving(_big) as (server, port):
        sock, sent = await asyncio.to_thread(_flood, port, 0.3)
        try:
            await asyncio.sleep(0.1)
            assert sent > 100 * len(get("/big"))  # the gateway kept reading for a while
            conn = next(iter(server.connections))
            assert conn.transport is not None
            assert conn.transport.get_write_buffer_size() < 1 << 20
            # the answers are all still due, in order, once the client reads
            sock.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=sock)
            for _ in range(3):
                answer = await read_answer(reader)
                assert (answer.status, len(answer.body)) == (200, 16384)
            writer.close()
        finally:
            sock.close()


async def test_client_that_reads_nothing_is_dropped_after_the_keepalive_timeout() -> None:
    """A client that stops reading while an answer waits holds no connection forever."""
    async with serving(_big, keepalive_timeout_s=0.3) as (server, port):
        sock, _ = await asyncio.to_thread(_flood, port, 0.3)
        try:
            deadline = time.monotonic() + 3.0
            while server.connections and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not server.connections
        finally:
            sock.close()


# ---- head and trailer sizes --------------------------------------------------------------------


async def test_oversized_request_head_is_431_and_closes() -> None:
    """Regression: the head had no size limit (llhttp has none); a 40 MB header was read in
    full, with quadratic copying in the parser that blocked the event loop for seconds."""
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: ")
        for _ in range(8):  # 512 KiB, never ending the header
            writer.write(b"a" * 65536)
            await writer.drain()
        await assert_refused_and_closed(reader, 431)


async def test_large_but_allowed_head_is_served() -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(get("/ok", "X-Big: " + "a" * 30000, "X-Other: " + "b" * 20000))
        assert (await read_answer(reader)).body == b"GET /ok "
        writer.write(get("/again"))  # the next request's head is counted from zero
        assert (await read_answer(reader)).body == b"GET /again "


async def test_oversized_chunked_trailer_is_431_and_closes() -> None:
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(b"POST /t HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"3\r\nabc\r\n0\r\nX-Trailer: ")
        for _ in range(8):
            writer.write(b"a" * 65536)
            await writer.drain()
        assert_envelope(await read_answer(reader), 431)
        assert await read_to_eof(reader) == b""


async def _headers(request: Request) -> Response:
    return Response(200, json.dumps(request.headers, sort_keys=True).encode())


async def test_chunked_trailers_never_become_request_headers() -> None:
    """Regression: trailers were merged into the headers, so a trailer could pick the variant
    (``x-warmfleet-variant``) or carry ``authorization`` past what a proxy in front checked."""
    async with serving(_headers) as (_, port), client(port) as (reader, writer):
        writer.write(b"POST /t HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"3\r\nabc\r\n0\r\nAuthorization: Bearer x\r\nX-Warmfleet-Variant: v2\r\n\r\n")
        seen = json.loads((await read_answer(reader)).body)
        assert "authorization" not in seen
        assert "x-warmfleet-variant" not in seen
        assert seen["transfer-encoding"] == "chunked"


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked"])
async def test_a_transfer_coding_besides_chunked_is_refused(coding: str) -> None:
    """Regression: ``gzip, chunked`` was de-chunked and the still-gzipped bytes handed on as
    the body; the gateway decodes only chunked."""
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(
            b"POST /t HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: %s\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            % coding.encode()
        )
        answer = await read_answer(reader)
        assert_envelope(answer, 400)
        assert "transfer coding" in json.loads(answer.body)["error"]["message"]


async def test_wrong_method_405_names_the_allowed_ones() -> None:
    routes = Routes(plain_error)
    routes.add("GET", "/health", echo)
    routes.add("POST", "/v1/x", echo)
    async with serving(routes.dispatch) as (_, port), client(port) as (reader, writer):
        writer.write(post("/health", b"{}") + get("/v1/x"))
        first, second = await read_answer(reader), await read_answer(reader)
        assert (first.status, first.headers["allow"]) == (405, "GET, HEAD")
        assert (second.status, second.headers["allow"]) == (405, "POST")


# ---- a bad request pipelined behind good ones --------------------------------------------------


async def _slow_echo(request: Request) -> Response:
    await asyncio.sleep(0.1)
    return await echo(request)


@pytest.mark.parametrize(
    ("bad", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n", 413),
        (b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", 400),
    ],
    ids=["malformed", "too-large", "upgrade"],
)
async def test_bad_request_pipelined_after_good_ones_does_not_cut_their_answers(
    bad: bytes, status: int
) -> None:
    """Regression: the connection was closed the moment the bad request was parsed, so the
    answers to the good requests before it (still being handled) were lost."""
    async with serving(_slow_echo) as (_, port), client(port) as (reader, writer):
        writer.write(get("/a") + get("/b") + bad)
        assert (await read_answer(reader)).body == b"GET /a "
        assert (await read_answer(reader)).body == b"GET /b "
        answer = await read_answer(reader)
        assert_envelope(answer, status)
        assert answer.headers["connection"] == "close"
        assert await read_to_eof(reader) == b""


# ---- HEAD --------------------------------------------------------------------------------------


async def test_head_request_gets_the_get_head_without_a_body() -> None:
    """Regression: HEAD got a 405 *with* a body, which a keep-alive client reads as the start
    of the next answer."""
    routes = Routes(plain_error)
    routes.add("GET", "/health", echo)
    async with serving(routes.dispatch) as (_, port), client(port) as (reader, writer):
        writer.write(get("/health").replace(b"GET", b"HEAD", 1) + get("/health"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Length: 13\r\n" in head  # the length a GET would get ("HEAD /health ")
        answer = await read_answer(reader)  # the next bytes are the next answer
        assert (answer.status, answer.body) == (200, b"GET /health ")
        writer.write(get("/nowhere").replace(b"GET", b"HEAD", 1) + get("/health"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 404 ")
        assert (await read_answer(reader)).body == b"GET /health "


# ---- interim and bodiless answers from an instance ---------------------------------------------


async def test_interim_1xx_answers_are_skipped() -> None:
    """Regression: a 103 Early Hints (or 100 Continue) completed the exchange as if it were
    the answer; the real answer was then dropped on the floor."""

    async def hints(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n"
                b"Content-Type: text/html\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
            )
            await writer.drain()

    async with Upstream(hints) as up, pool_for() as pool:
        for _ in range(2):
            conn = await pool.acquire(up.addr)
            ex = conn.start(REQ, 2.0, 5.0)
            assert await asyncio.wait_for(ex.head, WAIT_S) == 200
            assert await asyncio.wait_for(ex.done, WAIT_S) == b"ok"
            assert (ex.status, ex.content_type, ex.chunked) == (200, "text/plain", False)


async def test_unrequested_protocol_switch_is_upstream_closed_error() -> None:
    async def switch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
        )
        await writer.drain()
        await reader.read()

    async with Upstream(switch) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 2.0, 5.0)
        with pytest.raises(UpstreamClosedError):
            await asyncio.wait_for(ex.done, WAIT_S)
        assert conn.closed


def _doc(port: int) -> dict[str, object]:
    variant = {
        "name": "v1",
        "models": [MODEL],
        "routing": {"strategy": {"type": "round_robin"}},
        "instances": [{"id": "raw", "url": f"http://127.0.0.1:{port}"}],
    }
    spec = {
        "health": {"interval_s": 5.0, "timeout_s": 1.0},
        "endpoints": [{"name": "main", "variants": [variant]}],
    }
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


@pytest.mark.parametrize("status", [204, 304])
async def test_bodiless_answer_is_relayed_without_framing_or_body(status: int) -> None:
    """Regression: a 204/304 from an instance went out with ``Transfer-Encoding: chunked`` and
    a ``0\\r\\n\\r\\n`` body, which a keep-alive client reads as the start of the next answer."""

    async def bodiless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            else:
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 %d Nothing\r\nX-Request-Id: r1\r\n\r\n" % status)
            await writer.drain()

    body = json.dumps({"model": MODEL, "prompt": "hi"}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with (
        Upstream(bodiless) as up,
        gateway_running(parse_gateway_config(_doc(up.addr[1]))) as gw,
        client(gw.port) as (reader, writer),
    ):
        writer.write(request + get("/health"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 %d " % status)
        assert b"x-warmfleet-instance: raw\r\n" in head
        assert b"transfer-encoding" not in head.lower()
        assert b"content-length" not in head.lower()
        answer = await read_answer(reader)  # the very next bytes are the next answer
        assert (answer.status, answer.body) == (200, b'{"status":"ok"}')
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 %d " % status)


async def test_client_gone_as_the_answer_completes_leaves_the_pooled_connection_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: a client disconnect handled after the instance's answer completed (its
    connection already back in the pool, maybe already serving another request) but before
    the handler woke up aborted that pooled connection."""

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"GET"):
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    body = json.dumps({"model": MODEL, "prompt": "hi"}).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    async with (
        Upstream(keep_alive) as up,
        gateway_running(parse_gateway_config(_doc(up.addr[1]))) as gw,
    ):
        pool = gw.gateway.proxy.pool
        released = []
        real_release = pool.release

        def release_then_client_gone(conn: UpstreamConnection) -> None:
            real_release(conn)
            released.append(conn)
            if len(released) == 1:  # the first client goes in the same loop iteration
                for client_conn in list(gw.app.server.connections):
                    client_conn.connection_lost(None)

        monkeypatch.setattr(pool, "release", release_then_client_gone)
        async with client(gw.port) as (_, writer):
            writer.write(request)
            await wait_until(lambda: bool(released), timeout_s=WAIT_S)
            await asyncio.sleep(0.05)  # the handler wakes up, cancelled
        assert not released[0].closed
        async with client(gw.port) as (reader, writer):
            writer.write(request)
            assert (await read_answer(reader)).status == 200
        assert len(released) == 2
        assert released[1] is released[0]  # the same upstream connection served both
