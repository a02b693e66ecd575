"""Peer fills when a piece goes wrong: a file whose staged bytes fail the manifest's digest (a
corrupt origin piece, or a piece table entry that describes corrupt bytes) is dropped at once and
taken from the origin only by the retry; a piece the tracker hands out again after its stall
bound while this node still fetches it is not fetched twice; an origin piece that trickles ends
(``TooSlowError``) instead of holding the fill."""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from cache_support import manager_for
from peer_support import PIECE, TOKEN, HeldOrigin, join, serving
from prometheus_client import CollectorRegistry

from harness.bad_peers import BadPeer
from harness.origin import Blob, Origin
from warmfleet.agent.direct_io import aligned_buffer
from warmfleet.agent.peer_fill import PeerFill
from warmfleet.agent.peer_run import PeerConfig
from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings
from warmfleet.agent.sources.base import Source, TooSlowError
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.pieces import piece_digest, plan_pieces
from warmfleet.control.tracker import PlanRequest, TrackerOptions, VersionTracker
from warmfleet.core.clock import ManualClock
from warmfleet.core.errors import IntegrityError
from warmfleet.local.config import PeersConfig
from warmfleet.local.tracker_host import TrackerHost, parse_request


async def test_a_file_that_fails_its_digest_leaves_the_tracker_and_says_so(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every origin body has its first byte flipped: the file never matches its sha256. The
    node stops serving it and the tracker stops listing it as a holder, the retry takes it from
    the origin only, and the error says so."""
    org, base = origin
    data = os.urandom(3 * PIECE)
    org.put("w.bin", Blob(data=data, flip=True))
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    host = TrackerHost(PeersConfig(enabled=True, piece_bytes=PIECE), TOKEN)
    await host.start()
    try:
        async with manager_for(tmp_path / "a") as a, serving(a) as (peers_a, url_a):
            join(peers_a, host, "a", url_a)
            with pytest.raises(IntegrityError) as failed:
                await a.prefetch(f"{base}/files/w.bin", name="w")
            (key,) = host.tracker.versions
            version = host.tracker.versions[key]
            assert [version.holders(i) for i in range(3)] == [[], [], []]
            assert not peers_a.holdings.has(key, "w.bin", 0, PIECE)
            final = r"w\.bin: sha256 .* taken from the origin only"  # the retry's failure
            assert re.search(final, str(failed.value))
    finally:
        await host.stop()


async def test_a_retry_takes_a_bad_file_from_the_origin_not_from_matching_peers(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The piece table describes corrupt bytes (as when it kept the hash of a corrupt origin
    piece) and a holder serves bytes that match it: the first attempt stages a bad file; the
    retry must not take the same pieces from that holder again."""
    org, base = origin
    data = os.urandom(4 * PIECE)
    org.put("w.bin", Blob(data=data))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "w.bin").write_bytes(data)
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    host = TrackerHost(PeersConfig(enabled=True, piece_bytes=PIECE, origin_streams=1), TOKEN)
    await host.start()
    bad = BadPeer("bad-flip", "flip", tmp_path / "files")
    await bad.start()
    try:
        async with manager_for(tmp_path / "b") as b, serving(b) as (peers_b, url_b):
            uri = f"{base}/files/w.bin"
            manifest = await b.resolve(uri, None)
            pieces = plan_pieces(manifest, PIECE)
            flipped = []
            for p in pieces:
                body = bytearray(data[p.start : p.end])
                body[len(body) // 2] ^= 0xFF  # what BadPeer "flip" sends
                flipped.append((p.index, piece_digest(bytes(body))))
            everything = tuple(range(len(pieces)))
            host.tracker.plan(manifest.key(), len(pieces), PlanRequest(
                bad.name, bad.url, bad.name, have=everything, hashes=tuple(flipped)))  # fmt: skip
            join(peers_b, host, "b", url_b)
            rec = await b.prefetch(uri, name="w")
            assert bad.requests >= 1  # the first attempt took its pieces
            assert (b.store.object_dir(rec.key) / "w.bin").read_bytes() == data
    finally:
        await bad.stop()
        await host.stop()


class _InProcessTracker:
    """``PeerFill.ask`` answered by a real ``VersionTracker`` on a manual clock: once the held
    origin fetch has started, the clock passes the tracker's stall bound (60 s) at the next plan
    (the tracker releases the piece and hands it out again: it plays one that predates the
    renewal of ``fetching`` assignments, which it is not shown); the plan after that lets the
    origin answer."""

    def __init__(self, pieces: int, held: HeldOrigin) -> None:
        self.clock = ManualClock()
        self.tracker = VersionTracker(pieces, self.clock, random.Random(0), TrackerOptions())
        self.held = held
        self.stalled = False

    async def ask(
        self, _key: str, pieces: int, session: str, report: Any, want: int
    ) -> dict[str, Any]:
        if self.stalled:
            self.held.release.set()
        elif self.held.started.is_set():
            self.clock.advance(61.0)
            self.stalled = True
        body = {"node": "n", "url": "http://n", "session": session, "pieces": pieces,
                "want": want, **report.body()}  # fmt: skip
        body.pop("fetching", None)
        _, req = parse_request(body)
        plan = self.tracker.plan(req)
        return {
            "assignments": [{"piece": a.piece, "peer": a.peer} for a in plan.assignments],
            "hashes": {str(k): v for k, v in plan.hashes.items()},
        }


def _fill(**config: Any) -> PeerFill:
    return PeerFill(
        PeerConfig("http://t", "n", "http://n", TOKEN, **config),
        cast("aiohttp.ClientSession", None),  # every call that would use it is replaced
        PeerHoldings(),
        PeerCounters(CollectorRegistry()),
    )


async def test_a_piece_handed_out_again_after_the_stall_bound_is_fetched_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(3000)
    manifest = Manifest(SourceKind.HTTP, "http://o/f", (FileEntry("f.bin", len(data), "/x"),))
    held = HeldOrigin(data)
    tracker = _InProcessTracker(1, held)
    fill = _fill(piece_bytes=4096, idle_wait_s=0.001)
    monkeypatch.setattr(fill, "ask", tracker.ask)
    (tmp_path / "staging").mkdir()
    got: list[int] = []
    digests = await fill.download(cast("Source", held), manifest, tmp_path / "staging", got.append)
    assert tracker.tracker.stats().released == 1  # the tracker did hand the piece out again
    assert held.opened == 1  # ... but the node did not fetch it a second time
    assert sum(got) == len(data)
    assert (tmp_path / "staging" / "f.bin").read_bytes() == data
    assert "f.bin" in digests


class _TricklingOrigin:
    kind = SourceKind.HTTP

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        yield b"x"
        await asyncio.Event().wait()  # then nothing, for ever (the connection stays open)


async def test_a_trickling_origin_piece_fails_as_too_slow() -> None:
    entry = FileEntry("f.bin", 3000, "/x")
    (piece,) = plan_pieces(Manifest(SourceKind.HTTP, "http://o/f", (entry,)), 4096)
    fill = _fill(origin_min_bps=1000.0, origin_low_speed_s=0.05)
    async with asyncio.timeout(60):  # a hang guard, not a measure: the old code never returned
        with pytest.raises(TooSlowError, match=r"f\.bin"):
            await fill.fetch_origin(
                cast("Source", _TricklingOrigin()), entry, piece, aligned_buffer(4096)
            )
