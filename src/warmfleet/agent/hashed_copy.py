"""Copy while hashing, for a source that can (``copy_hashed``: the local file system).

Every chunk of every file is a job; ``download.concurrency`` workers take them in order, so
the chunks of one large file are copied and hashed on every core at once, with several
writes in flight (and small files alongside). A job reads its source range once, hashes it
and writes it (``sources.local_copy``). A chunk staged by an earlier attempt is read back,
compared and hashed but not written again. A file's digest is its piece tree over the chunks
(``digests.TREE``, the chunk size as the piece size): the verified digest the published marker
records, no second hash pass over the staged copy (docs/cache.md, "Local sources").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NoReturn, Protocol

from warmfleet.agent.digests import TREE, tree_value
from warmfleet.agent.direct_io import direct_ranges
from warmfleet.agent.staged_files import StagedFiles
from warmfleet.cache.manifest import FileEntry
from warmfleet.cache.transfer import Chunk, ResumeState, TokenBucket, plan_chunks


class CopyHashed(Protocol):
    def __call__(
        self, entry: FileEntry, start: int, end: int, dst_fd: int, *, write: bool, direct: bool
    ) -> bytes: ...


class HashedCopier:
    """``digests``: per file, the piece tree of the staged bytes (shown equal to the source)."""

    def __init__(
        self,
        copy_hashed: CopyHashed,
        files: StagedFiles,
        state: ResumeState,
        *,
        concurrency: int,
        limiter: TokenBucket | None,
        on_bytes: Callable[[int], None],
        on_chunk: Callable[[Chunk], None],
        on_os_error: Callable[[OSError, str], NoReturn],
    ) -> None:
        self._copy_hashed = copy_hashed
        self._files = files
        self._state = state
        self._concurrency = max(concurrency, 1)
        self._limiter = limiter
        self._on_bytes = on_bytes
        self._on_chunk = on_chunk
        self._on_os_error = on_os_error
        self.digests: dict[str, dict[str, str]] = {}
        self._direct = direct_ranges(state.chunk_bytes)

    async def copy_all(self, entries: list[FileEntry]) -> None:
        """Copy every file; ``digests`` then holds each one's piece tree."""
        by_path = {e.path: e for e in entries}
        chunk_bytes = self._state.chunk_bytes
        chunks = {e.path: plan_chunks(e.path, e.size_bytes, chunk_bytes) for e in entries}
        pieces: dict[str, list[bytes]] = {p: [b""] * len(c) for p, c in chunks.items()}
        todo = iter([c for file_chunks in chunks.values() for c in file_chunks])

        async def worker() -> None:
            for chunk in todo:  # shared iterator: each chunk goes to one worker
                pieces[chunk.path][chunk.index] = await self._copy_chunk(by_path[chunk.path], chunk)

        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(self._concurrency):
                    tg.create_task(worker())
        except* Exception as group:  # the first failure itself, not a group
            raise group.exceptions[0] from None
        self.digests = {p: {TREE: tree_value(chunk_bytes, d)} for p, d in pieces.items()}

    async def _copy_chunk(self, entry: FileEntry, chunk: Chunk) -> bytes:
        staged = self._state.is_done(chunk)  # by an earlier attempt: checked, kept
        if not staged and self._limiter is not None:
            delay_s = self._limiter.reserve(chunk.length)
            if delay_s > 0:
                await asyncio.sleep(delay_s)
        digest = await asyncio.to_thread(self._run, entry, chunk, not staged)
        if not staged:
            self._on_bytes(chunk.length)
            self._on_chunk(chunk)
        return digest

    def _run(self, entry: FileEntry, chunk: Chunk, write: bool) -> bytes:
        def copy(fd: int) -> bytes:
            return self._copy_hashed(
                entry, chunk.start, chunk.end, fd, write=write, direct=self._direct
            )

        try:
            return self._files.run(entry.path, copy, write=write)
        except OSError as err:
            self._on_os_error(err, "copying into the staged artifact")
