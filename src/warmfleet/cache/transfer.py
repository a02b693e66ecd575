"""Pure pieces of the transfer engine: chunk plans, resumable progress, rate/ETA, token
bucket and retry backoff. The agent drives them with real sockets and a real clock."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from warmfleet.core.clock import Clock
from warmfleet.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Chunk:
    path: str
    index: int
    start: int  # inclusive byte offset
    end: int  # exclusive byte offset

    @property
    def length(self) -> int:
        return self.end - self.start


def plan_chunks(path: str, size_bytes: int, chunk_bytes: int) -> list[Chunk]:
    if chunk_bytes <= 0:
        raise ConfigError("download.chunk_bytes: must be > 0")
    return [
        Chunk(path, i, start, min(start + chunk_bytes, size_bytes))
        for i, start in enumerate(range(0, size_bytes, chunk_bytes))
    ]


@dataclass
class ResumeState:
    """Which chunks of which files are durably on disk in the staging area.

    Persisted next to the staged files; only valid for the same cache key and chunk size.
    """

    key: str
    chunk_bytes: int
    done: dict[str, set[int]] = field(default_factory=dict)

    def mark(self, chunk: Chunk) -> None:
        self.done.setdefault(chunk.path, set()).add(chunk.index)

    def is_done(self, chunk: Chunk) -> bool:
        return chunk.index in self.done.get(chunk.path, set())

    def done_bytes(self, chunks: list[Chunk]) -> int:
        return sum(c.length for c in chunks if self.is_done(c))

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "chunk_bytes": self.chunk_bytes,
            "done": {p: sorted(ix) for p, ix in sorted(self.done.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, key: str, chunk_bytes: int) -> ResumeState:
        """Progress for ``key`` / ``chunk_bytes``; anything else starts from scratch."""
        if data.get("key") != key or data.get("chunk_bytes") != chunk_bytes:
            return cls(key, chunk_bytes)
        done = {str(p): {int(i) for i in ix} for p, ix in (data.get("done") or {}).items()}
        return cls(key, chunk_bytes, done)


class RateMeter:
    """Bytes done / total, sliding-window rate and ETA on an injected clock."""

    def __init__(self, clock: Clock, total_bytes: int, window_s: float = 5.0) -> None:
        self._clock = clock
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self.started_s = clock.now_s()

    def add(self, n_bytes: int) -> None:
        self.done_bytes += n_bytes
        now = self._clock.now_s()
        self._samples.append((now, self.done_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()

    def rate_bps(self) -> float:
        if len(self._samples) < 2:
            elapsed = self._clock.now_s() - self.started_s
            return self.done_bytes / elapsed if elapsed > 0 else 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def eta_s(self) -> float | None:
        rate = self.rate_bps()
        remaining = max(self.total_bytes - self.done_bytes, 0)
        if remaining == 0:
            return 0.0
        return remaining / rate if rate > 0 else None


class TokenBucket:
    """Bandwidth limiter: ``reserve(n)`` returns how long the caller must wait before sending
    ``n`` bytes. Debt is allowed (n may exceed the burst), so waits stay exact on average."""

    def __init__(self, clock: Clock, rate_bps: float, burst_bytes: int | None = None) -> None:
        if rate_bps <= 0:
            raise ConfigError("download.bandwidth_limit_bps: must be > 0")
        self._clock = clock
        self.rate_bps = rate_bps
        self.burst_bytes = burst_bytes if burst_bytes is not None else int(rate_bps / 10) + 1
        self._tokens = float(self.burst_bytes)
        self._last_s = clock.now_s()

    def reserve(self, n_bytes: int) -> float:
        now = self._clock.now_s()
        self._tokens = min(self._tokens + (now - self._last_s) * self.rate_bps, self.burst_bytes)
        self._last_s = now
        self._tokens -= n_bytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bps


class LowSpeedGuard:
    """curl's ``--speed-limit``/``--speed-time`` for one response body: the transfer is too
    slow when, over a window of ``window_s`` seconds spent waiting for the origin, fewer than
    ``min_rate_bps * window_s`` bytes arrived. Only time spent waiting for data counts (not
    our own writes or bandwidth limiter), so a node-side throttle never trips it."""

    def __init__(self, min_rate_bps: float, window_s: float) -> None:
        if min_rate_bps <= 0 or window_s <= 0:
            raise ConfigError("download.minDownloadRateBytesPerS/lowSpeedTimeS: > 0")
        self.min_rate_bps = min_rate_bps
        self.window_s = window_s
        self._waited_s = 0.0
        self._bytes = 0

    @property
    def threshold_bytes(self) -> float:
        return self.min_rate_bps * self.window_s

    def wait_budget_s(self) -> float:
        """How long the next wait for data may last before the transfer is certainly too slow:
        the rest of this window, or of the next one when this window already has enough."""
        rest = max(self.window_s - self._waited_s, 0.0)
        return rest + self.window_s if self._bytes >= self.threshold_bytes else rest

    def record(self, n_bytes: int, waited_s: float) -> bool:
        """``n_bytes`` arrived at the end of a wait of ``waited_s``; False when a window that
        closed during the wait had too few bytes (the transfer is too slow)."""
        self._waited_s += waited_s
        while self._waited_s >= self.window_s:
            if self._bytes < self.threshold_bytes:
                return False
            self._waited_s -= self.window_s
            self._bytes = 0
        self._bytes += n_bytes
        return True


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter from a seeded RNG."""

    base_s: float = 0.2
    cap_s: float = 10.0
    max_attempts: int = 5

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** max(attempt - 1, 0)))
        return rng.uniform(ceiling / 2, ceiling)
