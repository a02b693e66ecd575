"""HTTP protocol edge cases against small misbehaving origins on 127.0.0.1: a 206 for the
wrong bytes, a 416 after the object shrank, 429 with Retry-After."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict

import pytest
from aiohttp import web
from cache_support import manager_for

from harness.origin import ServerThread
from warmfleet.agent.sources.base import SourceChangedError, SourceError, TransientSourceError
from warmfleet.agent.sources.http import retry_after_s

Handler = Callable[[web.Request, bytes], web.Response]


class _Current(TypedDict):
    """What the flaky origin serves now, and from which offset it fails."""

    data: bytes
    fail_from: int


def _serve(data: bytes, on_range: Handler, head_status: int) -> ServerThread:
    """HEAD tells size and range support (no ETag, no digest) or answers ``head_status``; a
    GET is ``on_range``."""

    async def head(_: web.Request) -> web.Response:
        if head_status != 200:
            return web.Response(status=head_status)
        return web.Response(headers={"Content-Length": str(len(data)), "Accept-Ranges": "bytes"})

    async def get(request: web.Request) -> web.Response:
        if request.method == "HEAD":
            return await head(request)
        return on_range(request, data)

    def app() -> web.Application:
        application = web.Application()
        application.router.add_route("*", "/f.bin", get)
        return application

    return ServerThread(app)


def _range(request: web.Request) -> tuple[int, int]:
    first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
    return int(first), int(last) + 1


@pytest.fixture
def served() -> Iterator[Callable[..., str]]:
    servers: list[ServerThread] = []

    def start(data: bytes, on_range: Handler, head_status: int = 200) -> str:
        server = _serve(data, on_range, head_status).__enter__()
        servers.append(server)
        return f"{server.url}/f.bin"

    yield start
    for server in servers:
        server.__exit__()


async def _refused_and_nothing_published(
    tmp_path: Path, url: str, error: type[Exception], match: str
) -> None:
    async with manager_for(tmp_path) as m:
        with pytest.raises(error, match=match):
            await m.prefetch(url)
    assert not any((tmp_path / "objects").iterdir())


async def test_a_206_for_other_bytes_than_asked_is_refused(
    served: Callable[..., str], tmp_path: Path
) -> None:
    def from_the_start(request: web.Request, data: bytes) -> web.Response:
        start, end = _range(request)  # answers every range with the file's first bytes
        size = end - start
        headers = {"Content-Range": f"bytes 0-{size - 1}/{len(data)}"}
        return web.Response(status=206, body=data[:size], headers=headers)

    url = served(os.urandom(600_000), from_the_start)
    await _refused_and_nothing_published(tmp_path, url, SourceError, "asked for bytes")


async def test_a_416_after_the_object_shrank_is_a_source_change(
    served: Callable[..., str], tmp_path: Path
) -> None:
    def shrunk(request: web.Request, data: bytes) -> web.Response:
        start, end = _range(request)
        if end > len(data) // 2:
            headers = {"Content-Range": f"bytes */{len(data) // 2}"}
            return web.Response(status=416, headers=headers)
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        return web.Response(status=206, body=data[start:end], headers=headers)

    url = served(os.urandom(600_000), shrunk)
    await _refused_and_nothing_published(tmp_path, url, SourceChangedError, "range not satisfiable")


async def test_429_waits_at_least_retry_after(served: Callable[..., str], tmp_path: Path) -> None:
    seen_s: list[float] = []

    def throttled(request: web.Request, data: bytes) -> web.Response:
        seen_s.append(time.monotonic())
        if len(seen_s) == 1:
            return web.Response(status=429, headers={"Retry-After": "1"})
        start, end = _range(request)
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        return web.Response(status=206, body=data[start:end], headers=headers)

    data = os.urandom(600_000)  # three ranged chunks
    url = served(data, throttled)
    async with manager_for(tmp_path, concurrency=1, max_attempts=3) as m:
        rec = await m.prefetch(url)
        assert (tmp_path / "objects" / rec.key / "f.bin").read_bytes() == data
    assert seen_s[1] - seen_s[0] >= 0.95  # backoff alone would be ~0.01 s


def _honest(request: web.Request, data: bytes) -> web.Response:
    start, end = _range(request)
    headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}", "ETag": '"v1"'}
    return web.Response(status=206, body=data[start:end], headers=headers)


async def test_presigned_url_that_refuses_head_is_resolved_with_a_ranged_get(
    served: Callable[..., str], tmp_path: Path
) -> None:
    data = os.urandom(600_000)
    url = served(data, _honest, head_status=403)  # signed for GET only, as S3 presigned URLs
    async with manager_for(tmp_path) as m:
        rec = await m.prefetch(url + "?X-Amz-Signature=abc")
        assert (tmp_path / "objects" / rec.key / "f.bin").read_bytes() == data
        assert m.store.read_marker(rec.key)["manifest"]["files"][0]["etag"] == '"v1"'


def test_retry_after_parses_seconds_and_dates() -> None:
    assert retry_after_s({"Retry-After": "7"}) == 7.0
    assert retry_after_s({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # past
    assert retry_after_s({"Retry-After": "soon"}) is None
    assert retry_after_s({}) is None


async def test_no_validator_means_no_splicing_of_an_earlier_attempt(
    served: Callable[..., str], tmp_path: Path
) -> None:
    """Without ETag, Last-Modified or digest a changed object keeps its key: the staged chunks
    of the failed attempt may be of the old version and must not be reused."""
    size = 600_000
    current: _Current = {"data": os.urandom(size), "fail_from": 262_144}

    def flaky(request: web.Request, _: bytes) -> web.Response:
        start, end = _range(request)
        if start >= current["fail_from"]:
            return web.Response(status=503)
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
        return web.Response(status=206, body=current["data"][start:end], headers=headers)

    url = served(bytes(size), flaky)  # HEAD: size and ranges only
    async with manager_for(tmp_path, concurrency=1, max_attempts=1) as m:
        with pytest.raises(TransientSourceError):
            await m.prefetch(url)  # the first chunk is staged, then 503s
        current.update({"data": os.urandom(size), "fail_from": size})  # replaced, same size
        rec = await m.prefetch(url)
        assert (tmp_path / "objects" / rec.key / "f.bin").read_bytes() == current["data"]
