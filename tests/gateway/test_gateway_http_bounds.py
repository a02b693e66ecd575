"""The HTTP edge's bounds under hostile clients and instances: a held connection stays held
past an earlier answer, tiny chunks count their objects in the body budget, an evicted
connection with unsent output is aborted, an upstream head is bounded, a pooled upstream
connection is reading, a non-SSE answer cut mid-stream is cut for the client too, and a
Responses tool output's parts count against ``maxContentParts``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from gateway_support import MODEL, gateway_running

from warmfleet.core.errors import BadRequestError
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.listener import HttpServer
from warmfleet.gateway.http.messages import Request, Response, ServerLimits
from warmfleet.gateway.http.upstream import (
    MAX_ANSWER_HEAD_BYTES,
    UpstreamClosedError,
    UpstreamConnection,
)
from warmfleet.gateway.http.wire import PIECE_BYTES, ServerConnection
from warmfleet.gateway.openai.body import parse_request_body
from warmfleet.gateway.server_config import LimitsConfig


class FakeTransport:
    """What a connection calls on its transport, recorded."""

    def __init__(self, unsent_bytes: int = 0) -> None:
        self.out: list[bytes] = []
        self.paused = False
        self.closed = False
        self.aborted = False
        self.unsent_bytes = unsent_bytes

    def get_extra_info(self, _name: str) -> None:
        return None

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def get_write_buffer_size(self) -> int:
        return self.unsent_bytes

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def _server(handler: Any, **limits: Any) -> HttpServer:
    limits.setdefault("max_body_bytes", 1 << 20)
    return HttpServer(handler, ServerLimits(body_read_timeout_s=30, **limits), plain_error)


def _connect(server: HttpServer, unsent_bytes: int = 0) -> tuple[ServerConnection, FakeTransport]:
    conn, transport = ServerConnection(server), FakeTransport(unsent_bytes)
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_connection_held_over_the_budget_stays_held_after_an_earlier_answer() -> None:
    gate = asyncio.get_running_loop().create_future()

    async def handler(request: Request) -> Response:
        if request.path == "/slow":
            await gate
        return Response(200, b"{}")

    server = _server(handler, max_buffered_body_bytes=1000)
    conn, transport = _connect(server)
    conn.data_received(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(0)
    conn.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"a" * 1500)
    assert transport.paused
    gate.set_result(None)
    await asyncio.sleep(0.01)
    assert transport.out  # the first answer went out...
    assert transport.paused  # ...and reading stays paused until the budget frees (resumed)


def test_tiny_chunks_count_their_objects_in_the_body_budget() -> None:
    server = _server(lambda _r: Response(200, b"{}"), max_body_bytes=1 << 20)
    conn, _ = _connect(server)
    conn.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    conn.data_received(b"2\r\nab\r\n" * 1000)
    assert server.buffered_body_bytes == 1000 * (2 + PIECE_BYTES)


def test_an_evicted_connection_with_unsent_output_is_aborted() -> None:
    server = _server(lambda _r: Response(200, b"{}"))
    server.max_connections = 1
    first, stuck = _connect(server, unsent_bytes=4096)  # its client never reads
    _second, _ = _connect(server)
    assert stuck.aborted
    assert first not in server.connections


class _Pool:
    def __init__(self) -> None:
        self.released: list[UpstreamConnection] = []

    def release(self, conn: UpstreamConnection) -> None:
        self.released.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        pass

    def watch(self, timeout_s: float) -> None:
        pass


class _PausingSink:
    """A relay whose last write to its client crosses the high-water mark."""

    def __init__(self, conn: UpstreamConnection) -> None:
        self.conn = conn

    def head(self, exchange: Any) -> None:
        pass

    def data(self, body: bytes) -> None:
        pass

    def flush(self) -> None:
        pass

    def end(self, exchange: Any) -> None:
        self.conn.pause_reading(True)


async def test_an_upstream_connection_goes_back_to_the_pool_reading() -> None:
    """Paused, an idle pooled connection did not see the instance close it: the next request
    on it failed, counted against a healthy instance."""
    pool = _Pool()
    conn, transport = UpstreamConnection(pool, ("h", 1, False)), FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.start(b"POST / HTTP/1.1\r\n\r\n", 120.0, 1800.0, _PausingSink(conn))
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert pool.released == [conn]
    assert not transport.paused


async def test_an_upstream_answer_head_is_bounded() -> None:
    conn, transport = UpstreamConnection(_Pool(), ("h", 1, False)), FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    exchange = conn.start(b"GET / HTTP/1.1\r\n\r\n", 120.0, 1800.0)
    conn.data_received(b"HTTP/1.1 200 OK\r\nX-Junk: ")
    for _ in range(MAX_ANSWER_HEAD_BYTES // 16384 + 2):
        if conn.closed:
            break
        conn.data_received(b"a" * 16384)
    assert conn.closed
    with pytest.raises(UpstreamClosedError, match="head over 64 KiB"):
        await exchange.head


def test_a_responses_tool_outputs_parts_count_against_the_limit() -> None:
    part = {"type": "input_text", "text": "x"}
    item = {"type": "function_call_output", "call_id": "c", "output": [part] * 100}
    body = json.dumps({"model": "m", "input": [item]}).encode()
    with pytest.raises(BadRequestError, match="content parts"):
        parse_request_body(body, LimitsConfig(max_content_parts=10), kind="responses")


async def test_a_json_answer_cut_mid_stream_is_cut_for_the_client() -> None:
    """A chunked answer that is not an event stream: an SSE error event and a clean end made
    broken JSON look whole; the client's connection is cut instead."""

    async def instance(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        writer.write(head + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n')
        await writer.drain()
        writer.close()  # dies mid-answer

    server = await asyncio.start_server(instance, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "endpoints": [
                {
                    "name": "main",
                    "variants": [
                        {
                            "name": "v1",
                            "models": [MODEL],
                            "instances": [{"id": "i0", "url": f"http://127.0.0.1:{port}"}],
                        }
                    ],
                }
            ],
        },
    }
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with (
            gateway_running(parse_gateway_config(doc)) as app,
            aiohttp.ClientSession() as session,
            session.post(app.url + "/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
    finally:
        server.close()
        await server.wait_closed()
