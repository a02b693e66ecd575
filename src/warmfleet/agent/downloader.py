"""Parallel, resumable, rate-limited chunk downloader into a staging directory.

Every chunk is written with ``pwrite`` at its offset. A chunk is recorded as done in the
progress file only after the data file has been ``fsync``ed, so after a crash (kill -9 or
power loss) every chunk the progress file lists is really on disk; the rest is fetched again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from warmfleet.agent.inline_hash import InlineHasher
from warmfleet.agent.sources.base import (
    DiskFullError,
    Source,
    TransientSourceError,
)
from warmfleet.cache.config import DownloadSpec
from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.cache.transfer import Backoff, Chunk, ResumeState, TokenBucket, plan_chunks
from warmfleet.core.clock import Clock
from warmfleet.core.errors import CacheError, WarmfleetError

PROGRESS_FILE = ".warmfleet-progress.json"
WRITE_BLOCK_BYTES = 4 << 20
MAX_IOV = 512  # well under IOV_MAX (1024 on Linux)
MAX_RETRY_AFTER_S = 120.0  # an origin's Retry-After is honoured up to this


def atomic_write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("w") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_resume(staging: Path, key: str, chunk_bytes: int) -> ResumeState:
    try:
        data = json.loads((staging / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return ResumeState(key, chunk_bytes)
    return ResumeState.from_json(data, key=key, chunk_bytes=chunk_bytes)


def _raise_os(err: OSError, what: str) -> NoReturn:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(f"disk full while {what}: {err}") from err
    raise CacheError(f"I/O error while {what}: {err}") from err


def _pinned(entry: FileEntry) -> bool:
    """The entry names one version of its object (a validator or a digest), so chunks staged
    by an earlier attempt can be reused: a changed object has another key or is refused."""
    return entry.has_digest() or any((entry.etag, entry.version_id, entry.last_modified))


def _ignore(_: object) -> None:
    return None


def _pwritev_all(fd: int, blocks: list[bytes], offset: int) -> None:
    """One vectored write (no joining copies); finishes a short write block by block."""
    done = os.pwritev(fd, blocks, offset)
    for block in blocks:
        if done >= len(block):
            done -= len(block)
            offset += len(block)
            continue
        view = memoryview(block)[done:]
        offset += done
        done = 0
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n


class Downloader:
    """Downloads one manifest into ``staging``; ``on_bytes`` gets every written byte count
    (negative when a failed chunk is thrown away)."""

    def __init__(
        self,
        spec: DownloadSpec,
        clock: Clock,
        *,
        limiter: TokenBucket | None = None,
        rng: random.Random | None = None,
        on_bytes: Callable[[int], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self._spec = spec
        self._clock = clock
        self._limiter = limiter
        self._rng = rng or random.Random(0)
        self._on_bytes = on_bytes or _ignore
        self._on_retry = on_retry or _ignore
        self._backoff = Backoff(spec.backoff_base_s, spec.backoff_cap_s, spec.max_attempts)
        self._flush_lock = threading.Lock()
        self.digests: dict[str, dict[str, str]] = {}  # per file, hashed while downloading

    async def download(self, source: Source, manifest: Manifest, staging: Path) -> None:
        key = manifest.key()
        chunk_bytes = self._spec.chunk if source.supports_ranges(manifest) else 1 << 62
        if all(_pinned(entry) for entry in manifest.files):
            state = load_resume(staging, key, chunk_bytes)
        else:  # nothing tells whether staged chunks are of the same version: start over
            state = ResumeState(key, chunk_bytes)
        fds: dict[str, int] = {}
        try:
            todo: list[Chunk] = []
            for entry in manifest.files:
                fds[entry.path] = self._open_staged(staging, entry.path, entry.size_bytes)
                for chunk in plan_chunks(entry.path, entry.size_bytes, chunk_bytes):
                    if state.is_done(chunk):
                        self._on_bytes(chunk.length)
                    else:
                        todo.append(chunk)
            await self._run(
                source=source, manifest=manifest, staging=staging, state=state, fds=fds, todo=todo
            )
        finally:
            for fd in fds.values():
                os.close(fd)

    def _open_staged(self, staging: Path, rel: str, size: int) -> int:
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            if self._spec.preallocate and size > 0:
                os.posix_fallocate(fd, 0, size)
        except OSError as err:
            os.close(fd)
            _raise_os(err, f"allocating {size} bytes for {rel}")
        return fd

    async def _run(
        self,
        *,
        source: Source,
        manifest: Manifest,
        staging: Path,
        state: ResumeState,
        fds: dict[str, int],
        todo: list[Chunk],
    ) -> None:
        entries = {e.path: e for e in manifest.files}
        queue: asyncio.Queue[Chunk] = asyncio.Queue()
        for chunk in todo:
            queue.put_nowait(chunk)
        dirty = asyncio.Event()
        finished = asyncio.Event()
        hasher = InlineHasher(manifest, fds, state.chunk_bytes, state)

        async def worker() -> None:
            while not queue.empty():
                chunk = queue.get_nowait()
                await self._fetch_chunk(source, entries[chunk.path], chunk, fds[chunk.path])
                state.mark(chunk)
                dirty.set()
                hasher.poke()

        async def flusher() -> None:
            while not finished.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), self._spec.fsync_every_s)
                if dirty.is_set() and not finished.is_set():
                    dirty.clear()
                    await asyncio.to_thread(self._flush, staging, state, fds)

        try:
            async with asyncio.TaskGroup() as tg:
                flush_task = tg.create_task(flusher())
                hash_task = tg.create_task(hasher.run())
                workers = [tg.create_task(worker()) for _ in range(self._spec.concurrency)]
                await asyncio.gather(*workers)
                finished.set()
                await flush_task  # never cancelled mid-write: it exits on `finished`
                self.digests = await hasher.finish(hash_task)
        except* WarmfleetError as group:
            await self._flush_quietly(staging, state, fds)
            raise group.exceptions[0] from None
        await asyncio.to_thread(self._flush, staging, state, fds)

    async def _flush_quietly(self, staging: Path, state: ResumeState, fds: dict[str, int]) -> None:
        """Keep what was fetched for a later resume; a full disk may refuse even that."""
        try:
            await asyncio.to_thread(self._flush, staging, state, fds)
        except CacheError:
            return

    def _flush(self, staging: Path, state: ResumeState, fds: dict[str, int]) -> None:
        """fsync the data, then record the chunks (serialised: a flusher thread orphaned by a
        cancelled task may still be running)."""
        with self._flush_lock:
            self._flush_locked(staging, state, fds)

    def _flush_locked(self, staging: Path, state: ResumeState, fds: dict[str, int]) -> None:
        snapshot = state.to_json()
        try:
            for fd in fds.values():
                os.fsync(fd)
            atomic_write_json(staging / PROGRESS_FILE, snapshot)
        except OSError as err:
            _raise_os(err, "recording download progress")

    async def _fetch_chunk(self, source: Source, entry: FileEntry, chunk: Chunk, fd: int) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._stream_chunk(source, entry, chunk, fd)
                return
            except TransientSourceError as err:
                if attempt >= self._backoff.max_attempts:
                    raise TransientSourceError(
                        f"{entry.path} bytes {chunk.start}-{chunk.end}: gave up after "
                        f"{attempt} attempts: {err}"
                    ) from err
                self._on_retry(type(err).__name__)
                await asyncio.sleep(self._retry_delay_s(attempt, err))

    def _retry_delay_s(self, attempt: int, err: TransientSourceError) -> float:
        """Backoff with jitter, but never sooner than the origin's Retry-After (capped)."""
        delay_s = self._backoff.delay_s(attempt, self._rng)
        if err.retry_after_s is not None:
            delay_s = max(delay_s, min(err.retry_after_s, MAX_RETRY_AFTER_S))
        return delay_s

    async def _stream_chunk(self, source: Source, entry: FileEntry, chunk: Chunk, fd: int) -> int:
        copy_range = getattr(source, "copy_range", None)
        if copy_range is not None:  # local file system: in-kernel copy
            if self._limiter is not None:
                await asyncio.sleep(self._limiter.reserve(chunk.length))
            try:
                n: int = await asyncio.to_thread(copy_range, entry, chunk.start, chunk.end, fd)
            except OSError as err:
                _raise_os(err, "copying into the staged artifact")
            self._on_bytes(n)
            return n
        pos = chunk.start
        blocks: list[bytes] = []
        pending = 0
        written = 0
        try:
            async for block in source.open_range(entry, chunk.start, chunk.end):
                if pos + pending + len(block) > chunk.end:
                    raise TransientSourceError(f"{entry.path}: origin sent more than asked")
                blocks.append(block)
                pending += len(block)
                if pending >= WRITE_BLOCK_BYTES or len(blocks) >= MAX_IOV:
                    written += await self._write(fd, blocks, pos)
                    pos += pending
                    blocks, pending = [], 0
            if blocks:
                written += await self._write(fd, blocks, pos)
                pos += pending
        except TransientSourceError:
            self._on_bytes(-written)
            raise
        if pos != chunk.end:
            self._on_bytes(-written)
            raise TransientSourceError(f"{entry.path}: short chunk ({pos - chunk.start} bytes)")
        return written

    async def _write(self, fd: int, blocks: list[bytes], offset: int) -> int:
        size = sum(len(b) for b in blocks)
        if self._limiter is not None:
            delay = self._limiter.reserve(size)
            if delay > 0:
                await asyncio.sleep(delay)
        try:
            await asyncio.to_thread(_pwritev_all, fd, blocks, offset)
        except OSError as err:
            _raise_os(err, "writing the staged artifact")
        self._on_bytes(size)
        return size
