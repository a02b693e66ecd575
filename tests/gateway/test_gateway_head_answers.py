"""HEAD answers carry the GET answer's head and no body (RFC 9110 9.3.2), whatever way the
GET answer would have been framed: ``HEAD /version`` is relayed to the instance as a GET, and
an instance that answers it chunked, or with a declared length over the relay's buffer, must
not make the gateway send that body (a keep-alive client reads it as the next answer). The
HTTP layer's own rejections of a HEAD request carry no body either."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from gateway_support import FakeBackend, gateway_config, gateway_running
from wire_support import WAIT_S, client, get, read_answer, read_to_eof, serving

VERSION = b'{"version":"0.0.chunked"}'
BIG = 2 << 20  # over the relay's whole-answer buffer (1 MiB): relayed as it arrives


class VersionBackend(FakeBackend):
    """Answers ``GET /version`` chunked, ``GET /big`` with a declared length of ``BIG``."""

    def _app(self) -> web.Application:
        app = super()._app()
        app.router.add_get("/version", self._version)
        return app

    async def _version(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("x-request-id") == "big":  # (the query is not relayed)
            body = b"v" * BIG
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (VERSION[:10], VERSION[10:]):
            await resp.write(part)
        await resp.write_eof()
        return resp


@asynccontextmanager
async def _gateway_port() -> AsyncIterator[int]:
    backend = VersionBackend("a")
    await backend.start()
    try:
        async with gateway_running(gateway_config([backend])) as gw:
            yield int(gw.url.rsplit(":", 1)[1])
    finally:
        await backend.stop()


def _head(path: str, *extra: str, version: str = "1.1") -> bytes:
    return get(path, *extra, version=version).replace(b"GET", b"HEAD", 1)


async def _head_of_answer(reader: asyncio.StreamReader) -> dict[str, str]:
    """The answer's head (a HEAD answer: nothing follows it), names lower-cased."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    lines = raw.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200 "), lines[0]
    return {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}


async def test_head_version_answered_chunked_upstream_has_its_length_and_no_body() -> None:
    """Regression: the instance's chunked answer went out chunked, body and all, to HEAD."""
    async with _gateway_port() as port, client(port) as (reader, writer):
        writer.write(get("/version"))
        whole = await read_answer(reader)
        assert (whole.status, whole.body) == (200, VERSION)
        writer.write(_head("/version") + get("/version"))
        head = await _head_of_answer(reader)
        assert "transfer-encoding" not in head
        assert head["content-length"] == str(len(VERSION))  # what a GET gets
        assert head["content-type"] == "application/json"
        assert head["x-warmfleet-instance"] == "a"
        after = await read_answer(reader)  # the next bytes are the next answer
        assert (after.status, after.body) == (200, VERSION)


async def test_head_of_a_large_answer_has_its_declared_length_and_no_body() -> None:
    async with _gateway_port() as port, client(port) as (reader, writer):
        writer.write(_head("/version", "x-request-id: big") + get("/health"))
        head = await _head_of_answer(reader)
        assert head["content-length"] == str(BIG)
        after = await read_answer(reader)
        assert (after.status, after.body) == (200, b'{"status":"ok"}')


async def test_head_from_an_http10_client_keeps_its_connection_and_sends_no_body() -> None:
    async with _gateway_port() as port, client(port) as (reader, writer):
        writer.write(_head("/version", "Connection: keep-alive", version="1.0"))
        head = await _head_of_answer(reader)
        assert head["content-length"] == str(len(VERSION))
        assert head.get("connection") == "keep-alive"
        writer.write(get("/health", "Connection: close", version="1.0"))
        rest = await read_to_eof(reader)  # the next answer, then the close: nothing between
        assert rest.startswith(b"HTTP/1.1 200 "), rest[:40]
        assert rest.endswith(b'{"status":"ok"}')


async def test_a_rejected_head_request_gets_no_body() -> None:
    """The HTTP layer's own rejection (here a body over the limit) of a HEAD request: its
    status and length, no body; a GET rejected behind a HEAD still gets its body."""
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(_head("/x", "Content-Length: 1000"))
        raw = await read_to_eof(reader)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 ")
        assert b"Content-Length: " in head
        assert body == b""
    async with serving() as (_, port), client(port) as (reader, writer):
        writer.write(_head("/x") + get("/y", "Content-Length: 1000"))
        raw = await read_to_eof(reader)
        assert raw.startswith(b"HTTP/1.1 200 ")
        assert raw.endswith(b'"code": 413}}')
