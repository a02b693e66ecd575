"""The data files of one staging directory, with a bounded number of them open at a time.

A manifest may list more files than the process may open (``RLIMIT_NOFILE``), so the downloader
never holds one descriptor per file: ``run(rel, fn)`` opens the file if it is not open, runs
``fn(fd)`` (in the calling thread) and keeps at most ``max_open`` descriptors open, closing the
least recently used one nobody is using. Descriptors in use are never closed, so the bound is
``max(max_open, callers at once)``.

Durability: ``sync()`` fsyncs every file written since the previous ``sync()``, whether its
descriptor is still open or was closed meanwhile (it is opened again to be fsynced), so the
downloader's rule holds: a chunk recorded as done in the progress file is on disk.

Thread-safe: the downloader's workers call ``run`` from worker threads.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CACHE_FILE_MODE = 0o644  # the widest mode a published file gets


def published_mode(source_mode: int | None) -> int:
    """Never wider than the source for group and others: ``source mode & 0o644``, plus read
    for the owner (the agent, which re-verifies it); ``0o644`` when the source has no mode."""
    if source_mode is None:
        return CACHE_FILE_MODE
    return (source_mode & CACHE_FILE_MODE) | 0o400


def staging_mode(source_mode: int | None) -> int:
    """While it is written: the published mode plus write for the owner (the agent)."""
    return published_mode(source_mode) | 0o200


@dataclass
class _Open:
    fd: int
    users: int = 0
    dirty: bool = False


class StagedFiles:
    def __init__(self, staging: Path, max_open: int) -> None:
        self._staging = staging
        self._max_open = max(max_open, 1)
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._closed_dirty: set[str] = set()  # written, then closed before a sync
        self._shut = False  # closed: a thread still using a descriptor closes it when done

    @property
    def staging(self) -> Path:
        return self._staging

    @property
    def open_count(self) -> int:
        return len(self._open)

    def create(self, rel: str, size_bytes: int, *, mode: int, preallocate: bool) -> None:
        """Create (or reopen, on a resume) ``rel`` with ``size_bytes`` and exactly ``mode``."""
        path = self._staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)

        def setup(fd: int) -> None:
            os.fchmod(fd, mode)  # also narrows a file left by an earlier attempt
            if os.fstat(fd).st_size != size_bytes:
                os.ftruncate(fd, size_bytes)
            if preallocate and size_bytes > 0:
                os.posix_fallocate(fd, 0, size_bytes)

        self.run(rel, setup, write=True, create_mode=mode)

    def run(
        self, rel: str, fn: Callable[[int], T], *, write: bool, create_mode: int | None = None
    ) -> T:
        handle = self._acquire(rel, create_mode)
        try:
            return fn(handle.fd)
        finally:
            with self._lock:
                handle.dirty = handle.dirty or write
                self._release(handle)
                self._trim()

    def _acquire(self, rel: str, create_mode: int | None) -> _Open:
        with self._lock:
            if self._shut:
                raise OSError(errno.EBADF, f"staged files of {self._staging} are closed")
            handle = self._open.get(rel)
            if handle is None:
                flags = os.O_RDWR | os.O_CLOEXEC
                if create_mode is not None:
                    flags |= os.O_CREAT
                fd = os.open(self._staging / rel, flags, create_mode or 0)
                handle = self._open[rel] = _Open(fd)
            self._open.move_to_end(rel)
            handle.users += 1
            self._trim()
            return handle

    def _release(self, handle: _Open) -> None:
        """One user is done (lock held); after ``close()`` the last one closes it."""
        handle.users -= 1
        if self._shut and not handle.users:
            os.close(handle.fd)

    def _trim(self) -> None:
        """Close least recently used idle descriptors beyond the bound (lock held)."""
        excess = len(self._open) - self._max_open
        for rel in list(self._open):
            if excess <= 0:
                return
            handle = self._open[rel]
            if handle.users:
                continue
            del self._open[rel]
            if handle.dirty:
                self._closed_dirty.add(rel)
            os.close(handle.fd)
            excess -= 1

    def sync(self) -> None:
        """fsync everything written since the last sync (raises OSError)."""
        with self._lock:
            held = [(rel, h) for rel, h in self._open.items() if h.dirty]
            for _, handle in held:
                handle.users += 1
                handle.dirty = False
            closed, self._closed_dirty = self._closed_dirty, set()
        failed = True
        try:
            for _, handle in held:
                os.fsync(handle.fd)
            for rel in sorted(closed):
                fd = os.open(self._staging / rel, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            failed = False
        finally:
            with self._lock:
                for _, handle in held:
                    handle.dirty = handle.dirty or failed
                    self._release(handle)
                if failed:
                    self._closed_dirty |= closed
                self._trim()

    def close(self) -> None:
        """Close every idle descriptor; one still in use (a worker thread that outlived a
        cancelled task) is closed by its last user, never under it."""
        with self._lock:
            self._shut = True
            for handle in self._open.values():
                if not handle.users:
                    os.close(handle.fd)
            self._open.clear()
