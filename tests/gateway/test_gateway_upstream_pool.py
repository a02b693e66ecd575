"""``upstream.UpstreamPool`` against scripted raw upstreams: connection reuse (most recent
first), ``maxConnections`` (waiters, broken connections, eviction, concurrent acquires,
cancelled waiters), read and total timeouts, refused, cut, malformed and close-delimited
answers, and the idle sweep."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
from wire_support import REQ, WAIT_S, Upstream, answer_ok, pool_for

from warmfleet.gateway.http.upstream import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamTimeout,
)


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
