"""The zero-ready hold: requests for a variant with no ready replica wait for one (pure).

A variant scaled to zero (or whose replicas are all starting) has nothing to route to. Rather
than fail at once, the gateway holds such a request: at most ``max_held`` per variant, each for
at most ``timeout_s``; a held request is released when a replica of its variant becomes ready
(it is then routed as usual), or shed at its deadline, or at once when the variant's hold is
full (the gateway answers 503 with ``Retry-After``). The number held per variant is the demand
signal that brings a variant back from zero (``warmfleet_gateway_held_requests``, read by the
autoscaler with the in-flight gauge).

This is one small synchronous object over an injected clock, with no I/O and no awaiting: the
gateway's adapter (``gateway.hold``) parks a future per ``Waiter``. It is meant to be the one
copy of this behaviour: a flow-control queue that has to hold requests while a variant has no
ready replica can adopt it as it is.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import StrEnum


class HoldOutcome(StrEnum):
    """How a held request's wait ended (a metric label)."""

    SERVED = "served"  # a replica became ready: routed
    TIMEOUT = "timeout"  # shed at its deadline
    FULL = "full"  # shed on arrival: the variant's hold was full
    CANCELLED = "cancelled"  # the client left while held


@dataclass(frozen=True, slots=True, eq=False)
class Waiter:
    """One held request (identity semantics: each is its own waiter)."""

    key: Hashable
    admitted_s: float
    deadline_s: float
    seq: int


@dataclass(slots=True)
class _Line:
    waiters: dict[int, Waiter] = field(default_factory=dict)  # in arrival order


class ZeroReadyHold:
    """Waiters per variant key, bounded in count and in time.

    ``clock`` gives seconds (monotonic); ``max_held`` is per key; ``timeout_s`` is how long a
    request may wait. ``outcomes`` counts every ended wait per (key, outcome)."""

    def __init__(self, max_held: int, timeout_s: float, clock: Callable[[], float]) -> None:
        if max_held < 1:
            raise ValueError("max_held must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.max_held = max_held
        self.timeout_s = timeout_s
        self._clock = clock
        self._lines: dict[Hashable, _Line] = {}
        self._seq = itertools.count()
        self.outcomes: dict[tuple[Hashable, HoldOutcome], int] = {}

    def held(self, key: Hashable) -> int:
        line = self._lines.get(key)
        return len(line.waiters) if line else 0

    def keys(self) -> list[Hashable]:
        return [k for k, line in self._lines.items() if line.waiters]

    def admit(self, key: Hashable) -> Waiter | None:
        """Hold a request for ``key``; None when the hold is full (shed it now)."""
        line = self._lines.setdefault(key, _Line())
        if len(line.waiters) >= self.max_held:
            self._count(key, HoldOutcome.FULL)
            return None
        now_s = self._clock()
        waiter = Waiter(key, now_s, now_s + self.timeout_s, next(self._seq))
        line.waiters[waiter.seq] = waiter
        return waiter

    def release(self, key: Hashable) -> list[Waiter]:
        """A replica of ``key`` is ready: every waiter still within its deadline, oldest first
        (those past it are shed as timed out, not served)."""
        line = self._lines.get(key)
        if line is None or not line.waiters:
            return []
        now_s = self._clock()
        served = []
        for waiter in line.waiters.values():
            outcome = HoldOutcome.SERVED if now_s <= waiter.deadline_s else HoldOutcome.TIMEOUT
            self._count(key, outcome)
            if outcome is HoldOutcome.SERVED:
                served.append(waiter)
        line.waiters.clear()
        return served

    def expire(self) -> list[Waiter]:
        """Remove and return the waiters past their deadline (counted as timed out)."""
        now_s = self._clock()
        out = []
        for key, line in self._lines.items():
            late = [w for w in line.waiters.values() if w.deadline_s < now_s]
            for waiter in late:
                del line.waiters[waiter.seq]
                self._count(key, HoldOutcome.TIMEOUT)
            out.extend(late)
        return out

    def leave(self, waiter: Waiter, outcome: HoldOutcome) -> bool:
        """``waiter`` stops waiting (``TIMEOUT`` or ``CANCELLED``); False if it had already
        been released or expired (then nothing is counted again)."""
        line = self._lines.get(waiter.key)
        if line is None or line.waiters.pop(waiter.seq, None) is None:
            return False
        self._count(waiter.key, outcome)
        return True

    def forget(self, key: Hashable) -> None:
        """``key`` is gone (no waiter left): its outcome counts and its line go."""
        line = self._lines.get(key)
        if line is not None and not line.waiters:
            del self._lines[key]
        for counted in [k for k in self.outcomes if k[0] == key]:
            del self.outcomes[counted]

    def next_deadline_s(self) -> float | None:
        deadlines = [w.deadline_s for line in self._lines.values() for w in line.waiters.values()]
        return min(deadlines, default=None)

    def _count(self, key: Hashable, outcome: HoldOutcome) -> None:
        self.outcomes[(key, outcome)] = self.outcomes.get((key, outcome), 0) + 1
