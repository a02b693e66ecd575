"""Peer fills between two in-process agents (their piece routes on 127.0.0.1) and the embedded
fleet's tracker: the first node takes every piece from the origin once, the second takes them
from the first; a peer serving flipped bytes has its pieces rejected before they are written;
the piece route needs the fleet's token and serves only verified pieces."""

from __future__ import annotations

import hashlib
import os
from functools import partial
from pathlib import Path
from typing import cast

import aiohttp
import pytest
import yarl
from cache_support import manager_for
from peer_support import PIECE, TOKEN, join, serving

from harness.bad_peers import BadPeer, advertise
from harness.origin import Blob, Origin
from warmfleet.agent.direct_io import BLOCK_BYTES, DirectFile, aligned_buffer
from warmfleet.agent.front_hash import FrontHash
from warmfleet.agent.peer_fill import PeerFill
from warmfleet.agent.peer_run import PeerConfig, Run
from warmfleet.agent.sources.base import Source
from warmfleet.agent.staged_files import StagedFiles
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.pieces import plan_pieces
from warmfleet.local.config import PeersConfig
from warmfleet.local.tracker_host import TrackerHost


async def test_second_node_fills_from_the_first_and_rejects_a_flipping_peer(
    origin: tuple[Origin, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    org, base = origin
    data = os.urandom(3 * PIECE + 1000)
    org.put("w.bin", Blob(data=data))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "w.bin").write_bytes(data)
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    host = TrackerHost(PeersConfig(enabled=True, piece_bytes=PIECE), TOKEN)
    await host.start()
    bad = BadPeer("bad-flip", "flip", tmp_path / "files")
    await bad.start()
    try:
        async with (
            manager_for(tmp_path / "a") as a,
            manager_for(tmp_path / "b") as b,
            serving(a) as (peers_a, url_a),
            serving(b) as (peers_b, url_b),
        ):
            join(peers_a, host, "a", url_a)
            rec_a = await a.prefetch(f"{base}/files/w.bin", name="w")
            assert peers_a.figures["bytesFromOrigin"] == len(data)
            assert org.bytes_served == len(data)
            assert advertise(host.tracker, [bad]) == 1
            join(peers_b, host, "b", url_b)
            rec_b = await b.prefetch(f"{base}/files/w.bin", name="w")
            assert rec_b.key == rec_a.key
            assert org.bytes_served == len(data)  # the origin served the model once
            figures = peers_b.figures
            assert figures["bytesFromPeers"] == len(data)
            assert figures["piecesRejected"] >= 1
            assert bad.requests >= 1
            published = b.store.object_dir(rec_b.key) / "w.bin"
            assert published.read_bytes() == data
            assert peers_a.figures["bytesServed"] >= len(data)
            await _route_checks(url_a, rec_a.key)
            served_errors = [r for r in caplog.records if r.name.startswith("aiohttp")]
            assert not served_errors  # every piece served without an error logged
    finally:
        await bad.stop()
        await host.stop()


async def _route_checks(url: str, key: str) -> None:
    piece = f"{url}/v1/peer/{key}/w.bin"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(piece, headers={"Range": "bytes=0-9"}) as resp:
            assert resp.status == 401  # a GET, but only for the fleet
        async with http.get(piece, headers={**auth, "Range": "bytes=0-9"}) as resp:
            assert resp.status == 206
            assert len(await resp.read()) == 10
        async with http.get(f"{url}/v1/peer/{'0' * 64}/w.bin", headers={**auth,
                            "Range": "bytes=0-9"}) as resp:  # fmt: skip
            assert resp.status == 404  # nothing held under that key
        async with http.get(f"{url}/v1/peer/{key}/../x", headers={**auth,
                            "Range": "bytes=0-9"}) as resp:  # fmt: skip
            assert resp.status == 404
        for odd in ("bytes=\u0660-\u0661", "bytes=+0-9", "bytes=0_0-9", "bytes=0-9,20-29"):
            async with http.get(piece, headers={**auth, "Range": odd}) as resp:
                assert resp.status == 416, odd  # one range, in ASCII digits
        async with http.get(piece, headers=auth) as resp:
            assert resp.status == 400  # no Range at all
        async with http.get(piece, headers={**auth, "Range": "bytes=0-99999999"}) as resp:
            assert resp.status == 416
            assert resp.headers["Content-Range"].startswith("bytes */")
        nul = yarl.URL(f"{url}/v1/peer/{key}/w%00.bin", encoded=True)
        async with http.get(nul, headers={**auth, "Range": "bytes=0-9"}) as resp:
            assert resp.status == 404  # os.stat refused the NUL: a 500
        for _ in range(2):  # a HEAD's bytes after its head garbled the next answer on the link
            async with http.head(piece, headers={**auth, "Range": "bytes=0-9"}) as resp:
                assert (resp.status, resp.headers["Content-Length"]) == (206, "10")
            async with http.get(piece, headers={**auth, "Range": "bytes=10-19"}) as resp:
                assert resp.status == 206
                assert len(await resp.read()) == 10


@pytest.mark.parametrize("piece_bytes", [3000, 8192])
def test_file_hash_front_to_back_with_pieces_out_of_order(tmp_path: Path, piece_bytes: int) -> None:
    """Pieces written through ``DirectFile`` (8 KiB: the aligned part with ``O_DIRECT``, the
    short tail buffered; 3000 B: unaligned, all buffered) and read back by it for the hash."""
    data = os.urandom(3 * piece_bytes + 1000)
    entry = FileEntry("f.bin", len(data), "/x")
    pieces = plan_pieces(Manifest(SourceKind.HTTP, "http://o/f", (entry,)), piece_bytes)
    (tmp_path / "f.bin").write_bytes(bytes(len(data)))
    buf = aligned_buffer(piece_bytes + 2 * BLOCK_BYTES)
    fh = FrontHash(entry)
    with DirectFile(tmp_path / "f.bin") as out:
        for piece in (pieces[2], pieces[0], pieces[3], pieces[1]):
            buf[: piece.size_bytes] = data[piece.start : piece.end]
            out.write(buf[: piece.size_bytes], piece.start)
            assert fh.digests() is None or piece is pieces[1]
            fh.advance(piece, buf[: piece.size_bytes], partial(out.read_into, buf))
    assert fh.digests() == {"sha256": hashlib.sha256(data).hexdigest()}
    assert (tmp_path / "f.bin").read_bytes() == data


class _Tracker:
    """``PeerFill.ask`` stand-in: no answer for the first ``silent`` calls, then one origin
    assignment of piece 1."""

    def __init__(self, silent: int, retry_s: float) -> None:
        self.calls = 0
        self.silent = silent
        self.config = PeerConfig("http://t", "n", "http://n", TOKEN, tracker_retry_s=retry_s)

    async def ask(self, *_args: object) -> dict[str, object] | None:
        self.calls += 1
        if self.calls <= self.silent:
            return None
        return {"assignments": [{"piece": 1, "peer": ""}]}


async def test_an_unanswered_plan_goes_alone_then_asks_the_tracker_again(tmp_path: Path) -> None:
    entry = FileEntry("f.bin", 9000, "/x")
    manifest = Manifest(SourceKind.HTTP, "http://o/f", (entry,))
    pieces = plan_pieces(manifest, 3000)
    files = StagedFiles(tmp_path, 4)
    for retry_s, asks in ((0.0, 2), (3600.0, 1)):
        tracker = _Tracker(silent=1, retry_s=retry_s)
        run = Run(cast("PeerFill", tracker), cast("Source", None), manifest, pieces, files,
                   lambda _n: None)  # fmt: skip
        alone = await run._plan("k", 2)
        assert [j.piece.index for j in alone] == [0, 1]  # origin only, in order
        assert all(j.peer == "" for j in alone)
        again = await run._plan("k", 2)
        assert tracker.calls == asks  # asked again once the retry time passed, not before
        want = [1] if asks == 2 else [0, 1]  # the tracker's plan, or still alone
        assert [j.piece.index for j in again] == want
