"""Passive outlier detection: when real requests eject an instance, and what readmits it.

Pure and synchronous (no I/O, no event loop); time comes from an injected clock. The I/O
edge (``state.VariantRuntime``, fed by the proxy) owns one :class:`OutlierRecord` per
instance and asks an :class:`OutlierPolicy` what each outcome changes.

The model is Envoy's ``consecutive_gateway_failure`` plus a half-open circuit breaker:

- ``IN``: routable; gateway failures in a row are counted, any success resets the count. At
  ``consecutive_failures`` (or at once for a *hard* failure: a refused connection) the
  instance is ejected, unless ``max_ejection_percent`` of the variant (at least one instance)
  is ejected already: then the ejection is refused (an *overflow*) and the count stays.
- ``EJECTED``: not routable for ``min(base_ejection_time_s * n, max_ejection_time_s)``, n
  being how many times it was ejected (after decay, below). Outcomes of requests sent before
  the ejection change nothing; neither does its health probe (its ``/health`` may have
  answered all along).
- ``PROBATION`` (when the ejection time has passed): routable, one request at a time (the
  *trial*). A success readmits it (``IN``) and starts the multiplier's decay; a failure
  ejects it again, for longer.

Decay: while ``IN``, the multiplier ``n`` loses one per ``base_ejection_time_s`` since the
readmission (computed at the next ejection), so an instance that fails once a day is not
ejected for ``max_ejection_time_s`` every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any

from warmfleet.gateway.server_config import OutlierConfig


class Standing(StrEnum):
    IN = "in"
    EJECTED = "ejected"
    PROBATION = "probation"


class FailureCause(StrEnum):
    """What went wrong with one attempt; a metric label (``passive_<cause>`` for ejections)."""

    CONNECT = "connect"  # refused, unreachable, connect timeout (hard: ejects at once)
    TIMEOUT = "timeout"  # no answer within the read (or total) timeout
    DISCONNECT = "disconnect"  # the connection dropped before the answer
    STATUS = "status"  # the instance answered 502, 503 or 504
    STREAM = "stream"  # the answer broke off after bytes reached the client


class Change(StrEnum):
    """What an outcome did to an instance's standing."""

    NONE = "none"
    EJECTED = "ejected"
    OVERFLOW = "overflow"  # would have been ejected; max_ejection_percent refused
    READMITTED = "readmitted"


IN = Standing.IN
EJECTED = Standing.EJECTED
PROBATION = Standing.PROBATION


class OutlierRecord:
    """One instance's passive-health state (mutated only by :class:`OutlierPolicy`)."""

    __slots__ = (
        "consecutive_failures",
        "decay_from_s",
        "ejected_until_s",
        "instance_id",
        "last_cause",
        "standing",
        "times_ejected",
        "trial",
    )

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.standing = IN
        self.consecutive_failures = 0
        self.times_ejected = 0  # the ejection-time multiplier, before decay
        self.ejected_until_s = 0.0
        self.decay_from_s = 0.0  # readmission time: the multiplier decays from here
        self.trial: object | None = None  # the probation request in flight, if any
        self.last_cause: FailureCause | None = None

    @property
    def routable(self) -> bool:
        return self.standing is IN or (self.standing is PROBATION and self.trial is None)

    def describe(self, now_s: float) -> dict[str, Any]:
        return {
            "standing": self.standing.value,
            "consecutive_failures": self.consecutive_failures,
            "times_ejected": self.times_ejected,
            "ejection_remaining_s": round(max(0.0, self.ejected_until_s - now_s), 3)
            if self.standing is EJECTED
            else 0.0,
            "trial_in_flight": self.trial is not None,
            "last_cause": None if self.last_cause is None else self.last_cause.value,
        }


