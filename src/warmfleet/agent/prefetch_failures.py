"""The latest failure of each held prefetch (a configured artifact, an assigned cache), so that
one refused before admission (a listing with bad file names, an unreachable origin, a budget
it cannot fit) is visible although it has no record in the index.

Keyed by holder (``config:<name>``, ``fleet:<cache>``). ``tracked_prefetch`` records a failure,
logs it once per change of its reason (a stuck listing does not log at every pass; a bug's
traceback is logged once) and clears it when the prefetch succeeds; the callers drop the
entries of artifacts they no longer want (``retain``). The status API lists the unadmitted
ones; the metrics count them by error class.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from warmfleet.agent.metrics import CacheMetrics
from warmfleet.agent.status import ArtifactStatus
from warmfleet.agent.store import Store
from warmfleet.cache.manifest import Manifest
from warmfleet.cache.state import ArtifactRecord, ArtifactState
from warmfleet.core.clock import Clock
from warmfleet.core.errors import WarmfleetError


@dataclass
class PrefetchFailure:
    holder: str
    name: str
    uri: str
    revision: str | None
    error_class: str
    reason: str  # "<ErrorType>: message", as a record's reason
    key: str  # the content key when the listing resolved, else ""
    admitted: bool  # the index holds a record (with this reason): listed with the artifacts
    first_failed_s: float
    last_failed_s: float
    attempts: int = 1

    def to_json(self) -> dict[str, object]:
        """The shape of an artifact in ``/v1/status``, plus the holder and the attempts."""
        status = ArtifactStatus(
            self.key,
            self.name,
            self.uri,
            ArtifactState.FAILED,
            0,
            0,
            started_at=self.first_failed_s,
            finished_at=self.last_failed_s,
            reason=self.reason,
            retries=self.attempts - 1,
        )
        extra = {"revision": self.revision} if self.revision else {}
        doc = status.to_json()
        doc.update(
            {
                "pinned": False,
                "refs": [],
                "extra": extra,
                "holder": self.holder,
                "attempts": self.attempts,
                "error_class": self.error_class,
            }
        )
        return doc


class PrefetchFailures:
    def __init__(self, metrics: CacheMetrics, wall: Clock) -> None:
        self._metrics = metrics
        self._wall = wall
        self._by_holder: dict[str, PrefetchFailure] = {}
        self._classes: set[str] = set()  # every class the gauge has shown (reset to 0)

    def record(self, failure: PrefetchFailure) -> bool:
        """Keep ``failure``; True if it is new or its reason changed (log it then)."""
        old = self._by_holder.get(failure.holder)
        if old is not None and old.reason == failure.reason:
            old.last_failed_s, old.attempts = failure.last_failed_s, old.attempts + 1
            old.admitted, old.key = failure.admitted, failure.key
        else:
            self._by_holder[failure.holder] = failure
        if not failure.admitted:
            self._metrics.unadmitted_failures.labels(failure.error_class).inc()
        self._update_gauge()
        return old is None or old.reason != failure.reason

    def clear(self, holder: str) -> None:
        if self._by_holder.pop(holder, None) is not None:
            self._update_gauge()

    def retain(self, prefix: str, names: Collection[str]) -> None:
        """Forget the failures of holders ``<prefix><name>`` whose name is not in ``names``."""
        gone = [
            h for h in self._by_holder if h.startswith(prefix) and h[len(prefix) :] not in names
        ]
        for holder in gone:
            del self._by_holder[holder]
        if gone:
            self._update_gauge()

    def get(self, holder: str) -> PrefetchFailure | None:
        return self._by_holder.get(holder)

    def unadmitted(self) -> list[PrefetchFailure]:
        """Failures without a record, by name then holder."""
        found = [f for f in self._by_holder.values() if not f.admitted]
        return sorted(found, key=lambda f: (f.name, f.holder))

    def now_s(self) -> float:
        return self._wall.now_s()

    def _update_gauge(self) -> None:
        counts: dict[str, int] = {}
        for failure in self.unadmitted():
            counts[failure.error_class] = counts.get(failure.error_class, 0) + 1
        self._classes.update(counts)
        for error_class in self._classes:
            self._metrics.unadmitted.labels(error_class).set(counts.get(error_class, 0))


class PrefetchingCache(Protocol):
    """What a tracked prefetch uses of the cache (``manager.CacheManager``, which imports this)."""

    store: Store
    failures: PrefetchFailures

    async def resolve(self, uri: str, revision: str | None = None) -> Manifest: ...

    async def ensure(
        self, manifest: Manifest, name: str, holder: str | None = None, pin: bool = False
    ) -> ArtifactRecord: ...


async def tracked_prefetch(
    manager: PrefetchingCache,
    log: logging.Logger,
    *,
    uri: str,
    name: str,
    holder: str,
    revision: str | None = None,
    pin: bool = False,
) -> ArtifactRecord | None:
    """Resolve and ensure ``uri`` for ``holder``; a failure is recorded in
    ``manager.failures`` and logged once per reason (``None`` returned). Cancellation passes."""
    key = ""
    try:
        manifest = await manager.resolve(uri, revision)
        key = manifest.key()
        rec = await manager.ensure(manifest, name, holder, pin)
    except Exception as err:  # one artifact's failure must not stop the others nor the GC
        admitted = bool(key) and _has_record(manager, key)
        now_s = manager.failures.now_s()
        error_class = type(err).__name__
        failure = PrefetchFailure(
            holder, name, uri, revision, error_class, f"{error_class}: {err}", key, admitted,
            now_s, now_s,
        )  # fmt: skip
        if not manager.failures.record(failure):
            return None  # the same failure as at the previous pass: already logged
        if isinstance(err, WarmfleetError):
            log.warning("prefetch of %s failed: %s", name, failure.reason)
        else:  # an OSError, a bug: its traceback, once
            log.error("prefetch of %s failed: %s", name, failure.reason, exc_info=err)
        return None
    manager.failures.clear(holder)
    return rec


def _has_record(manager: PrefetchingCache, key: str) -> bool:
    try:
        return manager.store.read_index().get(key) is not None
    except (OSError, WarmfleetError):  # the index unreadable too: shown as unadmitted
        return False
