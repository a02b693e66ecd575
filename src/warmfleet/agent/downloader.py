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
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NoReturn

from warmfleet.agent.hashed_copy import HashedCopier
from warmfleet.agent.inline_hash import InlineHasher
from warmfleet.agent.sources.base import (
    DiskFullError,
    Source,
    TooSlowError,
    TransientSourceError,
)
from warmfleet.agent.staged_files import StagedFiles, staging_mode
from warmfleet.cache.config import DownloadSpec
from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.cache.transfer import (
    Backoff,
    Chunk,
    LowSpeedGuard,
    ResumeState,
    TokenBucket,
    plan_chunks,
)
from warmfleet.core.clock import Clock
from warmfleet.core.errors import CacheError

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
        files = StagedFiles(staging, self._spec.max_open_files)
        try:
            await asyncio.to_thread(self._create_all, files, manifest)
            todo: list[Chunk] = []
            for entry in manifest.files:
                for chunk in plan_chunks(entry.path, entry.size_bytes, chunk_bytes):
                    if state.is_done(chunk):
                        self._on_bytes(chunk.length)
                    else:
                        todo.append(chunk)
            await self._run(
                source=source,
                manifest=manifest,
                staging=staging,
                state=state,
                files=files,
                todo=todo,
            )
        finally:
            with self._flush_lock:  # a flusher thread orphaned by a cancel is done first
                files.close()

    def _create_all(self, files: StagedFiles, manifest: Manifest) -> None:
        for entry in manifest.files:
            try:
                files.create(
                    entry.path,
                    entry.size_bytes,
                    mode=staging_mode(entry.mode),
                    preallocate=self._spec.preallocate,
                )
            except OSError as err:
                _raise_os(err, f"allocating {entry.size_bytes} bytes for {entry.path}")

    async def _run(
        self,
        *,
        source: Source,
        manifest: Manifest,
        staging: Path,
        state: ResumeState,
        files: StagedFiles,
        todo: list[Chunk],
    ) -> None:
        entries = {e.path: e for e in manifest.files}
        queue: asyncio.Queue[Chunk] = asyncio.Queue()
        for chunk in todo:
            queue.put_nowait(chunk)
        dirty = asyncio.Event()
        finished = asyncio.Event()
        hasher = InlineHasher(manifest, files, state.chunk_bytes, state)

        async def worker() -> None:
            while not queue.empty():
                chunk = queue.get_nowait()
                await self._fetch_chunk(source, entries[chunk.path], chunk, files)
                chunk_done(chunk)

        def chunk_done(chunk: Chunk) -> None:
            state.mark(chunk)
            dirty.set()
            hasher.poke()  # unused with a copier: its copy is compared with the source's bytes

        copier = self._copier(source, manifest, files, state, chunk_done)
        try:
            async with asyncio.TaskGroup() as tg:
                flush_task = tg.create_task(self._flusher(dirty, finished, staging, state, files))
                if copier is not None:  # one read of the source, hashed and compared
                    await copier.copy_all(list(manifest.files))
                    self.digests = copier.digests
                else:
                    hash_task = tg.create_task(hasher.run())
                    jobs = [tg.create_task(worker()) for _ in range(self._spec.concurrency)]
                    await asyncio.gather(*jobs)
                    self.digests = await hasher.finish(hash_task)
                finished.set()
                await flush_task  # never cancelled mid-write: it exits on `finished`
        except* Exception as group:  # the first failure, not a group (an OSError too)
            await self._flush_quietly(staging, state, files)
            raise group.exceptions[0] from None
        await asyncio.to_thread(self._flush, staging, state.to_json(), files)

    async def _flusher(
        self,
        dirty: asyncio.Event,
        finished: asyncio.Event,
        staging: Path,
        state: ResumeState,
        files: StagedFiles,
    ) -> None:
        """Until ``finished``: every ``fsync_every_s``, the resume state and the files flushed
        if a chunk landed since (``dirty``)."""
        while not finished.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self._spec.fsync_every_s)
            if dirty.is_set() and not finished.is_set():
                dirty.clear()
                await asyncio.to_thread(self._flush, staging, state.to_json(), files)

    def _copier(
        self,
        source: Source,
        manifest: Manifest,
        files: StagedFiles,
        state: ResumeState,
        chunk_done: Callable[[Chunk], None],
    ) -> HashedCopier | None:
        copy_hashed = getattr(source, "copy_hashed", None)
        if copy_hashed is None or any(e.has_digest() for e in manifest.files):
            return None  # a digest the manifest gives is checked by hashing whole files
        return HashedCopier(
            copy_hashed,
            files,
            state,
            concurrency=self._spec.concurrency,
            limiter=self._limiter,
            on_bytes=self._on_bytes,
            on_chunk=chunk_done,
            on_os_error=_raise_os,
        )

    async def _flush_quietly(self, staging: Path, state: ResumeState, files: StagedFiles) -> None:
        """Keep what was fetched for a later resume; a full disk may refuse even that."""
        try:
            await asyncio.to_thread(self._flush, staging, state.to_json(), files)
        except CacheError:
            return

    def _flush(self, staging: Path, snapshot: dict[str, Any], files: StagedFiles) -> None:
        """fsync the data written so far, then record ``snapshot`` (taken before: every chunk
        it lists was written). Serialised: a flusher thread orphaned by a cancelled task may
        still be running."""
        with self._flush_lock:
            try:
                files.sync()
                atomic_write_json(staging / PROGRESS_FILE, snapshot)
            except OSError as err:
                _raise_os(err, "recording download progress")

    async def _fetch_chunk(
        self, source: Source, entry: FileEntry, chunk: Chunk, files: StagedFiles
    ) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._receive(source, entry, chunk, files)
                return
            except TransientSourceError as err:
                if attempt >= self._backoff.max_attempts:  # same class: TooSlowError stays one
                    raise type(err)(
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

    async def _receive(
        self, source: Source, entry: FileEntry, chunk: Chunk, files: StagedFiles
    ) -> int:
        pos = chunk.start
        blocks: list[bytes] = []
        pending = 0
        written = 0
        stream = aiter(source.open_range(entry, chunk.start, chunk.end))
        guard = self._low_speed_guard()
        try:
            while (block := await next_block(stream, guard, entry)) is not None:
                if pos + pending + len(block) > chunk.end:
                    raise TransientSourceError(f"{entry.path}: origin sent more than asked")
                blocks.append(block)
                pending += len(block)
                if pending >= WRITE_BLOCK_BYTES or len(blocks) >= MAX_IOV:
                    written += await self._write(files, entry.path, blocks, pos)
                    pos += pending
                    blocks, pending = [], 0
            if blocks:
                written += await self._write(files, entry.path, blocks, pos)
                pos += pending
        except TransientSourceError:
            self._on_bytes(-written)
            raise
        finally:  # a body left early releases its connection now, not when collected
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        if pos != chunk.end:
            self._on_bytes(-written)
            raise TransientSourceError(f"{entry.path}: short chunk ({pos - chunk.start} bytes)")
        return written

    def _low_speed_guard(self) -> LowSpeedGuard | None:
        rate = self._spec.min_download_rate_bytes_per_s
        return LowSpeedGuard(rate, self._spec.low_speed_time_s) if rate > 0 else None

    async def _write(self, files: StagedFiles, rel: str, blocks: list[bytes], offset: int) -> int:
        size = sum(len(b) for b in blocks)
        if self._limiter is not None:
            delay = self._limiter.reserve(size)
            if delay > 0:
                await asyncio.sleep(delay)
        try:
            await asyncio.to_thread(
                files.run, rel, lambda fd: _pwritev_all(fd, blocks, offset), write=True
            )
        except OSError as err:
            _raise_os(err, "writing the staged artifact")
        self._on_bytes(size)
        return size


async def next_block(
    stream: AsyncIterator[bytes], guard: LowSpeedGuard | None, entry: FileEntry
) -> bytes | None:
    """The next block of the body (None at its end); with a guard, a body slower than
    the minimum rate is a TooSlowError (the wait is cut short once that is certain)."""
    if guard is None:
        return await anext(stream, None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(guard.wait_budget_s()) as deadline:
            block = await anext(stream, None)
    except TimeoutError:
        if not deadline.expired():
            raise
        block, ok = None, False
    else:
        ok = block is None or guard.record(len(block), loop.time() - started)
    if not ok:
        raise TooSlowError(
            f"{entry.path}: the origin sent less than {guard.min_rate_bps:g} bytes/s over "
            f"{guard.window_s:g} s (download.min_download_rate_bytes_per_s, "
            f"low_speed_time_s)"
        )
    return block
