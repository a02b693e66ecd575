"""Piece I/O that bypasses the page cache (``O_DIRECT``) where the file system allows it.

The one home of the agent's ``O_DIRECT`` helpers: the local fill (``sources/local_copy``) and
the peer fill (``peer_fill``) both stage through them.

A peer fill writes every byte of a model version once and serves most of them to other nodes.
Through the page cache each byte is copied into a newly allocated cache page, and a page the
kernel has not touched for a while is expensive to touch again (on the VMs the benchmarks run
on: a host fault per page; ``pwrite`` of 1 GB took 0.4-4.9 sys-s there, ``O_DIRECT`` 0.07). So
the pieces go to disk and come back from it through ``O_DIRECT`` and buffers the caller reuses:
the device copies them (DMA), the CPU does not.

``O_DIRECT`` needs the file offset, the length and the memory to be aligned to the logical
block size (``BLOCK_BYTES``, 4 KiB covers every common device): ``DirectFile`` sends the aligned
part of a range that way and the rest (a file's short last block, an unaligned piece) through an
ordinary descriptor, which the kernel keeps coherent with the direct one. Where ``O_DIRECT``
cannot be opened (tmpfs, some network file systems) everything goes through the ordinary one.
Buffers come from ``aligned_buffer`` (anonymous mappings are page-aligned).

Mixing the two on one file is safe only when no block is written both ways: a buffered write
leaves a dirty cache page that a direct write of the same block could race with. So a caller
whose writers may share a block (pieces not a whole number of blocks) passes ``direct=False``;
with whole-block pieces the only buffered write is a file's short last block.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path

BLOCK_BYTES = 4096  # O_DIRECT's alignment of offsets, lengths and memory (every common device)


def open_direct(fd: int) -> int | None:
    """A second descriptor of ``fd``'s file opened with ``O_DIRECT``, or None where the file
    system (or platform) has none."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC | flag)
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP):
            return None
        raise


def direct_ranges(chunk_bytes: int) -> bool:
    """Whether the ranges of files cut in ``chunk_bytes`` chunks (or pieces) may be written
    directly: every one then starts on a block boundary, so only a file's short last block goes
    through the page cache, and no block is written both ways."""
    return chunk_bytes % BLOCK_BYTES == 0


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def aligned_buffer(size_bytes: int) -> memoryview:
    """A zeroed, page-aligned buffer of at least ``size_bytes`` (whole blocks)."""
    size = max(BLOCK_BYTES, -(-size_bytes // BLOCK_BYTES) * BLOCK_BYTES)
    return memoryview(mmap.mmap(-1, size))


def _align_down(n: int) -> int:
    return n - n % BLOCK_BYTES


def _align_up(n: int) -> int:
    return -(-n // BLOCK_BYTES) * BLOCK_BYTES


class DirectFile:
    """One file opened twice for reading and writing: with ``O_DIRECT`` (``open_direct``; not
    when ``direct`` is false) and buffered. Reads and writes from several threads are fine
    (``pread``/``pwrite``); close it when none is under way."""

    def __init__(self, path: Path, *, direct: bool = True) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._direct = open_direct(self._fd) if direct else None
        except OSError:
            os.close(self._fd)
            raise

    @property
    def direct(self) -> bool:
        return self._direct is not None

    def close(self) -> None:
        for fd in (self._fd, self._direct):
            if fd is not None:
                os.close(fd)

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def write(self, data: memoryview, offset: int) -> None:
        """Write ``data`` at ``offset``; the aligned part directly when ``data`` starts on a
        block boundary in an aligned buffer (``aligned_buffer``) and ``offset`` does too."""
        cut = 0
        if self._direct is not None and offset % BLOCK_BYTES == 0 and _is_aligned(data):
            cut = _align_down(len(data))
            pwrite_all(self._direct, data[:cut], offset)
        if cut < len(data):
            pwrite_all(self._fd, data[cut:], offset + cut)

    def read_into(self, buf: memoryview, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` (which must exist) read into ``buf`` (an ``aligned_buffer``
        of at least ``end - start + 2 * BLOCK_BYTES``); returns the view of them in ``buf``."""
        if self._direct is None:
            _read_all(self._fd, buf[: end - start], start)
            return buf[: end - start]
        base = _align_down(start)
        got = _read_all(self._direct, buf[: _align_up(end) - base], base, direct=True)
        if got < end - base:
            raise OSError(errno.EIO, f"short read: {got} of {end - base} bytes at {base}")
        return buf[start - base : end - base]


def _is_aligned(data: memoryview) -> bool:
    if data.readonly or len(data) < BLOCK_BYTES:
        return False
    address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    return address % BLOCK_BYTES == 0


def _read_all(fd: int, buf: memoryview, offset: int, *, direct: bool = False) -> int:
    """Fill ``buf`` from ``offset``; a direct read may end early at the end of the file (its
    last block is short), which it returns instead of raising."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        got += n
        if direct and (n == 0 or n % BLOCK_BYTES):
            return got
        if n == 0:
            raise OSError(errno.EIO, f"short read at {offset + got}")
    return got
