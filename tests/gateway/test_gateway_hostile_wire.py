"""The HTTP layer against hostile peers: a head over the limit whatever the read boundaries,
more clients than the connection cap, many large bodies at once (the shared body budget), an
instance that answers twice, a client that stops reading."""

from __future__ import annotations

import asyncio

import pytest
from wire_support import (
    REQ,
    Upstream,
    assert_refused_and_closed,
    client,
    echo,
    get,
    pool_for,
    post,
    read_answer,
    serving,
)

from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.listener import HttpServer
from warmfleet.gateway.http.messages import Request, Response, ServerLimits
from warmfleet.gateway.http.wire import ServerConnection

HEAD_LIMIT = 64 * 1024


def _big_head(headers: int) -> bytes:
    lines = ["GET /h HTTP/1.1", "Host: t"] + [f"X-H{i}: {'v' * 8}" for i in range(headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Transport:
    """Records what a connection writes; it is fed by hand, one ``data_received`` per read."""

    def __init__(self) -> None:
        self.out = b""
        self.eof = False

    def get_extra_info(self, name: str) -> None:
        return None

    def write(self, data: bytes) -> None:
        self.out += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@pytest.mark.parametrize("read_bytes", [1, 7, 1 << 20], ids=["1_byte", "7_bytes", "one_read"])
def test_head_over_the_limit_is_431_whatever_the_read_boundaries(read_bytes: int) -> None:
    """15,000 short headers (~250 KB) in reads of every size: once a head that came in the
    first read was not counted at all (a 169 KB head passed)."""
    head = _big_head(15_000)
    assert len(head) > 3 * HEAD_LIMIT
    server = HttpServer(echo, ServerLimits(1024, 5.0, 30.0), plain_error)
    conn = ServerConnection(server)
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    fed = 0
    while fed < len(head) and not transport.out:
        conn.data_received(head[fed : fed + read_bytes])
        fed += read_bytes
    assert transport.out.startswith(b"HTTP/1.1 431 ")
    assert transport.eof
    assert fed <= HEAD_LIMIT + read_bytes + 64  # refused within a read of the limit


async def test_head_just_under_the_limit_is_served() -> None:
    head = _big_head(2_500)  # ~55 KB
    assert len(head) < HEAD_LIMIT - 4096
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(head)
        assert (await read_answer(reader)).status == 200


async def test_connection_cap_gives_an_idle_connection_up_for_a_new_client() -> None:
    limits = ServerLimits(1024, 5.0, 30.0)
    server = HttpServer(echo, limits, plain_error, max_connections=2)
    port = await server.start("127.0.0.1", 0)
    try:
        async with client(port) as (r1, w1), client(port) as (r2, w2):
            for reader, writer in ((r1, w1), (r2, w2)):  # both served, then idle
                writer.write(get("/a"))
                assert (await read_answer(reader)).status == 200
            async with client(port) as (r3, w3):
                w3.write(get("/new"))
                assert (await read_answer(r3)).body == b"GET /new "
                assert await asyncio.wait_for(r1.read(), 2.0) == b""  # the oldest idle one
            assert len(server.connections) <= 2
    finally:
        await server.stop(grace_s=0.5)


async def test_connection_cap_refuses_with_503_when_every_connection_is_busy() -> None:
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return await echo(request)

    server = HttpServer(slow, ServerLimits(1024, 5.0, 30.0), plain_error, max_connections=1)
    port = await server.start("127.0.0.1", 0)
    try:
        async with client(port) as (r1, w1):
            w1.write(get("/busy"))
            await asyncio.sleep(0.1)
            async with client(port) as (r2, _):
                await assert_refused_and_closed(r2, 503)
            assert server.refused_connections == 1
            release.set()
            assert (await read_answer(r1)).status == 200  # the busy one was left alone
    finally:
        release.set()
        await server.stop(grace_s=0.5)


async def test_bodies_being_received_share_one_budget() -> None:
    """Three clients each send 3/4 of a 64 KiB body; the budget holds two: the third client's
    bytes wait in its socket (its connection is held), then all three are answered."""
    limits = ServerLimits(64 * 1024, 5.0, 30.0, max_buffered_body_bytes=100 * 1024)
    server = HttpServer(echo, limits, plain_error)
    port = await server.start("127.0.0.1", 0)
    body = b"b" * (64 * 1024)
    cut = 48 * 1024
    try:
        async with (
            client(port) as (r1, w1),
            client(port) as (r2, w2),
            client(port) as (r3, w3),
        ):
            for writer in (w1, w2, w3):
                writer.write(post("/p", body)[: -(len(body) - cut)])
                await writer.drain()
                await asyncio.sleep(0.1)
            assert server.buffered_body_bytes <= 100 * 1024 + 64 * 1024
            assert len(server.held) >= 1
            for writer in (w1, w2, w3):
                writer.write(body[cut:])
            answers = [await read_answer(r) for r in (r1, r2, r3)]
            assert [a.body for a in answers] == [b"POST /p " + body] * 3
            assert server.buffered_body_bytes == 0
    finally:
        await server.stop(grace_s=0.5)


def test_a_body_budget_below_the_body_limit_is_refused_at_load() -> None:
    from warmfleet.gateway.server_config import LimitsConfig  # noqa: PLC0415

    with pytest.raises(ValueError, match="maxBufferedBodyBytes"):
        LimitsConfig(max_body_bytes=8 << 20, max_buffered_body_bytes=1 << 20)


# ---- upstream: a second answer never reaches the next request ---------------------------------


def _answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@pytest.mark.parametrize("delay_s", [0.0, 0.1], ids=["same_write", "later"])
async def test_a_stray_second_answer_closes_the_connection(delay_s: float) -> None:
    async def answers_twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count = 0
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            count += 1
            first, second = _answer(b"first-%d" % count), _answer(b"STRAY-%d" % count)
            if delay_s:
                writer.write(first)
                await writer.drain()
                await asyncio.sleep(delay_s)
                writer.write(second)
            else:
                writer.write(first + second)
            await writer.drain()

    async with Upstream(answers_twice) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        assert await conn.start(REQ, 1.0, 5.0).done == b"first-1"
        await asyncio.sleep(delay_s + 0.1)
        assert conn.closed  # never handed to the next request
        again = await pool.acquire(up.addr)
        assert again is not conn
        assert await again.start(REQ, 1.0, 5.0).done == b"first-1"  # a new connection's first
        assert up.accepted == 2


async def test_read_timeout_does_not_run_while_the_client_holds_the_relay_back() -> None:
    """A client that stops reading pauses the upstream connection: that is not the instance
    being silent (it once ended in an UpstreamTimeout that blamed and ejected the instance)."""
    sent = asyncio.Event()

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await writer.drain()
        sent.set()
        await asyncio.sleep(0.6)
        writer.write(b"cd")
        await writer.drain()
        await reader.read()

    async with Upstream(chatty) as up, pool_for() as pool:
        conn = await pool.acquire(up.addr)
        ex = conn.start(REQ, 0.2, 10.0)
        await sent.wait()
        await asyncio.sleep(0.05)
        conn.pause_reading(True)  # the relay's client stopped taking bytes
        await asyncio.sleep(0.5)  # over twice the read timeout
        assert not ex.done.done()
        conn.pause_reading(False)
        assert await asyncio.wait_for(ex.done, 2.0) == b"abcd"
