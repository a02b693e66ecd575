"""A fill that takes its pieces from peers where it can and from the origin where it must.

``PeerFill.download`` stages one artifact version the way ``Downloader`` does (same staging
directory, files created at their sizes, every written range ``fsync``ed before it returns), but
piece by piece on the plan of the fleet's tracker (``POST {tracker}/v1/tracker/{key}/plan``, the
wire form of ``warmfleet.control.tracker``): each assignment names a peer (its URL) or the
origin. A peer piece is fetched with the fleet's token, hashed and compared with the piece table
*before* it is written; a short, failed, stalled (no byte for ``stall_s``) or bad piece drops
that peer for the rest of the fill and the piece is planned again (origin last). An origin piece
is hashed on arrival and its hash reported, which builds the piece table. Every piece written is
served to other peers at once (``PeerHoldings``). The manager then verifies the whole files
against the manifest and publishes atomically exactly as after an ordinary download.

A piece's bytes land in a page-aligned buffer the fill reuses (received into it by
``peer_wire``, or copied into it from the origin's chunks); one worker thread then hashes them
(BLAKE3, the piece table's hash), writes them with ``O_DIRECT`` (``direct_io``) and feeds them to
the file's digests (``front_hash``), so a received byte is copied once by the CPU (from the
socket) and hashed twice (its piece, its file).

Without an answer from the tracker the fill goes on alone, from the origin (never stuck), and
asks the tracker again ``tracker_retry_s`` later (one slow answer does not end peer use).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.agent.direct_io import BLOCK_BYTES, DirectFile, aligned_buffer, direct_ranges
from warmfleet.agent.front_hash import FrontHash
from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings
from warmfleet.agent.peer_wire import PeerFailedError, RangeGet, get_into
from warmfleet.agent.sources.base import Source, SourceError, TransientSourceError
from warmfleet.agent.staged_files import StagedFiles, staging_mode
from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.cache.pieces import DEFAULT_PIECE_BYTES, Piece, piece_digest, plan_pieces
from warmfleet.core.errors import CacheError

log = logging.getLogger("warmfleet.agent.peers")
ORIGIN_ATTEMPTS = 3
DEFAULT_STALL_S = 2.0


@dataclass(frozen=True, slots=True)
class PeerConfig:
    tracker_url: str
    node: str
    self_url: str
    token: str
    piece_bytes: int = DEFAULT_PIECE_BYTES
    concurrency: int = 10
    piece_timeout_s: float = 60.0
    stall_s: float = DEFAULT_STALL_S
    idle_wait_s: float = 0.05
    plan_timeout_s: float = 2.0
    tracker_retry_s: float = 5.0  # after an unanswered plan: origin only for this long


@dataclass
class _Report:
    have: list[int] = field(default_factory=list)
    hashes: dict[int, str] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    released: list[int] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        return {
            "have": self.have,
            "hashes": {str(k): v for k, v in self.hashes.items()},
            "failedPeers": sorted(self.failed),
            "released": self.released,
        }


@dataclass(frozen=True, slots=True)
class _Job:
    piece: Piece
    peer: str  # "" = origin
    url: str
    digest: str | None


Digests = dict[str, dict[str, str]]


class _Buffers:
    """Piece buffers a fill reuses (one per piece being received from a peer): the bytes land
    in memory already touched, not in a fresh allocation per piece."""

    def __init__(self, size_bytes: int) -> None:
        self._size_bytes = size_bytes
        self._free: list[memoryview] = []

    def take(self) -> memoryview:
        """A buffer for a piece, with room to read it back aligned (``DirectFile.read_into``)."""
        if self._free:
            return self._free.pop()
        return aligned_buffer(self._size_bytes + 2 * BLOCK_BYTES)

    def give(self, buf: memoryview) -> None:
        self._free.append(buf)


def _nothing(_fd: int) -> None:
    """Marks a staged file written (``StagedFiles.sync`` fsyncs it) without touching it."""


class PeerFill:
    """One node's peer fills (one at a time per version); built by the agent's composition
    root, handed to the manager as its ``fill_hook``."""

    def __init__(
        self,
        config: PeerConfig,
        session: aiohttp.ClientSession,
        holdings: PeerHoldings,
        counters: PeerCounters,
    ) -> None:
        self.config = config
        self._session = session
        self._holdings = holdings
        self._counters = counters

    def hook(
        self, manifest: Manifest, on_bytes: Callable[[int], None]
    ) -> Callable[[Source, Manifest, Path], Awaitable[Digests]] | None:
        if manifest.size_bytes == 0:
            return None

        async def fill(source: Source, manifest_: Manifest, staging: Path) -> Digests:
            return await self.download(source, manifest_, staging, on_bytes)

        return fill

    async def download(
        self, source: Source, manifest: Manifest, staging: Path, on_bytes: Callable[[int], None]
    ) -> Digests:
        """Stage ``manifest``; returns the digests of every file hashed front to back as its
        pieces landed (the manager checks them, and hashes the others itself)."""
        key = manifest.key()
        pieces = plan_pieces(manifest, self.config.piece_bytes)
        self._holdings.forget(key)
        files = StagedFiles(staging, 64)
        try:
            await asyncio.to_thread(_create_all, files, manifest)
            run = _Run(self, source, manifest, pieces, files, on_bytes)
            await run.run(key)
            await asyncio.to_thread(files.sync)
            return run.digests()
        except OSError as err:
            raise CacheError(f"peer fill of {key[:16]}: {err}") from err
        finally:
            files.close()

    # ----- the wire ----------------------------------------------------------------------
    async def ask(
        self, key: str, pieces: int, session_id: str, report: _Report, want: int
    ) -> dict[str, Any] | None:
        body = {
            "node": self.config.node,
            "url": self.config.self_url,
            "session": session_id,
            "pieces": pieces,
            "want": want,
            **report.body(),
        }
        url = f"{self.config.tracker_url}/v1/tracker/{key}/plan"
        headers = {"Authorization": f"Bearer {self.config.token}"}
        timeout = aiohttp.ClientTimeout(total=self.config.plan_timeout_s)
        try:
            async with self._session.post(url, json=body, headers=headers, timeout=timeout) as r:
                if r.status != 200:
                    log.warning("tracker answered %s for %s", r.status, key[:16])
                    return None
                doc = await r.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            log.warning("tracker unreachable (%s): fetching %s from the origin", err, key[:16])
            return None
        return doc if isinstance(doc, dict) else None

    async def fetch_peer(self, key: str, job: _Job, buf: memoryview) -> memoryview:
        """The piece's bytes from ``job.peer``, received into ``buf`` (not yet checked)."""
        piece = job.piece
        view = buf[: piece.size_bytes]
        route = f"/v1/peer/{key}/{piece.path}"
        get = RangeGet(job.url, route, piece.start, piece.end, self.config.token)
        try:
            await get_into(
                get, view, stall_s=self.config.stall_s, timeout_s=self.config.piece_timeout_s
            )
        except PeerFailedError as err:  # named by the peer's id, not only its URL
            raise PeerFailedError(f"{job.peer}: {err}", rejected=err.rejected) from err
        return view

    async def fetch_origin(
        self, source: Source, entry: FileEntry, piece: Piece, buf: memoryview
    ) -> memoryview:
        """The piece's bytes from the origin, copied into ``buf`` as they arrive."""
        for attempt in range(1, ORIGIN_ATTEMPTS + 1):
            got = 0
            try:
                async for block in source.open_range(entry, piece.start, piece.end):
                    if got + len(block) > piece.size_bytes:
                        raise TransientSourceError(f"{entry.path}: long piece from the origin")
                    buf[got : got + len(block)] = block
                    got += len(block)
            except TransientSourceError:
                if attempt == ORIGIN_ATTEMPTS:
                    raise
                await asyncio.sleep(0.5 * attempt)
                continue
            if got != piece.size_bytes:
                raise TransientSourceError(f"{entry.path}: short piece from the origin")
            return buf[:got]
        raise SourceError("unreachable")  # the loop returns or raises

    def written(self, key: str, piece: Piece, size_bytes: int, *, from_origin: bool) -> None:
        self._holdings.add(key, piece.path, piece.start, piece.end)
        self._counters.fetched(size_bytes, from_origin=from_origin)

    def dropped(self, err: PeerFailedError) -> None:
        if err.rejected:
            self._counters.reject()
        self._counters.drop()
        log.warning("peer dropped for this fill: %s", err)


