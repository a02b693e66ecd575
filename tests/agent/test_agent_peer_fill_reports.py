"""What a peer fill tells the tracker besides ``have``: the hashes it takes back when a file fails
the manifest's digests (``withdrawn``, sent with its leave), and the pieces it is still fetching
(``fetching``, every report, and every ``renew_s`` with every slot busy), so a slow fetch is
not handed to a second node. Against a real ``VersionTracker`` on a manual clock."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from peer_support import HeldOrigin
from prometheus_client import CollectorRegistry

from warmfleet.agent import peer_fill
from warmfleet.agent.peer_fill import PeerFill
from warmfleet.agent.peer_run import FileCheckError, Job, PeerConfig, Report
from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings
from warmfleet.agent.sources.base import Source
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.pieces import piece_digest
from warmfleet.control.tracker import PlanRequest, TrackerOptions, VersionTracker
from warmfleet.core.clock import ManualClock
from warmfleet.local.tracker_host import parse_request

PIECE = 4096


class _InProcessTracker:
    """``PeerFill.ask`` answered by a ``VersionTracker``; the body goes through the tracker
    host's wire parser (``parse_request``). ``before`` runs first."""

    def __init__(self, pieces: int, before: Callable[[dict[str, Any]], None]) -> None:
        self.clock = ManualClock()
        self.tracker = VersionTracker(pieces, self.clock, random.Random(0), TrackerOptions())
        self.before = before
        self.bodies: list[dict[str, Any]] = []

    async def ask(
        self, _key: str, pieces: int, session: str, report: Report, want: int
    ) -> dict[str, Any]:
        body = {"node": "n", "url": "http://n", "session": session, "pieces": pieces,
                "want": want, **report.body()}  # fmt: skip
        self.bodies.append(body)
        self.before(body)
        _, req = parse_request(body)
        plan = self.tracker.plan(req)
        return {
            "assignments": [{"piece": a.piece, "peer": a.peer} for a in plan.assignments],
            "hashes": {str(k): v for k, v in plan.hashes.items()},
        }


class _Stalling:
    """A tracker's ``before``: once ``origin``'s held fetch has started, every ask moves the
    tracker's clock past its 60 s stall bound; after three such asks the origin answers."""

    def __init__(self, origin: HeldOrigin | _Origin) -> None:
        self.origin = origin
        self.stalls = 0
        self.tracker: _InProcessTracker | None = None

    def __call__(self, _body: dict[str, Any]) -> None:
        if self.stalls == 3:
            self.origin.release.set()
        elif self.origin.started.is_set():
            assert self.tracker is not None
            self.tracker.clock.advance(61.0)
            self.stalls += 1


def _fill(ask: Callable[..., Any], **config: Any) -> PeerFill:
    cfg = PeerConfig("http://t", "n", "http://n", "token", piece_bytes=PIECE, **config)
    fill = PeerFill(
        dataclasses.replace(cfg, idle_wait_s=0.001),
        cast("aiohttp.ClientSession", None),  # every call that would use it is replaced
        PeerHoldings(),
        PeerCounters(CollectorRegistry()),
    )
    fill.ask = ask  # type: ignore[method-assign]  # the tracker's answers
    return fill


class _Origin:
    """Serves ``data`` with piece 0's first byte flipped (unless ``flip`` is False); the last
    piece waits for ``release``."""

    kind = SourceKind.HTTP

    def __init__(self, data: bytes, *, flip: bool = True) -> None:
        self.data = data
        self.flip = flip
        self.opened = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        self.opened += 1
        body = bytearray(self.data[start:end])
        if start == 0 and self.flip:
            body[0] ^= 0xFF
        if end == len(self.data):
            self.started.set()
            await self.release.wait()
        yield bytes(body)


def _manifest(data: bytes) -> Manifest:
    entry = FileEntry("f.bin", len(data), "/x", sha256=hashlib.sha256(data).hexdigest())
    return Manifest(SourceKind.HTTP, "http://o/f", (entry,))


