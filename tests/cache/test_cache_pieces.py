"""Pieces cover every byte of every file exactly once, in order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.pieces import piece_digest, plan_pieces


@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=5),
    piece_bytes=st.integers(1, 2048),
)
def test_pieces_tile_the_files(sizes: list[int], piece_bytes: int) -> None:
    files = tuple(FileEntry(f"f{i}", size, f"/x/{i}") for i, size in enumerate(sizes))
    manifest = Manifest(SourceKind.HTTP, "http://o/m", files)
    pieces = plan_pieces(manifest, piece_bytes)
    assert [p.index for p in pieces] == list(range(len(pieces)))
    for entry in files:
        mine = [p for p in pieces if p.path == entry.path]
        assert sum(p.size_bytes for p in mine) == entry.size_bytes
        assert all(0 < p.size_bytes <= piece_bytes for p in mine)
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert not mine or (mine[0].start == 0 and mine[-1].end == entry.size_bytes)


def test_bad_piece_size_and_digest() -> None:
    manifest = Manifest(SourceKind.HTTP, "http://o/m", (FileEntry("a", 3, "/a"),))
    with pytest.raises(ValueError, match="positive"):
        plan_pieces(manifest, 0)
    assert piece_digest(b"abc").startswith("6437b3ac")  # BLAKE3's test vector for "abc"