def max_ejected(instances: int, percent: int) -> int:
    """How many of ``instances`` may be ejected at once: ``percent`` of them rounded down, but
    at least one (as Envoy does) unless ``percent`` is 0."""
    if percent <= 0 or instances <= 0:
        return 0
    return max(1, instances * percent // 100)


class OutlierPolicy:
    """Decides ejections and readmissions for the records of one variant's instances."""

    def __init__(self, config: OutlierConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock

    def ejection_time_s(self, times_ejected: int) -> float:
        cfg = self.config
        return min(cfg.base_ejection_time_s * times_ejected, cfg.max_ejection_time_s)

    def on_failure(
        self,
        rec: OutlierRecord,
        cause: FailureCause,
        fleet: Sequence[OutlierRecord],
    ) -> Change:
        """A gateway failure on ``rec``'s instance; ``fleet``: every record of the variant."""
        if rec.standing is EJECTED:
            return Change.NONE  # a request sent before the ejection: already accounted for
        rec.last_cause = cause
        if rec.standing is PROBATION:
            rec.trial = None
            return self._eject(rec, fleet)
        rec.consecutive_failures += 1
        if cause is FailureCause.CONNECT or (
            rec.consecutive_failures >= self.config.consecutive_failures
        ):
            return self._eject(rec, fleet)
        return Change.NONE

    def on_success(self, rec: OutlierRecord) -> Change:
        """A real request answered (any status but 502/503/504, and no broken stream)."""
        if rec.standing is IN:
            rec.consecutive_failures = 0
            return Change.NONE
        if rec.standing is EJECTED:
            return Change.NONE  # sent before the ejection; readmission goes through probation
        rec.standing = IN
        rec.consecutive_failures = 0
        rec.trial = None
        rec.decay_from_s = self.clock()
        return Change.READMITTED

    def begin_trial(self, rec: OutlierRecord, owner: object) -> bool:
        """``owner`` (one request) becomes the probation trial; False if it cannot."""
        if rec.standing is not PROBATION or rec.trial is not None:
            return False
        rec.trial = owner
        return True

    def end_trial(self, rec: OutlierRecord, owner: object) -> bool:
        """The trial ended without a verdict (the client left): the next request may try."""
        if rec.trial is not owner:
            return False
        rec.trial = None
        return True

    def expire(self, fleet: Iterable[OutlierRecord]) -> tuple[list[OutlierRecord], float]:
        """Move the records whose ejection time has passed to probation; returns them and the
        next ejection's end (``inf`` if none is ejected)."""
        now = self.clock()
        moved: list[OutlierRecord] = []
        next_end = math.inf
        for rec in fleet:
            if rec.standing is not EJECTED:
                continue
            if rec.ejected_until_s <= now:
                rec.standing = PROBATION
                moved.append(rec)
            else:
                next_end = min(next_end, rec.ejected_until_s)
        return moved, next_end

    @staticmethod
    def next_ejection_end(fleet: Iterable[OutlierRecord]) -> float:
        """When the soonest ejection ends (``inf``: none is ejected)."""
        return min((r.ejected_until_s for r in fleet if r.standing is EJECTED), default=math.inf)

    def release_excess(self, fleet: Sequence[OutlierRecord]) -> list[OutlierRecord]:
        """After instances left (or the percentage fell), put the ejections over the limit on
        probation, those ending soonest first."""
        ejected = sorted((r for r in fleet if r.standing is EJECTED), key=_ejection_end)
        excess = len(ejected) - max_ejected(len(fleet), self.config.max_ejection_percent)
        released = ejected[: max(0, excess)]
        for rec in released:
            rec.standing = PROBATION
        return released

    def release_all(self, fleet: Iterable[OutlierRecord]) -> list[OutlierRecord]:
        """Passive ejection switched off: every instance is back, counts forgotten."""
        changed = []
        for rec in fleet:
            if rec.standing is not IN:
                changed.append(rec)
            rec.standing = IN
            rec.consecutive_failures = 0
            rec.trial = None
        return changed

    def _eject(self, rec: OutlierRecord, fleet: Sequence[OutlierRecord]) -> Change:
        ejected = sum(1 for r in fleet if r.standing is EJECTED)
        if ejected >= max_ejected(len(fleet), self.config.max_ejection_percent):
            return Change.OVERFLOW
        now = self.clock()
        multiplier = rec.times_ejected
        if rec.standing is IN and multiplier:
            decayed = int((now - rec.decay_from_s) // self.config.base_ejection_time_s)
            multiplier = max(0, multiplier - decayed)
        rec.times_ejected = multiplier + 1
        rec.standing = EJECTED
        rec.consecutive_failures = 0
        rec.trial = None
        rec.ejected_until_s = now + self.ejection_time_s(rec.times_ejected)
        return Change.EJECTED


class PromptAvoidance:
    """Where each recently failed prompt should not go first, so prefix affinity cannot pin a
    prompt to an instance that keeps failing it while the instance answers others (and so is
    never ejected). ``prompt``: an int naming the prompt (its last block hash). Entries expire
    (``until_s``); at most ``max_entries``, the oldest dropped first."""

    __slots__ = ("entries", "max_entries")

    def __init__(self, max_entries: int = 4096) -> None:
        self.entries: dict[int, tuple[str, float]] = {}
        self.max_entries = max_entries

    def record(self, prompt: int, instance_id: str, until_s: float) -> None:
        entries = self.entries
        entries.pop(prompt, None)
        if len(entries) >= self.max_entries:
            del entries[next(iter(entries))]
        entries[prompt] = (instance_id, until_s)

    def avoid(self, prompt: int, now_s: float) -> str | None:
        """The instance ``prompt`` failed on, until its entry expires."""
        entry = self.entries.get(prompt)
        if entry is None:
            return None
        if entry[1] <= now_s:
            del self.entries[prompt]
            return None
        return entry[0]


def _ejection_end(rec: OutlierRecord) -> float:
    return rec.ejected_until_s
