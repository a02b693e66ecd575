"""A trickling or stalled origin cannot hold a fill: a body slower than
``download.min_download_rate_bytes_per_s`` over ``low_speed_time_s`` of waiting fails the
transfer (after the retries) with a clear reason, and the artifact releases its reservation.
Our own bandwidth limit never counts as a slow origin."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import pytest
from aiohttp import web
from cache_support import manager_for

from harness.origin import Blob, Origin, ServerThread
from warmfleet.agent.manager import IN_PROGRESS
from warmfleet.agent.sources.base import TooSlowError
from warmfleet.cache.state import ArtifactState


class _Guard(TypedDict):
    """The slow-origin guard's download settings (keyword arguments of ``manager_for``)."""

    min_download_rate_bytes_per_s: int
    low_speed_time_s: float
    max_attempts: int


GUARD: _Guard = {"min_download_rate_bytes_per_s": 2000, "low_speed_time_s": 0.4, "max_attempts": 2}


def _trickle_app(data: bytes, interval_s: float) -> Callable[[], web.Application]:
    """HEAD answers at once; a GET sends one byte every ``interval_s``."""
    etag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'

    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        start, end, status = 0, len(data), 200
        if "Range" in request.headers:
            first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
            start, end, status = int(first), int(last) + 1, 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        await resp.prepare(request)
        try:
            for i in range(start, end):
                await resp.write(data[i : i + 1])
                await asyncio.sleep(interval_s)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp

    def app() -> web.Application:
        application = web.Application()
        application.router.add_route("*", "/slow.bin", handle)
        return application

    return app


async def test_trickling_origin_fails_with_a_clear_reason(tmp_path: Path) -> None:
    with ServerThread(_trickle_app(os.urandom(100_000), 0.02)) as server:
        async with manager_for(tmp_path, **GUARD) as m:
            started = time.monotonic()
            with pytest.raises(TooSlowError, match=r"less than 2000 bytes/s over 0\.4 s"):
                await asyncio.wait_for(m.prefetch(f"{server.url}/slow.bin"), 20)
            assert time.monotonic() - started < 10
            (rec,) = m.records()
    assert rec.state == ArtifactState.FAILED  # its reservation is released
    assert "min_download_rate_bytes_per_s" in rec.reason
    assert "gave up after 2 attempts" in rec.reason


@pytest.mark.slow
async def test_stalled_origin_fails_without_waiting_for_a_byte(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    org.put("w.bin", Blob(data=os.urandom(300_000)))
    org.set_throttle(50)  # its first block would come after minutes
    async with manager_for(tmp_path, **GUARD) as m:
        with pytest.raises(TooSlowError):
            await asyncio.wait_for(m.prefetch(f"{url}/files/w.bin"), 20)
        assert not [r for r in m.records() if r.state in IN_PROGRESS]


async def test_own_bandwidth_limit_is_not_a_slow_origin(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(600_000)
    org.put("w.bin", Blob(data=data))
    # 4 streams share 400 kB/s here (100 kB/s each), far under the 1 MB/s minimum per stream
    guard: _Guard = {**GUARD, "min_download_rate_bytes_per_s": 1_000_000, "low_speed_time_s": 0.3}
    async with manager_for(
        tmp_path, chunk=64 * 1024, bandwidth_limit=400_000, concurrency=4, **guard
    ) as m:
        rec = await m.prefetch(f"{url}/files/w.bin")
    assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == data
