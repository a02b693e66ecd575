"""One peer fill under way (``PeerFill.download``): plan, fetch, check, write and report pieces.

Each piece is fetched by a task of the fill's ``TaskGroup``, at most one per piece. The tracker
hands an assignment out again once it has gone unreported for its stall bound (it takes the
node for dead), so every report lists the pieces still being fetched (``fetching``: the tracker
renews them), and with every slot busy the run still reports every ``renew_s``. A tracker that
does not read ``fetching`` (or a report that does not reach it) may still hand a piece back to
this node while its fetch runs: that assignment is ignored, the fetch under way answers for it
(its ``have`` or its release). A task returns what went wrong instead of raising it, so a
failed peer costs its piece, not the fill; anything else ends the fill, its other tasks
cancelled first.

A file is checked against the manifest's digests as soon as its last piece lands (``FrontHash``
has them then), not only by the manager after the fill: a file that fails ends the fill at once
(``FileCheckError``), so its bytes stop being served. Its origin pieces' hashes are already in
the tracker's piece table, which keeps the first hash reported for a piece: an origin piece's
hash is reported as it lands, because the tracker offers no peer a piece before its hash is in
the table, and the origin pieces of one file are spread over several nodes (``originStreams``
above a node's ``concurrency``), so hashes held back until each node's file matched would wait
for one another for ever. The error names the pieces of that file whose hashes this run
reported, each with the hash it reported, and the fill's leave withdraws them (``Report.
withdrawn``: the tracker drops an entry only for the node that reported it and only if it is
that hash, not one this node reported in an earlier fill, and takes the next hash reported).
All of them, the good
too: the manifest gives one digest for the whole file, so a mismatch does not say which piece
is bad; a peer piece's hash is not this node's (it was checked against another's report), so
it is not among them. A retry still does not take that file from peers, whose copies may
match a hash of corrupt bytes another node reported: the fill that follows takes the files
named in ``origin_only`` from the origin, whatever the plan says, and reports their pieces
(held, hashed, served) only once the file matches.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from warmfleet.agent.digests import check_digests
from warmfleet.agent.direct_io import BLOCK_BYTES, DirectFile, aligned_buffer, direct_ranges
from warmfleet.agent.front_hash import FrontHash
from warmfleet.agent.peer_wire import PeerFailedError
from warmfleet.agent.sources.base import Source
from warmfleet.agent.staged_files import StagedFiles
from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.cache.pieces import DEFAULT_PIECE_BYTES, Piece, piece_digest
from warmfleet.core.errors import IntegrityError

Digests = dict[str, dict[str, str]]
DEFAULT_STALL_S = 2.0
DEFAULT_RENEW_S = 10.0


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
    # An origin piece slower than this over origin_low_speed_s of waiting fails (and is tried
    # again): the node's download.minDownloadRateBytesPerS / lowSpeedTimeS. 0 turns it off.
    origin_min_bps: float = 16 * 2**10
    origin_low_speed_s: float = 30.0
    # With every slot busy, a report at least this often (it renews the fetches under way, and
    # keeps this node's pieces offered; after the fill, ``peer_presence`` renews at this rate):
    # the fleet's peers.renewS, at most half the tracker's stall bound (local tracker host:
    # max(30 s, 10 x stallS)).
    renew_s: float = DEFAULT_RENEW_S


class FillShell(Protocol):
    """What a run asks of its node's fills (``peer_fill.PeerFill``, its shell)."""

    config: PeerConfig

    async def ask(
        self, key: str, pieces: int, session_id: str, report: Report, want: int
    ) -> dict[str, Any] | None: ...

    async def fetch_peer(self, key: str, job: Job, buf: memoryview) -> memoryview: ...

    async def fetch_origin(
        self, source: Source, entry: FileEntry, piece: Piece, buf: memoryview
    ) -> memoryview: ...

    def written(self, size_bytes: int, *, from_origin: bool) -> None: ...

    def hold(self, key: str, piece: Piece) -> None: ...

    def dropped(self, err: PeerFailedError) -> None: ...


