"""S3 error classes against a small S3-speaking origin on 127.0.0.1: a refusal (403) is not
retried, a 5xx is worth retrying."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from cache_support import manager_for

from harness.origin import ServerThread
from warmfleet.agent.sources.base import SourceError, TransientSourceError
from warmfleet.cache.config import SourcesSpec

DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)


class S3Origin:
    """One object. HEAD answers with its metadata (or ``head_status``); a ranged GET with its
    bytes, or ``get_status`` and an AccessDenied body."""

    def __init__(self, data: bytes, get_status: int | None = 403) -> None:
        self.data = data
        self.head_status = 200
        self.get_status = get_status
        self.headers = {
            "ETag": '"0123456789abcdef0123456789abcdef"',  # not the data's md5
            "Last-Modified": "Wed, 21 Oct 2015 07:28:00 GMT",
        }
        self.requests: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(request.method)
        if request.method == "HEAD":
            if self.head_status != 200:
                return web.Response(status=self.head_status)
            return web.Response(headers={**self.headers, "Content-Length": str(len(self.data))})
        if self.get_status is not None:
            return web.Response(status=self.get_status, body=DENIED, content_type="application/xml")
        first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
        start, end = int(first), int(last) + 1
        headers = {**self.headers, "Content-Range": f"bytes {start}-{end - 1}/{len(self.data)}"}
        return web.Response(status=206, body=self.data[start:end], headers=headers)


@pytest.fixture
def s3_origin(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3Origin, str]]:
    for var, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}.items():
        monkeypatch.setenv(var, value)
    origin = S3Origin(os.urandom(600_000))
    with ServerThread(origin.app) as server:
        yield origin, server.url


async def test_access_denied_on_get_is_not_retried(
    s3_origin: tuple[S3Origin, str], tmp_path: Path
) -> None:
    origin, endpoint = s3_origin
    sources = SourcesSpec(s3_endpoint_url=endpoint)
    async with manager_for(tmp_path, sources=sources, concurrency=1, max_attempts=5) as m:
        with pytest.raises(SourceError, match="AccessDenied") as info:
            await m.prefetch("s3://models/w.bin")
        assert not isinstance(info.value, TransientSourceError)
    assert origin.requests.count("GET") == 1


async def test_5xx_on_head_is_transient(s3_origin: tuple[S3Origin, str], tmp_path: Path) -> None:
    origin, endpoint = s3_origin
    origin.head_status = 503
    async with manager_for(tmp_path, sources=SourcesSpec(s3_endpoint_url=endpoint)) as m:
        with pytest.raises(TransientSourceError):
            await m.resolve("s3://models/w.bin")


async def test_sse_kms_etag_is_not_taken_for_an_md5(
    s3_origin: tuple[S3Origin, str], tmp_path: Path
) -> None:
    origin, endpoint = s3_origin
    origin.get_status = None
    origin.headers["x-amz-server-side-encryption"] = "aws:kms"
    async with manager_for(tmp_path, sources=SourcesSpec(s3_endpoint_url=endpoint)) as m:
        rec = await m.prefetch("s3://models/w.bin")
        assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == origin.data
        digests = m.store.read_marker(rec.key)["digests"]["w.bin"]
        assert digests == {"sha256": hashlib.sha256(origin.data).hexdigest()}
