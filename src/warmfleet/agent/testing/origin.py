"""A local origin for tests and benchmarks (aiohttp, 127.0.0.1 only).

Serves plain files at ``/files/<path>`` and Hugging Face compatible repos for ``HF_ENDPOINT``:
``GET /api/models/<org>/<name>[/revision/<rev>]`` (what ``HfApi.model_info`` calls, with
``?blobs=true`` sizes, git blob ids and LFS sha256) and ``HEAD|GET /<org>/<name>/resolve/<rev>/
<file>`` with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag`` and ``X-Linked-Size``. Both honour
single byte ranges and ``If-Match``, can be throttled (one token bucket shared by all
connections) and take injected faults: ``truncate`` (close mid-body), ``flip`` (corrupt one
byte of every body), ``error`` (HTTP 503), ``stall``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

from aiohttp import web

from warmfleet.cache.transfer import TokenBucket
from warmfleet.core.clock import MonotonicClock

SEND_BLOCK_BYTES = 256 << 10
STALL_S = 20.0


@dataclass
class Blob:
    """File content: in memory (``data``) or on disk (``path``)."""

    data: bytes | None = None
    path: Path | None = None
    digest_header: bool = True
    faults: list[str] = field(default_factory=list)  # consumed one per GET
    flip: bool = False  # persistent corruption
    mtime_s: float = 1_700_000_000.0

    def __post_init__(self) -> None:
        self._map: mmap.mmap | None = None
        self.sha256 = self._hash(hashlib.sha256())
        self.size = len(self.data) if self.data is not None else self.path.stat().st_size  # type: ignore[union-attr]

    def _hash(self, h: Any) -> str:
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

    def git_sha1(self) -> str:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % self.size)
        return self._hash(h)


@dataclass
class HfRepo:
    files: dict[str, Blob]
    lfs: set[str]  # file names served as LFS objects

    @property
    def commit(self) -> str:
        h = hashlib.sha1(usedforsecurity=False)
        for name in sorted(self.files):
            h.update(f"{name}:{self.files[name].sha256}\n".encode())
        return h.hexdigest()


class Origin:
    def __init__(self, throttle_bps: float | None = None) -> None:
        self.files: dict[str, Blob] = {}
        self.repos: dict[str, HfRepo] = {}
        self.bytes_served = 0
        self.requests: list[str] = []
        self.faults_injected = 0
        self.auth_seen: list[str] = []
        self._bucket = TokenBucket(MonotonicClock(), throttle_bps) if throttle_bps else None

    def set_throttle(self, throttle_bps: float | None) -> None:
        self._bucket = TokenBucket(MonotonicClock(), throttle_bps) if throttle_bps else None

    def put(self, name: str, blob: Blob) -> Blob:
        self.files[name] = blob
        return blob

    def put_repo(self, repo_id: str, files: dict[str, bytes], lfs: set[str]) -> HfRepo:
        repo = HfRepo({n: Blob(data=d) for n, d in files.items()}, lfs)
        self.repos[repo_id] = repo
        return repo

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/files/{name:.+}", self._file)
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._model_info)
        app.router.add_get("/api/models/{org}/{name}", self._model_info)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{file:.+}", self._resolve)
        return app

    async def _file(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        blob = self.files.get(request.match_info["name"])
        if blob is None:
            raise web.HTTPNotFound()
        headers = {"ETag": blob.etag, "Last-Modified": formatdate(blob.mtime_s, usegmt=True)}
        if blob.digest_header:
            headers["Repr-Digest"] = (
                "sha-256=:" + base64.b64encode(bytes.fromhex(blob.sha256)).decode() + ":"
            )
        return await self._serve(request, blob, headers)

    def _repo(self, request: web.Request) -> tuple[HfRepo, str]:
        self.auth_seen.append(request.headers.get("Authorization", ""))
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"})
        rev = request.match_info.get("rev", "main")
        if rev not in ("main", repo.commit):
            raise web.HTTPNotFound(headers={"X-Error-Code": "RevisionNotFound"})
        return repo, repo_id

    async def _model_info(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path_qs}")
        repo, repo_id = self._repo(request)
        siblings = []
        for name, blob in sorted(repo.files.items()):
            sib: dict[str, object] = {"rfilename": name}
            if request.query.get("blobs") in ("true", "True", "1"):
                sib["size"] = blob.size
                sib["blobId"] = blob.git_sha1()
                if name in repo.lfs:
                    sib["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": 132}
            siblings.append(sib)
        return web.json_response(
            {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "siblings": siblings,
                "tags": [],
                "downloads": 0,
                "likes": 0,
            }
        )

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        repo, _ = self._repo(request)
        name = request.match_info["file"]
        blob = repo.files.get(name)
        if blob is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"})
        etag = f'"{blob.sha256}"' if name in repo.lfs else f'"{blob.git_sha1()}"'
        headers = {"X-Repo-Commit": repo.commit, "ETag": etag}
        if name in repo.lfs:
            headers["X-Linked-Etag"] = etag
            headers["X-Linked-Size"] = str(blob.size)
        return await self._serve(request, blob, headers)

    async def _serve(
        self, request: web.Request, blob: Blob, headers: dict[str, str]
    ) -> web.StreamResponse:
        if_match = request.headers.get("If-Match")
        if if_match and if_match not in (headers["ETag"], "*"):
            raise web.HTTPPreconditionFailed()
        start, end, status = 0, blob.size, 200
        rng = request.headers.get("Range")
        if rng:
            start, end = _parse_range(rng, blob.size)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{blob.size}"
        headers.update({"Accept-Ranges": "bytes", "Content-Length": str(end - start)})
        if request.method == "HEAD":
            return web.Response(status=status, headers=headers)
        fault = blob.faults.pop(0) if blob.faults else ""
        if fault:
            self.faults_injected += 1
        if fault == "error":
            raise web.HTTPServiceUnavailable()
        resp = web.StreamResponse(status=status, headers=headers)
        try:
            await resp.prepare(request)
            await self._send_body(
                request=request, resp=resp, blob=blob, start=start, end=end, fault=fault
            )
        except ConnectionResetError:  # the client went away (killed, timed out)
            pass
        return resp

    async def _send_body(
        self,
        *,
        request: web.Request,
        resp: web.StreamResponse,
        blob: Blob,
        start: int,
        end: int,
        fault: str,
    ) -> None:
        stop = start + (end - start) // 2 if fault == "truncate" else end
        await self._send_range(resp, blob, start, stop)
        if fault == "truncate":
            assert request.transport is not None
            request.transport.close()
        if fault == "stall":
            await asyncio.sleep(STALL_S)

    async def _send_range(
        self, resp: web.StreamResponse, blob: Blob, start: int, stop: int
    ) -> None:
        pos = start
        while pos < stop:
            n = min(SEND_BLOCK_BYTES, stop - pos)
            data = blob.read(pos, pos + n)  # memory or mmap: no blocking syscall
            if blob.flip and pos == start:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            if self._bucket is not None:
                delay = self._bucket.reserve(n)
                if delay > 0:
                    await asyncio.sleep(delay)
            await resp.write(data)
            self.bytes_served += n
            pos += n


def _parse_range(header: str, size: int) -> tuple[int, int]:
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


class ServerThread:
    """Runs an aiohttp app on 127.0.0.1:<free port> in a daemon thread with its own loop."""

    def __init__(self, app_factory: Callable[[], web.Application]) -> None:
        self._factory = app_factory
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="origin")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("origin server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(self._factory(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


def main() -> None:
    """``python -m warmfleet.agent.testing.origin --file NAME=PATH [--throttle BPS]``: prints
    the port on stdout and serves until killed (used by the benchmark)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--file", action="append", default=[])
    parser.add_argument("--throttle", type=float, default=0.0)
    args = parser.parse_args()
    origin = Origin(args.throttle or None)
    for item in args.file:
        name, _, path = item.partition("=")
        origin.put(name, Blob(path=Path(path)))
    with ServerThread(origin.app) as server:
        print(server.port, flush=True)
        threading.Event().wait(float(os.environ.get("WARMFLEET_ORIGIN_MAX_S", "3600")))


if __name__ == "__main__":
    main()