def _create_all(files: StagedFiles, manifest: Manifest) -> None:
    for entry in manifest.files:
        files.create(entry.path, entry.size_bytes, mode=staging_mode(entry.mode), preallocate=False)


class _Run:
    """The state of one fill: tasks under way, what to tell the tracker next."""

    def __init__(  # noqa: PLR0917
        self,
        fill: PeerFill,
        source: Source,
        manifest: Manifest,
        pieces: tuple[Piece, ...],
        files: StagedFiles,
        on_bytes: Callable[[int], None],
    ) -> None:
        self.fill, self.source, self.pieces, self.files = fill, source, pieces, files
        self.entries = {e.path: e for e in manifest.files}
        self.on_bytes = on_bytes
        self.session_id = secrets.token_hex(8)
        self.report = _Report()
        self.have: set[int] = set()
        self.tasks: dict[asyncio.Task[str | None], _Job] = {}
        self.hashes = {e.path: FrontHash(e) for e in manifest.files}
        self.buffers = _Buffers(max((p.size_bytes for p in pieces), default=0))
        self.staging = files.staging
        self.direct = direct_ranges(fill.config.piece_bytes)
        self.alone_until_s = 0.0  # monotonic; before it (the tracker did not answer): origin only

    async def run(self, key: str) -> None:
        cfg = self.fill.config
        try:
            while len(self.have) < len(self.pieces):
                want = cfg.concurrency - len(self.tasks)
                if want > 0:
                    self._start(key, await self._plan(key, want))
                if not self.tasks:
                    await asyncio.sleep(cfg.idle_wait_s)
                    continue
                wait_s = cfg.idle_wait_s if len(self.tasks) < cfg.concurrency else None
                done, _ = await asyncio.wait(
                    self.tasks, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    self._finish(key, task, self.tasks.pop(task))
            await self.fill.ask(key, len(self.pieces), self.session_id, self.report, 0)
        finally:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _plan(self, key: str, want: int) -> list[_Job]:
        doc = None
        if time.monotonic() >= self.alone_until_s:
            doc = await self.fill.ask(key, len(self.pieces), self.session_id, self.report, want)
            if doc is None:
                self.alone_until_s = time.monotonic() + self.fill.config.tracker_retry_s
        if doc is None:  # alone: the next missing pieces from the origin
            busy = {j.piece.index for j in self.tasks.values()}
            todo = [p for p in self.pieces if p.index not in self.have and p.index not in busy]
            return [_Job(p, "", "", None) for p in todo[:want]]
        self.report = _Report()
        hashes = {int(k): str(v) for k, v in (doc.get("hashes") or {}).items()}
        jobs = []
        for a in doc.get("assignments") or []:
            index = int(a["piece"])
            if 0 <= index < len(self.pieces) and index not in self.have:
                peer = str(a.get("peer") or "")
                jobs.append(_Job(self.pieces[index], peer, str(a.get("url") or ""),
                                 hashes.get(index)))  # fmt: skip
        return jobs

    def _start(self, key: str, jobs: list[_Job]) -> None:
        for job in jobs:
            if job.peer and job.digest is None:  # never write a peer piece unchecked
                self.report.released.append(job.piece.index)
                continue
            self.tasks[asyncio.create_task(self._piece(key, job))] = job

    async def _piece(self, key: str, job: _Job) -> str | None:
        """Fetch, check and write one piece; its sha256 when it came from the origin."""
        piece = job.piece
        buf = self.buffers.take()
        try:
            if not job.peer:
                entry = self.entries[piece.path]
                data = await self.fill.fetch_origin(self.source, entry, piece, buf)
                return await asyncio.to_thread(self._land, piece, data, buf, None)
            data = await self.fill.fetch_peer(key, job, buf)
            if await asyncio.to_thread(self._land, piece, data, buf, job.digest) is None:
                raise PeerFailedError(f"{job.peer}: piece {piece.index} fails its hash",
                                      rejected=True)  # fmt: skip
        finally:
            self.buffers.give(buf)
        return None

    def _land(
        self, piece: Piece, data: memoryview, buf: memoryview, expected: str | None
    ) -> str | None:
        """(Worker thread.) Hash ``data`` (in ``buf``); unless ``expected`` is given and
        differs, write it into staging (``O_DIRECT`` where possible: ``direct_io``) and feed
        the file's digests. Returns the hash, None if it was refused (nothing written)."""
        digest = piece_digest(data)
        if expected is not None and digest != expected:
            return None
        with DirectFile(self.staging / piece.path, direct=self.direct) as out:
            out.write(data, piece.start)
            self.files.run(piece.path, _nothing, write=True)  # fsynced with the others
            self.hashes[piece.path].advance(
                piece, data, lambda start, end: out.read_into(buf, start, end)
            )
        return digest

    def _finish(self, key: str, task: asyncio.Task[str | None], job: _Job) -> None:
        piece = job.piece
        try:
            digest = task.result()
        except PeerFailedError as err:
            self.report.failed.add(job.peer)
            self.report.released.append(piece.index)
            self.fill.dropped(err)
            return
        self.have.add(piece.index)
        self.report.have.append(piece.index)
        if digest is not None:
            self.report.hashes[piece.index] = digest
        self.fill.written(key, piece, piece.size_bytes, from_origin=not job.peer)
        self.on_bytes(piece.size_bytes)

    def digests(self) -> Digests:
        out = {path: h.digests() for path, h in self.hashes.items()}
        return {path: d for path, d in out.items() if d is not None}
