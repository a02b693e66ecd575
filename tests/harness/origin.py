"""A local origin for tests and benchmarks: the product origin (``warmfleet.local.origin``) plus
fault injection, a request log and Hugging Face compatible repos (aiohttp, 127.0.0.1 only).

Files at ``/files/<path>`` are served by the product origin (ranges, ``If-Match``, throttle);
this adds Hugging Face compatible repos for ``HF_ENDPOINT``: ``GET /api/models/<org>/<name>
[/revision/<rev>]`` (what ``HfApi.model_info`` calls, with ``?blobs=true`` sizes, git blob ids
and LFS sha256) and ``HEAD|GET /<org>/<name>/resolve/<rev>/<file>`` with ``X-Repo-Commit``,
``ETag``, ``X-Linked-Etag`` and ``X-Linked-Size``. A ``Blob`` here takes injected faults:
``truncate`` (close mid-body), ``flip`` (corrupt one byte of every body), ``error`` (HTTP 503),
``stall``; ``digest_header=False`` leaves ``Repr-Digest`` out.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from warmfleet.local import origin as product
from warmfleet.local.origin import BodySource

STALL_S = 20.0


@dataclass
class Blob(product.Blob):
    """File content with the faults it will serve."""

    digest_header: bool = True
    faults: list[str] = field(default_factory=list)  # consumed one per GET
    flip: bool = False  # persistent corruption

    def git_sha1(self) -> str:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % self.size)
        return self.hash_with(h)


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


class _Flipped:
    """A body whose first byte (at ``start``) is corrupted."""

    def __init__(self, body: BodySource, start: int) -> None:
        self._body, self._start = body, start

    def read(self, start: int, end: int) -> bytes:
        data = self._body.read(start, end)
        return bytes([data[0] ^ 0xFF]) + data[1:] if start == self._start else data


class Origin(product.Origin):
    def __init__(self, throttle_bps: float | None = None) -> None:
        super().__init__(throttle_bps)
        self.repos: dict[str, HfRepo] = {}
        self.requests: list[str] = []
        self.faults_injected = 0
        self.auth_seen: list[str] = []

    def put_repo(self, repo_id: str, files: dict[str, bytes], lfs: set[str]) -> HfRepo:
        repo = HfRepo({n: Blob(data=d) for n, d in files.items()}, lfs)
        self.repos[repo_id] = repo
        return repo

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._model_info)
        app.router.add_get("/api/models/{org}/{name}", self._model_info)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{file:.+}", self._resolve)
        return app

    async def _file(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        return await super()._file(request)

    def _file_headers(self, blob: product.Blob) -> dict[str, str]:
        headers = super()._file_headers(blob)
        if isinstance(blob, Blob) and not blob.digest_header:
            del headers["Repr-Digest"]
        return headers

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

    async def _respond(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        body: BodySource,
        start: int,
        end: int,
    ) -> web.StreamResponse:
        """The product's answer, with the blob's next fault (if any) applied to it."""
        if not isinstance(body, Blob):
            return await super()._respond(request, resp, body, start, end)
        fault = body.faults.pop(0) if body.faults else ""
        if fault:
            self.faults_injected += 1
        if fault == "error":
            raise web.HTTPServiceUnavailable()
        source: BodySource = _Flipped(body, start) if body.flip else body
        stop = start + (end - start) // 2 if fault == "truncate" else end
        await super()._respond(request, resp, source, start, stop)
        if fault == "truncate":
            assert request.transport is not None
            request.transport.close()
        if fault == "stall":
            await asyncio.sleep(STALL_S)
        return resp


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