async def test_a_file_that_fails_its_digest_withdraws_the_hashes_it_reported(
    tmp_path: Path,
) -> None:
    """Pieces 0 (corrupt) and 1 are reported before the last piece lands and the file fails:
    the leave takes their hashes back, so the good copy's hash is the one the table keeps."""
    data = os.urandom(3 * PIECE)
    origin = _Origin(data)

    def before(_body: dict[str, Any]) -> None:
        if {0, 1} <= tracker.tracker.table.keys():
            origin.release.set()  # both hashes are in: now the last piece, and the check

    tracker = _InProcessTracker(3, before)
    fill = _fill(tracker.ask)
    (tmp_path / "staging").mkdir()
    landed: list[int] = []
    with pytest.raises(FileCheckError):
        await fill.download(cast("Source", origin), _manifest(data), tmp_path / "staging",
                            landed.append)  # fmt: skip
    vt = tracker.tracker
    assert vt.table == {}
    leave = tracker.bodies[-1]
    assert sorted(leave["withdrawn"]) == [0, 1, 2]  # 2's hash was never sent: a no-op
    sent = {k: v for body in tracker.bodies[:-1] for k, v in body["hashes"].items()}
    assert leave["withdrawnHashes"] == {str(i): sent[str(i)] for i in (0, 1)} | {
        "2": piece_digest(data[2 * PIECE :])
    }  # each with the hash this fill reported (or computed: 2's)
    assert vt.stats().withdrawn == 2
    assert [vt.holders(i) for i in range(3)] == [[], [], []]
    good = piece_digest(data[:PIECE])
    vt.plan(PlanRequest("m", "http://m", "s", have=(0,), hashes=((0, good),)))  # a good copy
    assert vt.table == {0: good}


class _FlipSecond:
    """An origin serving ``data`` with the second piece's first byte flipped."""

    kind = SourceKind.HTTP

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        body = bytearray(self.data[start:end])
        if start == PIECE:
            body[0] ^= 0xFF
        yield bytes(body)


async def test_a_failed_file_withdraws_only_the_hashes_this_node_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The withdrawal is as precise as a whole-file digest allows: piece 0 came from peer m,
    checked against m's hash before it was written, and this node never reported a hash for
    it, so only the hashes of its own origin pieces (1, corrupt, and 2, good: a sha256 of the
    whole file cannot tell which) are taken back, every one it sent; m's stays in the table."""
    data = os.urandom(3 * PIECE)
    tracker = _InProcessTracker(3, lambda _body: None)
    vt = tracker.tracker
    vt.plan(PlanRequest("m", "http://m", "s", want=1))  # m takes piece 0 from the origin
    good = piece_digest(data[:PIECE])
    vt.plan(PlanRequest("m", "http://m", "s", have=(0,), hashes=((0, good),)))
    fill = _fill(tracker.ask)
    from_peers: list[int] = []

    async def fetch_peer(_key: str, job: Job, buf: memoryview) -> memoryview:
        from_peers.append(job.piece.index)
        buf[: job.piece.size_bytes] = data[job.piece.start : job.piece.end]
        return buf[: job.piece.size_bytes]

    monkeypatch.setattr(fill, "fetch_peer", fetch_peer)  # m's bytes, not over HTTP
    (tmp_path / "staging").mkdir()
    with pytest.raises(FileCheckError):
        await fill.download(cast("Source", _FlipSecond(data)), _manifest(data),
                            tmp_path / "staging", lambda _n: None)  # fmt: skip
    assert from_peers == [0]
    *fill_bodies, leave = tracker.bodies
    withdrawn = set(leave["withdrawn"])
    sent = {int(i) for body in fill_bodies for i in body["hashes"]}
    assert sent <= withdrawn <= {1, 2}  # whichever landed before the check (1 or 2 may not)
    assert withdrawn
    assert vt.table.get(0) == good
    assert vt.reporter.get(0) == "m"


