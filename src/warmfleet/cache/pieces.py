"""Pieces of an artifact: the unit peers exchange and verify (pure).

A file of an artifact is cut into pieces of ``piece_bytes`` (the last one shorter; a file no
larger than one piece is one piece), numbered across the manifest's files in path order. A
piece's BLAKE3 digest is checked against the version's piece table before its bytes are written
or served; the whole-file digests of the manifest stay the gate of publication.

BLAKE3, not sha256, for the piece table: it is as collision-resistant for this use (a peer
cannot make another piece match a recorded digest), and ~3.5x faster on one core here (4.9
against 1.34 GB/s with SHA-NI), which matters because a peer fill hashes every byte twice: the
piece on arrival, the whole file against the manifest's digest (sha256, given by the origin).
"""

from __future__ import annotations

from dataclasses import dataclass

import blake3

from warmfleet.cache.manifest import Manifest

DEFAULT_PIECE_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes ``[start, end)`` of the file at ``path``; ``index`` numbers it in the artifact."""

    index: int
    path: str
    start: int
    end: int

    @property
    def size_bytes(self) -> int:
        return self.end - self.start


def plan_pieces(manifest: Manifest, piece_bytes: int = DEFAULT_PIECE_BYTES) -> tuple[Piece, ...]:
    """Every piece of ``manifest`` in order (an empty file has none: it is created empty)."""
    if piece_bytes <= 0:
        raise ValueError(f"piece_bytes must be positive, got {piece_bytes}")
    out: list[Piece] = []
    for entry in sorted(manifest.files, key=lambda e: e.path):
        for start in range(0, entry.size_bytes, piece_bytes):
            end = min(start + piece_bytes, entry.size_bytes)
            out.append(Piece(len(out), entry.path, start, end))
    return tuple(out)


def piece_digest(data: bytes | memoryview) -> str:
    """The BLAKE3 hex digest (256 bits) a piece table records for a piece's bytes."""
    return blake3.blake3(data).hexdigest()
