"""One range of a local source copied into a staged file, proven equal to the source and hashed.

``copy_range`` reads the range of the source once, in steps of ``STEP_BYTES`` (small enough to
stay in the CPU cache between the passes over it). Each step is read into a reused buffer and
staged at the same offsets: by ``copy_file_range`` from the source (now in the page cache; an
in-kernel copy, several times cheaper than ``pwrite`` from Python's buffer on the VM measured),
else by ``pwrite`` of the buffer where the kernel refuses it; a range an earlier attempt staged
is not written again. Then the staged bytes themselves are read through a read-only mapping of
the staged file (no copy) and fed to the range's sha256 and to an xxh3-128, while the bytes
read from the source feed a second xxh3-128. The two xxh3 digests must be equal, else the
staged copy differs from the source (``IntegrityError``). So the sha256 returned is of the
bytes the staged file holds, and those were shown equal to the bytes read from the source.

The xxh3 pair is an equality check against accidents (a write path or file system that changes
bytes), not against an adversary: the adversary's bytes would be the source's own. The source
is never mapped (a file truncated under a mapping kills the process with SIGBUS); the staged
file is the agent's own, under the download lock. Where the staged file cannot be mapped its
bytes are read back into a second buffer instead.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from typing import Protocol

import xxhash

from warmfleet.agent.sources.base import SourceChangedError
from warmfleet.cache.manifest import FileEntry
from warmfleet.core.errors import IntegrityError

STEP_BYTES = 1 << 20
NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


class _Hasher(Protocol):
    def update(self, data: memoryview, /) -> None: ...


class RangeCopier:
    """Thread-safe: each worker thread has its own reused buffers."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.kernel_copy = True  # until the kernel refuses copy_file_range once

    def _buffers(self) -> tuple[bytearray, bytearray]:
        bufs: tuple[bytearray, bytearray] | None = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = (bytearray(STEP_BYTES), bytearray(STEP_BYTES))
            self._local.bufs = bufs
        return bufs

    def copy_range(
        self, entry: FileEntry, src_fd: int, dst_fd: int, start: int, end: int, *, write: bool
    ) -> bytes:
        """Copy (``write``) or only check ``[start, end)``; the sha256 digest of the staged
        bytes (raw, 32 bytes). SourceChangedError if the source ends early, IntegrityError if
        the staged bytes differ from the source's."""
        buf, back = self._buffers()
        view = memoryview(buf)
        sha = hashlib.sha256()
        read_x, staged_x = xxhash.xxh3_128(), xxhash.xxh3_128()
        pos = start
        while pos < end:
            n = os.preadv(src_fd, [view[: min(STEP_BYTES, end - pos)]], pos)
            if n <= 0:
                raise SourceChangedError(f"{entry.locator} shrank while copying")
            block = view[:n]
            read_x.update(block)
            if write:
                self._write(src_fd, dst_fd, block, pos)
            _hash_staged(dst_fd, pos, n, back, (sha, staged_x))
            pos += n
        if read_x.digest() != staged_x.digest():
            raise IntegrityError(
                f"{entry.path}: the staged bytes at {start}-{end} differ from the source's"
            )
        return sha.digest()

    def _write(self, src_fd: int, dst_fd: int, block: memoryview, pos: int) -> None:
        """Stage ``block`` (the source's bytes at ``pos``) by an in-kernel copy from the
        source (``copy_file_range``: no copy from Python's buffer, several times cheaper than
        ``pwrite`` on the VMs measured), or with ``pwrite`` where the kernel refuses it (across
        file systems, or a file system without it); either way the staged bytes are then
        compared with ``block``."""
        if self.kernel_copy:
            try:
                copy_range_in_kernel(src_fd, dst_fd, pos, len(block))
                return
            except OSError as err:
                if err.errno not in NO_KERNEL_COPY:
                    raise
                self.kernel_copy = False
        pwrite_all(dst_fd, block, pos)


def copy_range_in_kernel(src_fd: int, dst_fd: int, pos: int, n: int) -> None:
    end = pos + n
    while pos < end:
        done = os.copy_file_range(src_fd, dst_fd, end - pos, pos, pos)
        if done <= 0:
            raise SourceChangedError("the source shrank while copying")
        pos += done


def _hash_staged(
    fd: int, pos: int, n: int, back: bytearray, hashers: tuple[_Hasher, _Hasher]
) -> None:
    """Feed the staged bytes ``[pos, pos + n)`` to ``hashers``: through a mapping, or read
    back into ``back`` where the file cannot be mapped."""
    lead = pos % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, lead + n, offset=pos - lead, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        got = os.preadv(fd, [memoryview(back)[:n]], pos)
        if got != n:
            raise IntegrityError(f"the staged file is short at {pos}") from None
        _update(hashers, memoryview(back)[:n])
        return
    try:
        with memoryview(mapping) as mapped, mapped[lead:] as staged:
            _update(hashers, staged)
    finally:
        mapping.close()


def _update(hashers: tuple[_Hasher, _Hasher], data: memoryview) -> None:
    for h in hashers:
        h.update(data)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n
