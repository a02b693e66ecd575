"""Capacity admission and eviction planning (pure).

Model: the cache may occupy at most ``budget_bytes``; kubelet-like watermarks make garbage
collection start above ``high_watermark_frac * budget`` and free down to
``low_watermark_frac * budget``; ``reserve_bytes`` must stay free on the file system at all
times. Artifacts that are pinned, referenced, or not yet ready (pending / downloading /
verifying: their space is reserved) are never evicted. Among the rest, least recently used
goes first. During an update the old version is still referenced, so the new one must fit next
to it: the "old + new" rule falls out of the refcounts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from warmfleet.cache.state import ArtifactRecord, ArtifactState
from warmfleet.core.errors import ConfigError, InsufficientCapacityError


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    budget_bytes: int
    reserve_bytes: int = 0
    high_watermark_frac: float = 0.9
    low_watermark_frac: float = 0.8

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ConfigError("capacity.budget_bytes: must be > 0")
        if self.reserve_bytes < 0:
            raise ConfigError("capacity.reserve_bytes: must be >= 0")
        if not 0.0 < self.low_watermark_frac <= self.high_watermark_frac <= 1.0:
            raise ConfigError(
                "capacity: need 0 < low_watermark_frac <= high_watermark_frac <= 1 "
                f"(got low={self.low_watermark_frac}, high={self.high_watermark_frac})"
            )

    @property
    def high_limit_bytes(self) -> int:
        return int(self.budget_bytes * self.high_watermark_frac)

    @property
    def low_limit_bytes(self) -> int:
        return int(self.budget_bytes * self.low_watermark_frac)


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    evict: tuple[str, ...]
    freed_bytes: int
    used_after_bytes: int  # cache usage after the evictions (and the admission, if any)

    @property
    def empty(self) -> bool:
        return not self.evict


def occupied_bytes(records: Iterable[ArtifactRecord]) -> int:
    """Bytes the cache holds or has reserved (failed artifacts hold nothing)."""
    return sum(r.size_bytes for r in records if r.state != ArtifactState.FAILED)


def lru_candidates(records: Iterable[ArtifactRecord]) -> list[ArtifactRecord]:
    return sorted((r for r in records if r.evictable), key=lambda r: (r.last_used_s, r.key))


def _take(candidates: list[ArtifactRecord], target_bytes: int) -> tuple[list[str], int]:
    chosen: list[str] = []
    freed = 0
    for rec in candidates:
        if freed >= target_bytes:
            break
        chosen.append(rec.key)
        freed += rec.size_bytes
    return chosen, freed


def plan_admission(
    records: Iterable[ArtifactRecord],
    *,
    key: str,
    name: str,
    size_bytes: int,
    disk_free_bytes: int,
    policy: CapacityPolicy,
) -> EvictionPlan:
    """Plan the evictions needed to admit ``size_bytes`` more, or raise naming the shortfall.

    ``disk_free_bytes`` is the file system's free space minus what in-flight downloads still
    have to write.
    """
    recs = list(records)
    used = occupied_bytes(recs)
    existing = {r.key: r for r in recs}.get(key)
    if existing is not None and existing.state != ArtifactState.FAILED:
        return EvictionPlan((), 0, used)
    need_budget = used + size_bytes - policy.high_limit_bytes
    need_disk = size_bytes + policy.reserve_bytes - disk_free_bytes
    need = max(need_budget, need_disk, 0)
    if need == 0:
        return EvictionPlan((), 0, used + size_bytes)
    candidates = lru_candidates(recs)
    evictable = sum(r.size_bytes for r in candidates)
    if evictable < need:
        shortfall = need - evictable
        raise InsufficientCapacityError(
            f"artifact {name} needs {size_bytes} bytes; short by {shortfall} bytes "
            f"(budget {policy.budget_bytes}, high-watermark limit {policy.high_limit_bytes}, "
            f"used {used} of which {used - evictable} pinned/referenced/in-progress, "
            f"disk free {disk_free_bytes}, reserve {policy.reserve_bytes})",
            needed_bytes=size_bytes,
            available_bytes=max(size_bytes - shortfall, 0),
        )
    # Hysteresis: once we must evict, free down to the low watermark if we can.
    target = max(need, used + size_bytes - policy.low_limit_bytes)
    chosen, freed = _take(candidates, target)
    return EvictionPlan(tuple(chosen), freed, used - freed + size_bytes)


def plan_gc(
    records: Iterable[ArtifactRecord],
    *,
    disk_free_bytes: int,
    policy: CapacityPolicy,
    evict_all_unreferenced: bool = False,
) -> EvictionPlan:
    """Evictions for a periodic GC: only when above the high watermark (or below the disk
    reserve), then down to the low watermark; ``evict_all_unreferenced`` frees everything
    evictable (``warmfleet cache gc --all``)."""
    recs = list(records)
    used = occupied_bytes(recs)
    candidates = lru_candidates(recs)
    if evict_all_unreferenced:
        freed = sum(r.size_bytes for r in candidates)
        return EvictionPlan(tuple(r.key for r in candidates), freed, used - freed)
    over_budget = used > policy.high_limit_bytes
    under_reserve = disk_free_bytes < policy.reserve_bytes
    if not (over_budget or under_reserve):
        return EvictionPlan((), 0, used)
    target = 0
    if over_budget:
        target = used - policy.low_limit_bytes
    if under_reserve:
        target = max(target, policy.reserve_bytes - disk_free_bytes)
    chosen, freed = _take(candidates, target)
    return EvictionPlan(tuple(chosen), freed, used - freed)