class FileCheckError(IntegrityError):
    """A staged file's digests, complete, differ from the manifest's; ``withdrawn``: the pieces
    of that file whose hashes the fill reported, each with that hash (to be taken back)."""

    def __init__(
        self, message: str, path: str, withdrawn: tuple[tuple[int, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.path = path
        self.withdrawn = withdrawn


@dataclass
class Report:
    have: list[int] = field(default_factory=list)
    hashes: dict[int, str] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    released: list[int] = field(default_factory=list)
    withdrawn: dict[int, str] = field(default_factory=dict)  # hashes reported, taken back
    fetching: list[int] = field(default_factory=list)  # assignments still under way

    def body(self) -> dict[str, Any]:
        """The wire form; a tracker that predates ``withdrawn``/``fetching`` ignores them, one
        that predates ``withdrawnHashes`` withdraws by ``withdrawn`` alone (the pieces)."""
        return {
            "have": self.have,
            "hashes": {str(k): v for k, v in self.hashes.items()},
            "failedPeers": sorted(self.failed),
            "released": self.released,
            "withdrawn": sorted(self.withdrawn),
            "withdrawnHashes": {str(k): v for k, v in self.withdrawn.items()},
            "fetching": self.fetching,
        }


@dataclass(frozen=True, slots=True)
class Job:
    piece: Piece
    peer: str  # "" = origin
    url: str
    digest: str | None


class _Buffers:
    """Piece buffers a fill reuses (one per piece being received): the bytes land in memory
    already touched, not in a fresh allocation per piece."""

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


class Run:
    """The state of one fill: tasks under way, what to tell the tracker next."""

    def __init__(  # noqa: PLR0917
        self,
        fill: FillShell,
        source: Source,
        manifest: Manifest,
        pieces: tuple[Piece, ...],
        files: StagedFiles,
        on_bytes: Callable[[int], None],
        origin_only: frozenset[str] = frozenset(),
    ) -> None:
        self.fill, self.source, self.pieces, self.files = fill, source, pieces, files
        self.entries = {e.path: e for e in manifest.files}
        self.on_bytes = on_bytes
        self.origin_only = origin_only  # files that failed their digests in an earlier fill
        self.session_id = secrets.token_hex(8)
        self.report = Report()
        self.have: set[int] = set()
        self.tasks: dict[asyncio.Task[str | Exception], Job] = {}
        self.busy: set[int] = set()  # the pieces of ``tasks``
        self.withheld: dict[str, list[tuple[Piece, str | None]]] = {}  # until the file matches
        self.checked: set[str] = set()  # files whose digests matched
        self.hashed: dict[str, dict[int, str]] = {}  # path -> pieces -> the hashes reported
        self.hashes = {e.path: FrontHash(e) for e in manifest.files}
        self.buffers = _Buffers(max((p.size_bytes for p in pieces), default=0))
        self.staging = files.staging
        self.direct = direct_ranges(fill.config.piece_bytes)
        self.alone_until_s = 0.0  # monotonic; before it (the tracker did not answer): origin only
        self.asked_s = time.monotonic()  # the last report (the next renews after renew_s)

    async def run(self, key: str) -> None:
        failure: Exception | None = None
        async with asyncio.TaskGroup() as tg:
            try:
                await self._fill(key, tg)
            except Exception as err:  # raised once the group has ended the other fetches
                failure = err
                for task in self.tasks:
                    task.cancel()
        if failure is not None:
            raise failure

    async def _fill(self, key: str, tg: asyncio.TaskGroup) -> None:
        cfg = self.fill.config
        while len(self.have) < len(self.pieces):
            want = cfg.concurrency - len(self.tasks)
            if want > 0 or self._renew_in_s() <= 0:
                self._start(key, await self._plan(key, want), tg)
            if not self.tasks:
                await asyncio.sleep(cfg.idle_wait_s)
                continue
            wait_s = cfg.idle_wait_s
            if len(self.tasks) >= cfg.concurrency:
                wait_s = max(self._renew_in_s(), 0.0)
            done, _ = await asyncio.wait(
                self.tasks, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                self._finish(key, self.tasks.pop(task), task.result())
        await self.fill.ask(key, len(self.pieces), self.session_id, self.report, 0)

    def _under_way(self) -> list[int]:
        """The pieces this node's assignments still cover: fetches running, and pieces landed
        but held back until their file matches (origin only: not yet ``have``), which the
        tracker must not hand out again either."""
        held = {piece.index for pieces in self.withheld.values() for piece, _ in pieces}
        return sorted(self.busy | held)

    def _renew_in_s(self) -> float:
        """Until the next report is due with every slot busy (it renews the fetches)."""
        due = max(self.asked_s + self.fill.config.renew_s, self.alone_until_s)
        return due - time.monotonic()

    async def _plan(self, key: str, want: int) -> list[Job]:
        doc = None
        if time.monotonic() >= self.alone_until_s:
            self.report.fetching = self._under_way()
            self.asked_s = time.monotonic()
            doc = await self.fill.ask(key, len(self.pieces), self.session_id, self.report, want)
            if doc is None:
                self.alone_until_s = time.monotonic() + self.fill.config.tracker_retry_s
        if doc is None:  # alone: the next missing pieces from the origin
            taken = self.have | self.busy
            todo = [p for p in self.pieces if p.index not in taken]
            return [Job(p, "", "", None) for p in todo[:want]]
        self.report = Report()
        hashes = {int(k): str(v) for k, v in (doc.get("hashes") or {}).items()}
        jobs = []
        for a in doc.get("assignments") or []:
            index = int(a["piece"])
            if 0 <= index < len(self.pieces):
                peer = str(a.get("peer") or "")
                jobs.append(Job(self.pieces[index], peer, str(a.get("url") or ""),
                                hashes.get(index)))  # fmt: skip
        return jobs

    def _start(self, key: str, jobs: list[Job], tg: asyncio.TaskGroup) -> None:
        for job in jobs:
            index = job.piece.index
            if index in self.have or index in self.busy:  # handed out again: see the docstring
                continue
            if job.peer and job.piece.path in self.origin_only:
                job = Job(job.piece, "", "", None)
            elif job.peer and job.digest is None:  # never write a peer piece unchecked
                self.report.released.append(index)
                continue
            self.busy.add(index)
            self.tasks[tg.create_task(self._piece(key, job))] = job

    async def _piece(self, key: str, job: Job) -> str | Exception:
        """Fetch, check and write one piece: its hash, or what went wrong."""
        buf = self.buffers.take()
        try:
            outcome: str | Exception = await self._fetch_and_land(key, job, buf)
        except Exception as err:  # handed to _finish, which raises the fatal ones
            outcome = err
        self.buffers.give(buf)  # not when cancelled: a worker thread may still land from it
        return outcome

    async def _fetch_and_land(self, key: str, job: Job, buf: memoryview) -> str | Exception:
        piece = job.piece
        if job.peer:
            data = await self.fill.fetch_peer(key, job, buf)
        else:
            data = await self.fill.fetch_origin(self.source, self.entries[piece.path], piece, buf)
        digest = await asyncio.to_thread(self._land, piece, data, buf, job.digest)
        if digest is None:
            return PeerFailedError(f"{job.peer}: piece {piece.index} fails its hash", rejected=True)
        return digest

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

    def _finish(self, key: str, job: Job, outcome: str | Exception) -> None:
        piece = job.piece
        self.busy.discard(piece.index)
        if isinstance(outcome, PeerFailedError):
            self.report.failed.add(job.peer)
            self.report.released.append(piece.index)
            self.fill.dropped(outcome)
            return
        if isinstance(outcome, Exception):
            raise outcome
        self.have.add(piece.index)
        self.fill.written(piece.size_bytes, from_origin=not job.peer)
        self.on_bytes(piece.size_bytes)
        digest = None if job.peer else outcome  # the table has a peer piece's hash already
        if piece.path in self.origin_only:
            self.withheld.setdefault(piece.path, []).append((piece, digest))
        else:
            self._advertise(key, piece, digest)
        self._check_file(key, piece.path)

    def _advertise(self, key: str, piece: Piece, digest: str | None) -> None:
        """Tell the tracker (next plan) and the node's peers that ``piece`` is held here."""
        self.report.have.append(piece.index)
        if digest is not None:
            self.report.hashes[piece.index] = digest
            self.hashed.setdefault(piece.path, {})[piece.index] = digest
        self.fill.hold(key, piece)

    def _check_file(self, key: str, path: str) -> None:
        """Once every piece of ``path`` landed: its digests against the manifest's."""
        if path in self.checked:
            return
        got = self.hashes[path].digests()
        if got is None:
            return
        try:
            check_digests(self.entries[path], got)
        except IntegrityError as err:
            how = "taken from the origin only" if path in self.origin_only else (
                "a retry takes this file from the origin only")  # fmt: skip
            withdrawn = tuple(self.hashed.pop(path, {}).items())
            raise FileCheckError(f"{err} (peer fill: {how})", path, withdrawn) from err
        self.checked.add(path)
        for piece, digest in self.withheld.pop(path, []):
            self._advertise(key, piece, digest)

    def digests(self) -> Digests:
        out = {path: h.digests() for path, h in self.hashes.items()}
        return {path: d for path, d in out.items() if d is not None}
