"""Property tests of capacity planning: budget, protection of pinned/referenced, idempotence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.cache.capacity import (
    CapacityPolicy,
    EvictionPlan,
    occupied_bytes,
    plan_admission,
    plan_gc,
)
from warmfleet.cache.index import CacheIndex, EvictionRefusedError
from warmfleet.cache.state import ArtifactRecord, ArtifactState
from warmfleet.core.errors import InsufficientCapacityError

STATES = [ArtifactState.READY] * 4 + [
    ArtifactState.DOWNLOADING,
    ArtifactState.PENDING,
    ArtifactState.FAILED,
]


@st.composite
def records(draw: st.DrawFn) -> list[ArtifactRecord]:
    n = draw(st.integers(0, 12))
    out = []
    for i in range(n):
        out.append(
            ArtifactRecord(
                key=f"k{i:02d}",
                name=f"m{i % 4}",
                uri=f"s3://b/m{i}",
                size_bytes=draw(st.integers(1, 400)),
                state=draw(st.sampled_from(STATES)),
                refs=frozenset(draw(st.sets(st.sampled_from(["d1", "d2"]), max_size=1))),
                pinned=draw(st.booleans()),
                last_used_s=float(draw(st.integers(0, 50))),
            )
        )
    return out


@st.composite
def policies(draw: st.DrawFn) -> CapacityPolicy:
    low = draw(st.floats(0.3, 1.0))
    high = draw(st.floats(low, 1.0))
    return CapacityPolicy(
        budget_bytes=draw(st.integers(100, 3000)),
        reserve_bytes=draw(st.integers(0, 200)),
        high_watermark_frac=high,
        low_watermark_frac=low,
    )


def apply(recs: list[ArtifactRecord], plan: EvictionPlan) -> list[ArtifactRecord]:
    idx = CacheIndex(recs)
    idx.check_evictions(plan)  # refuses protected artifacts
    return [r for r in recs if r.key not in set(plan.evict)]


@settings(max_examples=150, deadline=None)
@given(records(), policies(), st.integers(1, 1500), st.integers(0, 4000))
def test_admission_never_exceeds_budget_nor_touches_protected(recs, policy, size, disk_free):
    protected = {r.key for r in recs if not r.evictable}
    used = occupied_bytes(recs)
    try:
        plan = plan_admission(
            recs, key="new", name="new", size_bytes=size, disk_free_bytes=disk_free, policy=policy
        )
    except InsufficientCapacityError as err:
        # honest refusal: even evicting every evictable artifact would not make room
        evictable = sum(r.size_bytes for r in recs if r.evictable)
        fits_budget = used - evictable + size <= policy.high_limit_bytes
        fits_disk = disk_free + evictable - size >= policy.reserve_bytes
        assert not (fits_budget and fits_disk)
        refusal = err
        assert refusal.needed_bytes == size
        assert "short by" in str(refusal)
        return
    assert not (set(plan.evict) & protected)
    after = apply(recs, plan)
    after.append(ArtifactRecord("new", "new", "x", size, ArtifactState.DOWNLOADING))
    assert occupied_bytes(after) <= policy.high_limit_bytes
    assert disk_free + plan.freed_bytes - size >= policy.reserve_bytes
    # re-planning the same admission (now in progress) and a GC are both empty
    again = plan_admission(
        after,
        key="new",
        name="new",
        size_bytes=size,
        disk_free_bytes=disk_free + plan.freed_bytes - size,
        policy=policy,
    )
    assert again.empty
    gc = plan_gc(after, disk_free_bytes=disk_free + plan.freed_bytes - size, policy=policy)
    assert gc.empty


@settings(max_examples=150, deadline=None)
@given(records(), policies(), st.integers(0, 4000))
def test_gc_is_idempotent_and_protects(recs, policy, disk_free):
    plan = plan_gc(recs, disk_free_bytes=disk_free, policy=policy)
    protected = {r.key for r in recs if not r.evictable}
    assert not (set(plan.evict) & protected)
    after = apply(recs, plan)
    again = plan_gc(after, disk_free_bytes=disk_free + plan.freed_bytes, policy=policy)
    assert again.empty
    if plan.evict:  # evictions go LRU-first
        evicted_times = [r.last_used_s for r in recs if r.key in set(plan.evict)]
        kept = [r.last_used_s for r in after if r.evictable]
        assert not kept or max(evicted_times) <= min(kept)


def test_refusal_names_the_shortfall():
    policy = CapacityPolicy(budget_bytes=1000, reserve_bytes=0, high_watermark_frac=1.0)
    recs = [ArtifactRecord("a", "a", "u", 700, ArtifactState.READY, pinned=True)]
    with pytest.raises(InsufficientCapacityError, match="short by 200 bytes") as info:
        plan_admission(
            recs, key="b", name="big", size_bytes=500, disk_free_bytes=10**9, policy=policy
        )
    assert info.value.available_bytes == 300


def test_update_needs_room_for_old_and_new():
    policy = CapacityPolicy(budget_bytes=1000, high_watermark_frac=1.0, low_watermark_frac=1.0)
    old = ArtifactRecord("v1", "m", "u", 600, ArtifactState.READY, refs=frozenset({"dep"}))
    with pytest.raises(InsufficientCapacityError):
        plan_admission(
            [old], key="v2", name="m", size_bytes=600, disk_free_bytes=10**9, policy=policy
        )
    unreferenced = ArtifactRecord("v1", "m", "u", 600, ArtifactState.READY)
    plan = plan_admission(
        [unreferenced], key="v2", name="m", size_bytes=600, disk_free_bytes=10**9, policy=policy
    )
    assert plan.evict == ("v1",)


def test_watermark_hysteresis_frees_down_to_low():
    policy = CapacityPolicy(budget_bytes=1000, high_watermark_frac=0.9, low_watermark_frac=0.5)
    recs = [
        ArtifactRecord(f"k{i}", "m", "u", 200, ArtifactState.READY, last_used_s=float(i))
        for i in range(4)
    ]
    plan = plan_admission(
        recs, key="n", name="n", size_bytes=200, disk_free_bytes=10**9, policy=policy
    )
    assert plan.evict == ("k0", "k1", "k2")  # 1000 -> 400 <= low watermark 500
    assert plan.used_after_bytes == 400


def test_index_refuses_protected_eviction():
    idx = CacheIndex([ArtifactRecord("a", "a", "u", 1, ArtifactState.READY, pinned=True)])
    with pytest.raises(EvictionRefusedError):
        idx.check_evictions(EvictionPlan(("a",), 1, 0))
