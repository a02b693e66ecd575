"""One range of a local source copied into a staged file and hashed.

``copy_range`` reads the range of the source once, in steps of ``STEP_BYTES``, into a reused
page-aligned buffer; the range's sha256 is taken over those bytes, and each step is written to
the staged file at the same offset.

Where the file system takes it, the staged file is written through a second descriptor opened
with ``O_DIRECT`` (``direct_io.open_direct``): the device copies the very buffer that was hashed
(DMA), so the sha256 is of the bytes handed to the device, and no page-cache page is allocated
for the copy. On the VMs measured, a page-cache page allocated for a write costs a host fault, so
``cp`` + fsync and a buffered copy both pay for every page (docs/benchmarks.md, *Local fill*).
The unaligned rest of a step (a file's short last block) goes through the ordinary descriptor,
which the kernel keeps coherent with the direct one. A file is written directly only when its
chunks start on block boundaries (``direct_ranges``): otherwise page-cache reads of some of its
ranges could run beside direct writes of others.

Where ``O_DIRECT`` is refused (tmpfs, some network file systems), a step is staged by
``copy_file_range`` from the source (an in-kernel copy), else by ``pwrite`` of the buffer; the
staged bytes are then read back through the page cache and must be the bytes read from the
source (an xxh3-128 of each, else ``IntegrityError``): the kernel's copy is checked, as the
direct path needs no check of a copy it does not make. A range an earlier attempt staged is
not written again, only read back (from the device where it can) and compared.

The comparison guards against accidents (a changed byte), not an adversary (whose bytes would
be the source's own); bytes changed on disk after the fill are what ``verify --full`` finds.
The source is never mapped (a file truncated under a mapping kills the process with SIGBUS).
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading

import xxhash

from warmfleet.agent.direct_io import BLOCK_BYTES, open_direct, pwrite_all
from warmfleet.agent.sources.base import SourceChangedError
from warmfleet.cache.manifest import FileEntry
from warmfleet.core.errors import IntegrityError

STEP_BYTES = 4 << 20
NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


class RangeCopier:
    """Thread-safe: each worker thread has its own reused buffers."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.kernel_copy = True  # until the kernel refuses copy_file_range once

    def _buffers(self) -> tuple[memoryview, memoryview]:
        bufs: tuple[memoryview, memoryview] | None = getattr(self._local, "bufs", None)
        if bufs is None:  # anonymous mappings: page-aligned, as O_DIRECT wants
            bufs = (memoryview(mmap.mmap(-1, STEP_BYTES)), memoryview(mmap.mmap(-1, STEP_BYTES)))
            self._local.bufs = bufs
        return bufs

    def copy_range(
        self,
        entry: FileEntry,
        src_fd: int,
        dst_fd: int,
        start: int,
        end: int,
        *,
        write: bool,
        direct: bool,
    ) -> bytes:
        """Copy (``write``) or only check ``[start, end)``; the sha256 digest of the staged
        bytes (raw, 32 bytes). SourceChangedError if the source ends early, IntegrityError if
        the staged bytes differ from the source's. ``direct``: ``O_DIRECT`` may be used; the
        caller gives it for every range of a file or for none (``direct_ranges``), since a
        page-cache read of one range (with its read-ahead) beside a direct write of another
        could cache bytes the write then replaces."""
        buf, back = self._buffers()
        sha = hashlib.sha256()
        direct_fd = open_direct(dst_fd) if direct else None
        staged = _Staged(dst_fd, direct_fd)
        try:
            pos = start
            while pos < end:
                n = os.preadv(src_fd, [buf[: min(STEP_BYTES, end - pos)]], pos)
                if n <= 0:
                    raise SourceChangedError(f"{entry.locator} shrank while copying")
                block = buf[:n]
                sha.update(block)
                direct_n = self._write(src_fd, staged, block, pos) if write else 0
                if not staged.holds(block[direct_n:], pos + direct_n, back):  # the rest
                    raise IntegrityError(
                        f"{entry.path}: the staged bytes at {pos}-{pos + n} differ from the "
                        "source's"
                    )
                pos += n
        finally:
            if direct_fd is not None:
                os.close(direct_fd)
        return sha.digest()

    def _write(self, src_fd: int, staged: _Staged, block: memoryview, pos: int) -> int:
        """Stage ``block`` (the source's bytes at ``pos``): directly where it can, the rest by
        an in-kernel copy from the source (``copy_file_range``), else with ``pwrite``. The
        bytes written directly (the front of ``block``)."""
        done = staged.write_direct(block, pos)
        if done == len(block):
            return done
        rest, rest_pos = block[done:], pos + done
        if self.kernel_copy:
            try:
                copy_range_in_kernel(src_fd, staged.fd, rest_pos, len(rest))
                return done
            except OSError as err:
                if err.errno not in NO_KERNEL_COPY:
                    raise
                self.kernel_copy = False
        pwrite_all(staged.fd, rest, rest_pos)
        return done


class _Staged:
    """The staged file's two descriptors (``direct_fd``: None where O_DIRECT is refused)."""

    __slots__ = ("direct_fd", "fd")

    def __init__(self, fd: int, direct_fd: int | None) -> None:
        self.fd = fd
        self.direct_fd = direct_fd

    def _direct_len(self, pos: int, n: int) -> int:
        """How much of ``[pos, pos + n)`` can go through the direct descriptor."""
        if self.direct_fd is None or pos % BLOCK_BYTES:
            return 0
        return n - n % BLOCK_BYTES

    def write_direct(self, block: memoryview, pos: int) -> int:
        """Write the aligned front of ``block`` directly; the bytes written."""
        cut = self._direct_len(pos, len(block))
        if cut and self.direct_fd is not None:
            pwrite_all(self.direct_fd, block[:cut], pos)
        return cut

    def holds(self, block: memoryview, pos: int, back: memoryview) -> bool:
        """Whether the staged file holds ``block`` at ``pos`` (read back into ``back``)."""
        n = len(block)
        if not n:
            return True
        cut = self._direct_len(pos, n)
        if cut and self.direct_fd is not None:
            _read_exactly(self.direct_fd, back[:cut], pos)
        if cut < n:
            _read_exactly(self.fd, back[cut:n], pos + cut)
        return xxhash.xxh3_128_digest(back[:n]) == xxhash.xxh3_128_digest(block)


def _read_exactly(fd: int, into: memoryview, pos: int) -> None:
    got = 0
    while got < len(into):
        n = os.preadv(fd, [into[got:]], pos + got)
        if n <= 0:
            raise IntegrityError(f"the staged file is short at {pos + got}")
        got += n


def copy_range_in_kernel(src_fd: int, dst_fd: int, pos: int, n: int) -> None:
    end = pos + n
    while pos < end:
        done = os.copy_file_range(src_fd, dst_fd, end - pos, pos, pos)
        if done <= 0:
            raise SourceChangedError("the source shrank while copying")
        pos += done
