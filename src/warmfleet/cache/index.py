"""In-memory cache index: records, reference counts, pins, LRU times (pure).

The agent's store persists it as JSON under a file lock; every mutation goes through here so
the rules (never evict pinned/referenced, legal state changes only) live in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from warmfleet.cache.capacity import EvictionPlan
from warmfleet.cache.state import ArtifactRecord, ArtifactState
from warmfleet.core.errors import CacheError, NotFoundError


class EvictionRefusedError(CacheError):
    """A plan tried to evict a pinned, referenced or unfinished artifact."""


class CacheIndex:
    def __init__(self, records: Iterable[ArtifactRecord] = ()) -> None:
        self._records: dict[str, ArtifactRecord] = {r.key: r for r in records}

    def __iter__(self) -> Iterator[ArtifactRecord]:
        return iter(sorted(self._records.values(), key=lambda r: (r.name, r.created_s, r.key)))

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def get(self, key: str) -> ArtifactRecord | None:
        return self._records.get(key)

    def resolve(self, key_or_prefix: str) -> ArtifactRecord:
        """Exact key, unique key prefix (>= 6 chars) or a name with exactly one version."""
        if key_or_prefix in self._records:
            return self._records[key_or_prefix]
        matches = [
            r
            for r in self._records.values()
            if (len(key_or_prefix) >= 6 and r.key.startswith(key_or_prefix))
            or r.name == key_or_prefix
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise NotFoundError(f"no cached artifact matches {key_or_prefix!r}")
        keys = ", ".join(sorted(m.key[:16] for m in matches))
        raise CacheError(f"{key_or_prefix!r} is ambiguous; matching keys: {keys}")

    def put(self, record: ArtifactRecord) -> None:
        self._records[record.key] = record

    def _require(self, key: str) -> ArtifactRecord:
        rec = self._records.get(key)
        if rec is None:
            raise NotFoundError(f"no cached artifact with key {key}")
        return rec

    def set_state(self, key: str, state: ArtifactState, reason: str = "") -> ArtifactRecord:
        rec = self._require(key).transition(state, reason)
        self._records[key] = rec
        return rec

    def add_ref(self, key: str, holder: str) -> ArtifactRecord:
        rec = self._require(key)
        rec = replace(rec, refs=rec.refs | {holder})
        self._records[key] = rec
        return rec

    def drop_ref(self, key: str, holder: str) -> ArtifactRecord:
        rec = self._require(key)
        rec = replace(rec, refs=rec.refs - {holder})
        self._records[key] = rec
        return rec

    def drop_holder_everywhere(self, holder: str, keep: str | None = None) -> list[str]:
        """Remove ``holder`` from every artifact except ``keep`` (update roll-over)."""
        changed = []
        for rec in list(self._records.values()):
            if rec.key != keep and holder in rec.refs:
                self._records[rec.key] = replace(rec, refs=rec.refs - {holder})
                changed.append(rec.key)
        return changed

    def set_pinned(self, key: str, pinned: bool) -> ArtifactRecord:
        rec = replace(self._require(key), pinned=pinned)
        self._records[key] = rec
        return rec

    def touch(self, key: str, now_s: float) -> None:
        rec = self._require(key)
        self._records[key] = replace(rec, last_used_s=max(rec.last_used_s, now_s))

    def remove(self, key: str) -> None:
        self._records.pop(key, None)

    def check_evictions(self, plan: EvictionPlan) -> list[ArtifactRecord]:
        """Records a plan may evict; refuses the whole plan if any is protected."""
        out = []
        for key in plan.evict:
            rec = self._require(key)
            if not rec.evictable:
                raise EvictionRefusedError(
                    f"refusing to evict {key[:16]} ({rec.name}): state={rec.state.value} "
                    f"pinned={rec.pinned} refs={sorted(rec.refs)}"
                )
            out.append(rec)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "artifacts": [r.to_json() for r in self]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CacheIndex:
        return cls(ArtifactRecord.from_json(item) for item in data.get("artifacts", []))
