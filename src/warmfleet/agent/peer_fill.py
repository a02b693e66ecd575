"""A fill that takes its pieces from peers where it can and from the origin where it must.

``PeerFill.download`` stages one artifact version the way ``Downloader`` does (same staging
directory, files created at their sizes, every written range ``fsync``ed before it returns), but
piece by piece on the plan of the fleet's tracker (``POST {tracker}/v1/tracker/{key}/plan``, the
wire form of ``warmfleet.control.tracker``): each assignment names a peer (its URL) or the
origin. A peer piece is fetched with the fleet's token, hashed and compared with the piece table
*before* it is written; a short, failed, stalled (no byte for ``stall_s``) or bad piece drops
that peer for the rest of the fill and the piece is planned again (origin last). An origin piece
is hashed on arrival and its hash reported, which builds the piece table. Every piece written is
served to other peers at once (``PeerHoldings``; a file taken from the origin only, once it
matches). Each file is checked against the manifest as soon as its last piece lands; one that
fails ends the fill, which then stops serving its pieces and leaves the tracker (a new, empty
session: it forgets what this node held), withdrawing the hashes it reported for that file's
pieces, and the next fill of that version takes the file from the origin only (``peer_run``).
A fill over, the node's ``Presence`` (``peer_presence``) keeps the version offered while it is
served, and leaves it once it is not; a cancelled fill is left at once (the round it wakes). A fill
starts once no renewal or leave of an earlier fill of its version is on its way to the tracker.
The manager then verifies the whole files against the manifest and publishes atomically exactly
as after an ordinary download, retrying a failed one ``verify_attempts`` times.

An origin piece is fetched under the plain downloader's guard (``next_block``): an attempt
slower than ``origin_min_bps`` over ``origin_low_speed_s`` of waiting fails (``TooSlowError``)
and is tried again, ``ORIGIN_ATTEMPTS`` in all, so a trickling origin cannot hold a piece, and
the fill, for ever (the piece is fetched once: ``peer_run``).

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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.agent.downloader import next_block
from warmfleet.agent.peer_presence import Presence
from warmfleet.agent.peer_run import (
    Digests,
    FileCheckError,
    Job,
    PeerConfig,
    Report,
    Run,
)
from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings
from warmfleet.agent.peer_wire import PeerFailedError, RangeGet, get_into
from warmfleet.agent.sources.base import Source, SourceError, TransientSourceError
from warmfleet.agent.staged_files import StagedFiles, staging_mode
from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.cache.pieces import Piece, plan_pieces
from warmfleet.cache.transfer import LowSpeedGuard
from warmfleet.core.errors import CacheError

log = logging.getLogger("warmfleet.agent.peers")
ORIGIN_ATTEMPTS = 3
WITHDRAWN_PER_REPORT = 1 << 16  # the tracker's bound on a report's ``withdrawn``


class PeerFill:
    """One node's peer fills (one at a time per version); built by the agent's composition
    root, handed to the manager as its ``fill_hook``."""

    def __init__(
        self,
        config: PeerConfig,
        session: aiohttp.ClientSession,
        holdings: PeerHoldings,
        counters: PeerCounters,
        presence: Presence | None = None,
    ) -> None:
        self.config = config
        self._session = session
        self._holdings = holdings
        self._counters = counters
        self._presence = presence  # None: nothing kept up once a fill is over (one-shot fills)
        self._origin_only: dict[str, set[str]] = {}  # key -> files that failed their digests

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
        origin_only = frozenset(self._origin_only.get(key, ()))
        run = Run(self, source, manifest, pieces, files, on_bytes, origin_only)
        presence = self._presence
        try:
            if presence is not None:  # a round's report of an earlier fill reaches it first
                await presence.settled(key)
                presence.filling(key, len(pieces), run.session_id)
            await asyncio.to_thread(_create_all, files, manifest)
            await run.run(key)
            await asyncio.to_thread(files.sync)
        except BaseException as err:
            self._holdings.forget(key)  # what it staged is going away: no longer served
            if isinstance(err, Exception):
                await self._leave(key, len(pieces), err)
                if presence is not None:
                    presence.left(key, run.session_id)
            elif presence is not None:  # cancelled: left at once by the round it wakes
                presence.cancelled(key, run.session_id)
            if isinstance(err, OSError):
                raise CacheError(f"peer fill of {key[:16]}: {err}") from err
            raise
        finally:
            files.close()
            if presence is not None:  # served on (or left) by its rounds
                presence.over(key, run.session_id)
        self._origin_only.pop(key, None)
        return run.digests()

    async def _leave(self, key: str, pieces: int, err: Exception) -> None:
        """After a failed fill: the tracker forgets what this node held (a new session that
        holds nothing); a file that failed its digests has the hashes this node reported for
        its pieces withdrawn, and comes from the origin next time."""
        withdrawn: list[tuple[int, str]] = []
        if isinstance(err, FileCheckError):
            self._origin_only.setdefault(key, set()).add(err.path)
            withdrawn = list(err.withdrawn)
        session = secrets.token_hex(8)
        for start in range(0, max(len(withdrawn), 1), WITHDRAWN_PER_REPORT):
            batch = dict(withdrawn[start : start + WITHDRAWN_PER_REPORT])
            await self.ask(key, pieces, session, Report(withdrawn=batch), 0)

    # ----- the wire ----------------------------------------------------------------------
    async def ask(
        self, key: str, pieces: int, session_id: str, report: Report, want: int
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

    async def fetch_peer(self, key: str, job: Job, buf: memoryview) -> memoryview:
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
        """The piece's bytes from the origin, copied into ``buf`` as they arrive; a failed
        attempt (a slow one too) is tried again, ``ORIGIN_ATTEMPTS`` in all."""
        for attempt in range(1, ORIGIN_ATTEMPTS + 1):
            try:
                return await self._origin_attempt(source, entry, piece, buf)
            except TransientSourceError:
                if attempt == ORIGIN_ATTEMPTS:
                    raise
                await asyncio.sleep(0.5 * attempt)
        raise SourceError("unreachable")  # the loop returns or raises

    async def _origin_attempt(
        self, source: Source, entry: FileEntry, piece: Piece, buf: memoryview
    ) -> memoryview:
        cfg = self.config
        guard = None
        if cfg.origin_min_bps > 0:
            guard = LowSpeedGuard(cfg.origin_min_bps, cfg.origin_low_speed_s)
        stream = aiter(source.open_range(entry, piece.start, piece.end))
        got = 0
        try:
            while (block := await next_block(stream, guard, entry)) is not None:
                if got + len(block) > piece.size_bytes:
                    raise TransientSourceError(f"{entry.path}: long piece from the origin")
                buf[got : got + len(block)] = block
                got += len(block)
        finally:  # a body left early releases its connection now, not when collected
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        if got != piece.size_bytes:
            raise TransientSourceError(f"{entry.path}: short piece from the origin")
        return buf[:got]

    def written(self, size_bytes: int, *, from_origin: bool) -> None:
        self._counters.fetched(size_bytes, from_origin=from_origin)

    def hold(self, key: str, piece: Piece) -> None:
        """Serve ``piece`` (verified and written) to peers from now on."""
        self._holdings.add(key, piece.path, piece.start, piece.end)

    def dropped(self, err: PeerFailedError) -> None:
        if err.rejected:
            self._counters.reject()
        self._counters.drop()
        log.warning("peer dropped for this fill: %s", err)


def _create_all(files: StagedFiles, manifest: Manifest) -> None:
    for entry in manifest.files:
        files.create(entry.path, entry.size_bytes, mode=staging_mode(entry.mode), preallocate=False)
