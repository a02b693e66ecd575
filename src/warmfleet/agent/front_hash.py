"""A staged file's digests computed front to back while its pieces land in any order.

A piece that lands at the cursor is hashed from memory (the buffer it was received into); a
piece that lands ahead of it is hashed once the gap before it is filled, from the page cache
through a read-only mapping (no copy into Python). So the digests a manifest gives are known
when the last piece lands, and the manager's verification only compares them.
"""

from __future__ import annotations

import mmap
import threading
from functools import partial
from typing import Any

from warmfleet.agent.digests import new_hashers
from warmfleet.agent.staged_files import StagedFiles
from warmfleet.cache.manifest import FileEntry
from warmfleet.cache.pieces import Piece


def _hash_back(hashers: list[Any], start: int, end: int, fd: int) -> None:
    """Feed bytes ``[start, end)`` of a staged file to ``hashers`` through a read-only mapping
    of its pages (already in the page cache: just written), without copying them out."""
    base = start - start % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, end - base, prot=mmap.PROT_READ, offset=base) as mapped:
        view = memoryview(mapped)
        try:
            for h in hashers:
                h.update(view[start - base :])
        finally:
            view.release()


class FrontHash:
    """A file's digests, fed front to back: a piece at the cursor from memory, pieces that
    landed ahead of it read back once the gap is filled. Thread-safe (pieces land in worker
    threads); a piece must be written before it is passed to ``advance``."""

    def __init__(self, entry: FileEntry) -> None:
        self.hashers: dict[str, Any] = new_hashers(entry)
        self.offset = 0
        self.size_bytes = entry.size_bytes
        self.ahead: dict[int, int] = {}  # start -> end of written pieces past the cursor
        self._lock = threading.Lock()

    def feed(self, data: bytes | memoryview) -> None:
        for h in self.hashers.values():
            h.update(data)
        self.offset += len(data)

    def advance(self, piece: Piece, data: bytes | memoryview, files: StagedFiles) -> None:
        with self._lock:
            if piece.start != self.offset:
                self.ahead[piece.start] = piece.end
                return
            self.feed(data)
            while (end := self.ahead.pop(self.offset, None)) is not None:
                hashers = list(self.hashers.values())
                files.run(piece.path, partial(_hash_back, hashers, self.offset, end), write=False)
                self.offset = end

    def digests(self) -> dict[str, str] | None:
        with self._lock:
            if self.offset != self.size_bytes:
                return None
            return {name: h.hexdigest() for name, h in self.hashers.items()}
