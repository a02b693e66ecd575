"""Clock protocol: pure code takes time as an argument or through an injected clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float: ...


class MonotonicClock:
    """Wall-clock (monotonic) time for the I/O shells."""

    def now_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock moved by hand: the simulator and tests."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance(self, delta_s: float) -> None:
        if delta_s < 0:
            raise ValueError("time never goes back")
        self._now_s += delta_s

    def set(self, now_s: float) -> None:
        if now_s < self._now_s:
            raise ValueError("time never goes back")
        self._now_s = now_s
