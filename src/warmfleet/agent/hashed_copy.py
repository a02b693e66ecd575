"""Copy while hashing, for a source that can (``copy_hashed``: the local file system).

Each file is copied front to back by one worker at a time (files in parallel, up to
``download.concurrency``): every byte is read from the source once, fed to the file's sha256,
written to the staged file and read back and compared with what was read. A chunk staged by an
earlier attempt is read, hashed and compared but not written again. The sha256 is of bytes the
staged copy is known to equal, so it is the file's verified digest (what the published marker
records); no second hash pass over the staged copy is needed (docs/caching.md).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from warmfleet.agent.staged_files import StagedFiles
from warmfleet.cache.manifest import FileEntry
from warmfleet.cache.transfer import Chunk, ResumeState, TokenBucket, plan_chunks


class CopyHashed(Protocol):
    def __call__(
        self, entry: FileEntry, start: int, end: int, dst_fd: int, hasher: Any, *, write: bool
    ) -> int: ...


class HashedCopier:
    """``digests``: per file, the sha256 of the source bytes the staged copy was compared with."""

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
        self._sem = asyncio.Semaphore(max(concurrency, 1))
        self._limiter = limiter
        self._on_bytes = on_bytes
        self._on_chunk = on_chunk
        self._on_os_error = on_os_error
        self.digests: dict[str, dict[str, str]] = {}

    async def copy_file(self, entry: FileEntry) -> None:
        hasher = hashlib.sha256()
        async with self._sem:
            for chunk in plan_chunks(entry.path, entry.size_bytes, self._state.chunk_bytes):
                staged = self._state.is_done(chunk)  # by an earlier attempt: compared, kept
                if not staged and self._limiter is not None:
                    delay_s = self._limiter.reserve(chunk.length)
                    if delay_s > 0:
                        await asyncio.sleep(delay_s)
                n = await asyncio.to_thread(self._copy_chunk, entry, chunk, hasher, not staged)
                if not staged:
                    self._on_bytes(n)
                    self._on_chunk(chunk)
        self.digests[entry.path] = {"sha256": hasher.hexdigest()}

    def _copy_chunk(self, entry: FileEntry, chunk: Chunk, hasher: Any, write: bool) -> int:
        def copy(fd: int) -> int:
            return self._copy_hashed(entry, chunk.start, chunk.end, fd, hasher, write=write)

        try:
            return self._files.run(entry.path, copy, write=write)
        except OSError as err:
            self._on_os_error(err, "copying into the staged artifact")