async def test_a_landed_piece_held_back_until_its_file_matches_is_renewed(
    tmp_path: Path,
) -> None:
    """The retry of a file that failed its digests takes it from the origin only and reports
    its pieces once the file matches: until then a landed piece is neither ``have`` nor being
    fetched, yet still this node's assignment, so it is listed in ``fetching`` (else the stall
    bound hands it out again, holding an origin stream for a fetch nobody makes)."""
    data = os.urandom(2 * PIECE)
    origin = _Origin(data)
    stalling = _Stalling(origin)
    tracker = stalling.tracker = _InProcessTracker(2, stalling)
    fill = _fill(tracker.ask, concurrency=2)
    staging = tmp_path / "staging"
    staging.mkdir()
    origin.release.set()
    with pytest.raises(FileCheckError):
        await fill.download(cast("Source", origin), _manifest(data), staging, lambda _n: None)
    released = tracker.tracker.stats().released
    origin = stalling.origin = _Origin(data, flip=False)  # the retry: piece 1 is slow
    async with asyncio.timeout(60):  # a hang guard, not a measure
        await fill.download(cast("Source", origin), _manifest(data), staging, lambda _n: None)
    assert (staging / "f.bin").read_bytes() == data
    assert stalling.stalls == 3
    assert tracker.tracker.stats().released == released  # nothing handed out again
    assert any(body["fetching"] == [0, 1] for body in tracker.bodies)


async def _slow_origin_fill(tmp_path: Path, **config: Any) -> _InProcessTracker:
    """One piece whose origin fetch spans three asks, each 61 s (past the tracker's 60 s
    stall bound) after the one before."""
    data = os.urandom(3000)
    held = HeldOrigin(data)
    stalling = _Stalling(held)
    tracker = stalling.tracker = _InProcessTracker(1, stalling)
    fill = _fill(tracker.ask, **config)
    (tmp_path / "staging").mkdir()
    manifest = Manifest(SourceKind.HTTP, "http://o/f", (FileEntry("f.bin", len(data), "/x"),))
    async with asyncio.timeout(60):  # a hang guard, not a measure
        await fill.download(cast("Source", held), manifest, tmp_path / "staging", lambda _n: None)
    assert held.opened == 1
    assert (tmp_path / "staging" / "f.bin").read_bytes() == data
    return tracker


async def test_a_slow_origin_piece_is_renewed_not_handed_out_again(tmp_path: Path) -> None:
    tracker = await _slow_origin_fill(tmp_path, concurrency=2)
    assert tracker.tracker.stats().released == 0
    assert tracker.tracker.stats().origin_assignments == 1
    assert any(body["fetching"] == [0] for body in tracker.bodies)


async def test_with_every_slot_busy_the_fill_still_renews(tmp_path: Path) -> None:
    """``concurrency=1``: no slot is free while the piece is fetched, so only the renewal
    reports (``renew_s=0``: at every turn); the old loop waited for the fetch, unreported."""
    tracker = await _slow_origin_fill(tmp_path, concurrency=1, renew_s=0.0)
    assert tracker.tracker.stats().released == 0
    renewals = [b for b in tracker.bodies if b["want"] == 0 and b["fetching"] == [0]]
    assert len(renewals) >= 3


async def test_a_long_withdrawal_is_sent_in_batches_under_one_leave_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_fill, "WITHDRAWN_PER_REPORT", 2)
    asked: list[tuple[str, dict[int, str], int]] = []

    async def ask(_key: str, _pieces: int, session: str, report: Report, want: int) -> None:
        asked.append((session, report.withdrawn, want))

    fill = _fill(ask)
    withdrawn = tuple((i, f"h{i}") for i in range(5))
    await fill._leave("k", 9, FileCheckError("bad", "f.bin", withdrawn))
    assert [w for _, w, _ in asked] == [{0: "h0", 1: "h1"}, {2: "h2", 3: "h3"}, {4: "h4"}]
    assert len({s for s, _, _ in asked}) == 1
    assert {want for _, _, want in asked} == {0}
    asked.clear()
    await fill._leave("k", 9, RuntimeError("not a digest"))
    assert [w for _, w, _ in asked] == [{}]
