"""Verification that overlaps the download: each staged file is hashed front to back as soon
as its leading chunks are complete, reading back what was written (from the page cache), so
only the tail is left to hash when the last chunk lands."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from warmfleet.agent.digests import HASH_BLOCK_BYTES, new_hashers
from warmfleet.agent.staged_files import StagedFiles
from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.cache.transfer import ResumeState


class _FileHash:
    def __init__(self, entry: FileEntry) -> None:
        self.entry = entry
        self.hashers: dict[str, Any] = new_hashers(entry)
        self.offset = 0

    def hash_range(self, fd: int, end: int) -> None:
        buf = bytearray(HASH_BLOCK_BYTES)  # reused: no per-block allocation
        view = memoryview(buf)
        while self.offset < end:
            want = min(HASH_BLOCK_BYTES, end - self.offset)
            n = os.preadv(fd, [view[:want]], self.offset)
            if n <= 0:
                raise OSError(f"{self.entry.path}: short read at {self.offset}")
            for h in self.hashers.values():
                h.update(view[:n])
            self.offset += n


class InlineHasher:
    def __init__(
        self, manifest: Manifest, files: StagedFiles, chunk_bytes: int, state: ResumeState
    ) -> None:
        self._staged = files  # opened one at a time, through the bounded pool
        self._files = [_FileHash(e) for e in manifest.files]
        self._chunk_bytes = chunk_bytes
        self._state = state
        self._wake = asyncio.Event()
        self._closing = False

    def poke(self) -> None:
        self._wake.set()

    def _complete(self) -> bool:
        return all(f.offset >= f.entry.size_bytes for f in self._files)

    async def run(self) -> None:
        """Background task: never cancelled while a hash step runs (see ``finish``)."""
        self._wake.set()  # chunks done before a resume are hashed first
        while not self._complete() and not self._closing:
            await self._wake.wait()
            self._wake.clear()
            await self._advance()

    async def _advance(self) -> None:
        for fh in self._files:
            size = fh.entry.size_bytes
            end = fh.offset
            done = self._state.done.get(fh.entry.path, set())
            while end < size and end // self._chunk_bytes in done:
                end = min((end // self._chunk_bytes + 1) * self._chunk_bytes, size)
            if end > fh.offset:
                await asyncio.to_thread(self._hash, fh, end)

    def _hash(self, fh: _FileHash, end: int) -> None:
        self._staged.run(fh.entry.path, lambda fd: fh.hash_range(fd, end), write=False)

    async def finish(self, task: asyncio.Task[None]) -> dict[str, dict[str, str]]:
        """Stop the background task, hash whatever is left, return every file's digests."""
        self._closing = True
        self._wake.set()
        await task
        await self._advance()
        if not self._complete():
            raise RuntimeError("inline hashing finished with chunks missing")
        return {f.entry.path: {n: h.hexdigest() for n, h in f.hashers.items()} for f in self._files}
