"""A staged file's digests computed front to back while its pieces land in any order.

A piece that lands at the cursor is hashed from memory (the buffer it was received into); a
piece that lands ahead of it is hashed once the gap before it is filled, read back by the
caller's ``read_back`` (the peer fill reads it from disk with ``O_DIRECT`` into the buffer the
piece came in). So the digests a manifest gives are known when the last piece lands, and the
manager's verification only compares them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from warmfleet.agent.digests import new_hashers
from warmfleet.cache.manifest import FileEntry
from warmfleet.cache.pieces import Piece


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

    def advance(
        self,
        piece: Piece,
        data: bytes | memoryview,
        read_back: Callable[[int, int], bytes | memoryview],
    ) -> None:
        """``piece`` (written) with its bytes ``data``; ``read_back(start, end)`` returns
        written bytes of the file (called after ``data`` is fed: it may reuse its buffer)."""
        with self._lock:
            if piece.start != self.offset:
                self.ahead[piece.start] = piece.end
                return
            self.feed(data)
            while (end := self.ahead.pop(self.offset, None)) is not None:
                self.feed(read_back(self.offset, end))

    def digests(self) -> dict[str, str] | None:
        with self._lock:
            if self.offset != self.size_bytes:
                return None
            return {name: h.hexdigest() for name, h in self.hashers.items()}
