"""The local fleet's model origin: files served over HTTP (aiohttp, 127.0.0.1 only).

Serves each file at ``/files/<name>`` the way a bucket behind a link does: single byte ranges,
``If-Match``, ``ETag``, ``Last-Modified`` and ``Repr-Digest`` (sha-256), and a fixed bandwidth
(one token bucket shared by all connections) when throttled; ``/stats`` tells its egress so
far. ``warmfleet up`` runs it as a child process (``origin_proc``). Test doubles build on it
(``tests/harness/origin.py`` adds fault injection and Hugging Face routes); it injects nothing
itself.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import mmap
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiohttp import web

from warmfleet.cache.transfer import TokenBucket
from warmfleet.core.clock import MonotonicClock

SEND_BLOCK_BYTES = 256 << 10


class BodySource(Protocol):
    """What a response body is read from."""

    def read(self, start: int, end: int) -> bytes: ...


@dataclass
class Blob:
    """File content: in memory (``data``) or on disk (``path``)."""

    data: bytes | None = None
    path: Path | None = None
    mtime_s: float = 1_700_000_000.0

    def __post_init__(self) -> None:
        self._map: mmap.mmap | None = None
        self.sha256 = self.hash_with(hashlib.sha256())
        self.size = len(self.data) if self.data is not None else self.path.stat().st_size  # type: ignore[union-attr]

    def hash_with(self, h: Any) -> str:
        """Feed the content to ``h`` (a hashlib object) and return its hex digest."""
        if self.data is not None:
            h.update(self.data)
        else:
            assert self.path is not None
            with self.path.open("rb") as fh:
                while block := fh.read(4 << 20):
                    h.update(block)
        digest: str = h.hexdigest()
        return digest

    @property
    def etag(self) -> str:
        return f'"{self.sha256[:32]}"'

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        if self._map is None:
            assert self.path is not None
            with self.path.open("rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map[start:end]


BlobT = TypeVar("BlobT", bound=Blob)


class Origin:
    """The files it serves (``put``), its bandwidth (``set_throttle``) and its aiohttp app."""

    def __init__(self, throttle_bps: float | None = None) -> None:
        self.files: dict[str, Blob] = {}
        self.bytes_served = 0
        self._bucket = TokenBucket(MonotonicClock(), throttle_bps) if throttle_bps else None

    def set_throttle(self, throttle_bps: float | None) -> None:
        self._bucket = TokenBucket(MonotonicClock(), throttle_bps) if throttle_bps else None

    def put(self, name: str, blob: BlobT) -> BlobT:
        self.files[name] = blob
        return blob

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/files/{name:.+}", self._file)
        app.router.add_get("/stats", self._stats)
        return app

    async def _stats(self, _request: web.Request) -> web.Response:
        """``{"bytesServed"}``: body bytes sent since start (origin egress)."""
        return web.json_response({"bytesServed": self.bytes_served})

    async def _file(self, request: web.Request) -> web.StreamResponse:
        blob = self.files.get(request.match_info["name"])
        if blob is None:
            raise web.HTTPNotFound()
        return await self._serve(request, blob, self._file_headers(blob))

    def _file_headers(self, blob: Blob) -> dict[str, str]:
        digest = base64.b64encode(bytes.fromhex(blob.sha256)).decode()
        return {
            "ETag": blob.etag,
            "Last-Modified": formatdate(blob.mtime_s, usegmt=True),
            "Repr-Digest": f"sha-256=:{digest}:",
        }

    async def _serve(
        self, request: web.Request, blob: Blob, headers: dict[str, str]
    ) -> web.StreamResponse:
        """Answer a GET or HEAD of ``blob`` (its validators in ``headers``)."""
        if_match = request.headers.get("If-Match")
        if if_match and if_match not in (headers["ETag"], "*"):
            raise web.HTTPPreconditionFailed()
        start, end, status = 0, blob.size, 200
        rng = request.headers.get("Range")
        if rng:
            start, end = parse_range(rng, blob.size)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{blob.size}"
        headers.update({"Accept-Ranges": "bytes", "Content-Length": str(end - start)})
        if request.method == "HEAD":
            return web.Response(status=status, headers=headers)
        resp = web.StreamResponse(status=status, headers=headers)
        return await self._respond(request, resp, blob, start, end)

    async def _respond(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        body: BodySource,
        start: int,
        end: int,
    ) -> web.StreamResponse:
        """Send the head, then ``body[start:end]`` (a client that goes away ends it)."""
        try:
            await resp.prepare(request)
            await self._send_range(resp, body, start, end)
        except ConnectionResetError:  # the client went away (killed, timed out)
            pass
        return resp

    async def _send_range(
        self, resp: web.StreamResponse, body: BodySource, start: int, stop: int
    ) -> None:
        pos = start
        while pos < stop:
            n = min(SEND_BLOCK_BYTES, stop - pos)
            data = body.read(pos, pos + n)  # memory or mmap: no blocking syscall
            if self._bucket is not None:
                delay = self._bucket.reserve(n)
                if delay > 0:
                    await asyncio.sleep(delay)
            await resp.write(data)
            self.bytes_served += n
            pos += n


def parse_range(header: str, size: int) -> tuple[int, int]:
    """A single ``bytes=`` range -> ``[start, end)`` (416 if unsatisfiable or multiple)."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        raise web.HTTPRequestRangeNotSatisfiable()
    first, _, last = spec.strip().partition("-")
    if not first:
        start, end = max(size - int(last), 0), size
    else:
        start, end = int(first), min(int(last) + 1 if last else size, size)
    if start >= end:
        raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
    return start, end
