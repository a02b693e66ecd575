"""Capacity admission and eviction planning (pure).

Model: the cache may occupy at most ``budget_bytes``; kubelet-like watermarks make garbage
collection start above ``high_watermark_frac * budget`` and free down to
``low_watermark_frac * budget``; ``reserve_bytes`` must stay free on the file system at all
times. Artifacts that are pinned, referenced, or not yet ready (pending / downloading /
verifying: their space is reserved) are never evicted. Among the rest, least recently used
goes first. During an update the old version is still referenced, so the new one must fit next
to it: the "old + new" rule falls out of the refcounts.

Failed downloads hold no reservation, but what they staged is on disk and counts as used
(callers pass ``staged_bytes``). A failed artifact that is still wanted (referenced or pinned)
keeps its staged data for a resume; it is reclaimed only when space is needed, after every
evictable ready artifact and only as much as needed to get under the high watermark (and
above the reserve): the hysteresis down to the low watermark applies to ready artifacts. A
failed artifact nobody wants is garbage: GC always drops it, and admission reclaims its data
first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
                "capacity: need 0 < lowWatermarkFrac <= highWatermarkFrac <= 1 "
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
    evict: tuple[str, ...]  # ready artifacts to delete
    freed_bytes: int  # evicted sizes plus the staged bytes of the discarded
    used_after_bytes: int  # cache usage after the evictions (and the admission, if any)
    discard: tuple[str, ...] = ()  # failed artifacts whose record and staged data go

    @property
    def empty(self) -> bool:
        return not self.evict and not self.discard


def occupied_bytes(records: Iterable[ArtifactRecord]) -> int:
    """Bytes the cache holds or has reserved (failed artifacts reserve nothing)."""
    return sum(r.size_bytes for r in records if r.state != ArtifactState.FAILED)


def lru_candidates(records: Iterable[ArtifactRecord]) -> list[ArtifactRecord]:
    return sorted((r for r in records if r.evictable), key=lambda r: (r.last_used_s, r.key))


def resumable(record: ArtifactRecord) -> bool:
    """A failed artifact whose staged data is kept for a resume while there is room."""
    return record.state == ArtifactState.FAILED and (bool(record.refs) or record.pinned)


@dataclass(frozen=True, slots=True)
class _Reclaimable:
    """What may be freed, in the order it goes: garbage, evictable ready LRU, partials LRU."""

    garbage: list[tuple[str, int]]  # failed, nobody wants it: (key, staged bytes)
    ready: list[tuple[str, int]]  # evictable ready artifacts: (key, size)
    partials: list[tuple[str, int]]  # failed but wanted, with staged data: (key, staged bytes)

    @property
    def staged_bytes(self) -> int:
        return sum(b for _, b in self.garbage) + sum(b for _, b in self.partials)

    @property
    def total_bytes(self) -> int:
        return self.staged_bytes + sum(b for _, b in self.ready)


def _reclaimable(
    recs: list[ArtifactRecord], staged_bytes: Mapping[str, int], skip_key: str | None = None
) -> _Reclaimable:
    failed = sorted(
        (r for r in recs if r.state == ArtifactState.FAILED and r.key != skip_key),
        key=lambda r: (r.last_used_s, r.key),
    )
    return _Reclaimable(
        garbage=[(r.key, staged_bytes.get(r.key, 0)) for r in failed if not resumable(r)],
        ready=[(r.key, r.size_bytes) for r in lru_candidates(recs)],
        partials=[
            (r.key, staged_bytes[r.key]) for r in failed if resumable(r) and staged_bytes.get(r.key)
        ],
    )


def _take(candidates: list[tuple[str, int]], target_bytes: int) -> tuple[list[str], int]:
    chosen: list[str] = []
    freed = 0
    for key, size_bytes in candidates:
        if freed >= target_bytes:
            break
        chosen.append(key)
        freed += size_bytes
    return chosen, freed


def _plan(
    pool: _Reclaimable,
    need_bytes: int,
    target_bytes: int,
    used_bytes: int,
    *,
    all_garbage: bool = False,
    all_ready: bool = False,
) -> EvictionPlan:
    """Free ``target_bytes`` (hysteresis included) from garbage and ready artifacts, in the
    pool's order, and wanted partial data only for what is still missing of ``need_bytes``
    (``all_*``: that whole group goes)."""
    garbage, freed_garbage = _take(pool.garbage, 1 << 62 if all_garbage else target_bytes)
    ready_target = 1 << 62 if all_ready else target_bytes - freed_garbage
    ready, freed_ready = _take(pool.ready, ready_target)
    partials, freed_partials = _take(pool.partials, need_bytes - freed_garbage - freed_ready)
    freed = freed_garbage + freed_ready + freed_partials
    return EvictionPlan(tuple(ready), freed, used_bytes - freed, tuple(garbage + partials))


def plan_admission(
    records: Iterable[ArtifactRecord],
    *,
    key: str,
    name: str,
    size_bytes: int,
    disk_free_bytes: int,
    policy: CapacityPolicy,
    staged_bytes: Mapping[str, int] | None = None,
) -> EvictionPlan:
    """Plan the evictions needed to admit ``size_bytes`` more, or raise naming the shortfall.

    ``disk_free_bytes`` is the file system's free space minus what in-flight downloads still
    have to write; ``staged_bytes`` what failed downloads staged (key -> bytes on disk).
    """
    recs = list(records)
    pool = _reclaimable(recs, staged_bytes or {}, skip_key=key)
    used = occupied_bytes(recs) + pool.staged_bytes
    existing = {r.key: r for r in recs}.get(key)
    if existing is not None and existing.state != ArtifactState.FAILED:
        return EvictionPlan((), 0, used)
    need_budget = used + size_bytes - policy.high_limit_bytes
    need_disk = size_bytes + policy.reserve_bytes - disk_free_bytes
    need = max(need_budget, need_disk, 0)
    if need == 0:
        return EvictionPlan((), 0, used + size_bytes)
    evictable = pool.total_bytes
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
    return _plan(pool, need, target, used + size_bytes)


def plan_gc(
    records: Iterable[ArtifactRecord],
    *,
    disk_free_bytes: int,
    policy: CapacityPolicy,
    evict_all_unreferenced: bool = False,
    staged_bytes: Mapping[str, int] | None = None,
) -> EvictionPlan:
    """Evictions for a periodic GC: only when above the high watermark (or below the disk
    reserve), then down to the low watermark; ``evict_all_unreferenced`` frees everything
    evictable (``warmfleet cache gc --all``). Failed artifacts nobody wants are always
    discarded; wanted ones keep their staged data unless space is needed after that."""
    recs = list(records)
    pool = _reclaimable(recs, staged_bytes or {})
    used = occupied_bytes(recs) + pool.staged_bytes
    need = target = 0
    if used > policy.high_limit_bytes:
        need, target = used - policy.high_limit_bytes, used - policy.low_limit_bytes
    if disk_free_bytes < policy.reserve_bytes:
        need = max(need, policy.reserve_bytes - disk_free_bytes)
        target = max(target, need)
    return _plan(pool, need, target, used, all_garbage=True, all_ready=evict_all_unreferenced)
