"""Giving freed request bodies back to the operating system (glibc's allocator).

A gateway process reads bodies of up to ``max_body_bytes`` (8 MiB by default) as many reads of
up to 256 KiB. glibc keeps what a burst of large bodies leaves behind: its mmap threshold is
*dynamic* (once an 8 MB block served by ``mmap`` is freed, blocks up to that size are carved
from the heap from then on), a heap shrinks only from its top, and freed blocks in the middle
stay resident until ``malloc_trim`` gives their pages back (``MADV_DONTNEED``).

Measured on this gateway (``tests/gateway/test_gateway_memory.py``'s load: 100 clients that
each send half of a 7.9 MB body and get a 408): the process kept +100 MB after each round with
glibc's defaults, and returned to its start with a trim after the burst. ``serve`` checks the
heap's free bytes every ``interval_s`` and trims only when at least ``min_free_bytes`` are
free (a trim with nothing to return costs ~3 ms on a 100 MB heap; one that returns 700 MB,
~90 ms of the event loop's time, once after such a burst).

Tried and dropped: pinning the mmap threshold (``mallopt(M_MMAP_THRESHOLD)``) so that large
bodies always return to the system. Every large allocation then faults its pages in again
(milliseconds per 7.5 MB copy, on the event loop), and ``/health``'s p99 under 4 clients
sending 7.5 MB bodies went from 22-32 ms to 36-68 ms.

Python's allocator has no knob for this and no library does it; ``ctypes`` reaches glibc
directly. On another C library (musl, macOS) the process keeps its allocator's defaults.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from typing import Any


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class HeapTrimmer:
    """glibc's allocator, tuned for a long-running gateway (see the module's text)."""

    def __init__(self, libc: Any, min_free_bytes: int = 16 << 20) -> None:
        self._libc = libc
        self.min_free_bytes = min_free_bytes
        self.trims = 0
        self._mallinfo2: Any = getattr(libc, "mallinfo2", None)
        if self._mallinfo2 is not None:
            self._mallinfo2.restype = _MallInfo2
            self._mallinfo2.argtypes = []

    @classmethod
    def for_this_process(cls) -> HeapTrimmer | None:
        """The trimmer, or None when the C library is not glibc."""
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        try:
            libc = ctypes.CDLL(name)
        except OSError:
            return None
        if not hasattr(libc, "malloc_trim"):
            return None
        return cls(libc)

    def free_heap_bytes(self) -> int | None:
        """Bytes free inside the heap (None: this glibc has no ``mallinfo2``)."""
        if self._mallinfo2 is None:
            return None
        return int(self._mallinfo2().fordblks)

    def trim_if_worth_it(self) -> bool:
        """Give free heap pages back when at least ``min_free_bytes`` are free."""
        free = self.free_heap_bytes()
        if free is not None and free < self.min_free_bytes:
            return False
        self._libc.malloc_trim(0)
        self.trims += 1
        return True


class PeriodicTrim:
    """``trimmer.trim_if_worth_it`` every ``interval_s`` on the running loop until ``stop``."""

    def __init__(self, trimmer: HeapTrimmer, interval_s: float = 2.0) -> None:
        self.trimmer = trimmer
        self.interval_s = interval_s
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        self.trimmer.trim_if_worth_it()
        self.start()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
