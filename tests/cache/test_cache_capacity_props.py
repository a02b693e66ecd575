"""Property tests of capacity planning: budget, protection of pinned/referenced, idempotence."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.cache.capacity import (
    CapacityPolicy,
    EvictionPlan,
    occupied_bytes,
    plan_admission,
    plan_gc,
    resumable,
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


@st.composite
def with_staged(draw: st.DrawFn) -> tuple[list[ArtifactRecord], dict[str, int]]:
    """Records plus the bytes their failed downloads left in staging (what survives GC)."""
    recs = draw(records())
    failed = [r for r in recs if r.state == ArtifactState.FAILED]
    return recs, {r.key: draw(st.integers(0, r.size_bytes)) for r in failed}


def apply(recs: list[ArtifactRecord], plan: EvictionPlan) -> list[ArtifactRecord]:
    idx = CacheIndex(recs)
    idx.check_evictions(plan)  # refuses protected artifacts
    gone = set(plan.evict) | set(plan.discard)
    return [r for r in recs if r.key not in gone]


def check_reclaim_order(recs: list[ArtifactRecord], plan: EvictionPlan) -> None:
    """Only failed records are discarded; kept partial data goes only after every evictable
    ready artifact; evictions go LRU-first."""
    by_key = {r.key: r for r in recs}
    assert all(by_key[k].state == ArtifactState.FAILED for k in plan.discard)
    protected = {r.key for r in recs if not r.evictable}
    assert not (set(plan.evict) & protected)
    if any(resumable(by_key[k]) for k in plan.discard):
        assert set(plan.evict) == {r.key for r in recs if r.evictable}
    if plan.evict:
        evicted_times = [by_key[k].last_used_s for k in plan.evict]
        kept = [r.last_used_s for r in recs if r.evictable and r.key not in plan.evict]
        assert not kept or max(evicted_times) <= min(kept)


@settings(max_examples=150, deadline=None)
@given(with_staged(), policies(), st.integers(1, 1500), st.integers(0, 4000))
def test_admission_never_exceeds_budget_nor_touches_protected(
    recs_staged: tuple[list[ArtifactRecord], dict[str, int]],
    policy: CapacityPolicy,
    size: int,
    free: int,
) -> None:
    recs, staged = recs_staged
    used = occupied_bytes(recs) + sum(staged.values())
    admit = functools.partial(plan_admission, key="new", name="new", size_bytes=size, policy=policy)
    try:
        plan = admit(recs, disk_free_bytes=free, staged_bytes=staged)
    except InsufficientCapacityError as err:
        # honest refusal: even evicting every evictable artifact would not make room
        evictable = sum(r.size_bytes for r in recs if r.evictable) + sum(staged.values())
        fits_budget = used - evictable + size <= policy.high_limit_bytes
        fits_disk = free + evictable - size >= policy.reserve_bytes
        assert not (fits_budget and fits_disk)
        refusal = err
        assert refusal.needed_bytes == size
        assert "short by" in str(refusal)
        return
    check_reclaim_order(recs, plan)
    after = apply(recs, plan)
    staged_after = {k: v for k, v in staged.items() if k not in plan.discard}
    after.append(ArtifactRecord("new", "new", "x", size, ArtifactState.DOWNLOADING))
    assert occupied_bytes(after) + sum(staged_after.values()) <= policy.high_limit_bytes
    free_after = free + plan.freed_bytes - size
    assert free_after >= policy.reserve_bytes
    # re-planning the same admission (now in progress) is empty, a GC evicts nothing and
    # drops only failed downloads nobody wants
    again = admit(after, disk_free_bytes=free_after, staged_bytes=staged_after)
    assert again.empty
    gc = plan_gc(after, disk_free_bytes=free_after, policy=policy, staged_bytes=staged_after)
    assert gc.evict == ()
    assert set(gc.discard) == {r.key for r in after if r.state == ArtifactState.FAILED} - {
        r.key for r in after if resumable(r)
    }


@settings(max_examples=150, deadline=None)
@given(with_staged(), policies(), st.integers(0, 4000), st.booleans())
def test_gc_is_idempotent_and_protects(
    recs_staged: tuple[list[ArtifactRecord], dict[str, int]],
    policy: CapacityPolicy,
    free: int,
    evict_all: bool,
) -> None:
    recs, staged = recs_staged
    plan = plan_gc(
        recs,
        disk_free_bytes=free,
        policy=policy,
        staged_bytes=staged,
        evict_all_unreferenced=evict_all,
    )
    check_reclaim_order(recs, plan)
    garbage = {r.key for r in recs if r.state == ArtifactState.FAILED and not resumable(r)}
    assert garbage <= set(plan.discard)  # failed downloads nobody wants always go
    used = occupied_bytes(recs) + sum(staged.values())
    needs_space = used > policy.high_limit_bytes or free < policy.reserve_bytes
    if not needs_space:  # wanted partial data survives while there is room
        assert set(plan.discard) == garbage
        assert evict_all or plan.evict == ()
    after = apply(recs, plan)
    staged_after = {k: v for k, v in staged.items() if k not in plan.discard}
    again = plan_gc(
        after, disk_free_bytes=free + plan.freed_bytes, policy=policy, staged_bytes=staged_after
    )
    assert again.empty


def test_gc_keeps_a_wanted_partial_download_while_there_is_room() -> None:
    """A failed download still held (or pinned) keeps its staged data through GC, even
    ``gc --all``; one nobody wants is dropped; when space is needed, unwanted ready data goes
    first and the partial data last."""
    policy = CapacityPolicy(budget_bytes=1000, high_watermark_frac=0.9, low_watermark_frac=0.5)
    held = ArtifactRecord("p", "m", "u", 600, ArtifactState.FAILED, refs=frozenset({"d"}))
    pinned = ArtifactRecord("q", "n", "u", 100, ArtifactState.FAILED, pinned=True)
    orphan = ArtifactRecord("o", "o", "u", 100, ArtifactState.FAILED)
    old = ArtifactRecord("r", "r", "u", 200, ArtifactState.READY, last_used_s=1.0)
    staged = {"p": 300, "q": 50, "o": 40}
    for evict_all in (False, True):
        plan = plan_gc(
            [held, pinned, orphan, old],
            disk_free_bytes=10**9,
            policy=policy,
            staged_bytes=staged,
            evict_all_unreferenced=evict_all,
        )
        assert plan.discard == ("o",)
        assert plan.evict == (("r",) if evict_all else ())
    # 300 + 50 + 200 + a new 600 is 250 over 900: "r" goes first, then only as much partial
    # data as is still missing (hysteresis down to the low watermark applies to ready data)
    plan = plan_admission(
        [held, pinned, old],
        key="new",
        name="new",
        size_bytes=600,
        disk_free_bytes=10**9,
        policy=policy,
        staged_bytes=staged,
    )
    assert (plan.evict, plan.discard) == (("r",), ("p",))
    # 550 is 250 over a 300 budget: GC reclaims partial data too, after the ready artifact
    plan = plan_gc(
        [held, pinned, old],
        disk_free_bytes=10**9,
        policy=CapacityPolicy(budget_bytes=300, high_watermark_frac=1.0, low_watermark_frac=0.5),
        staged_bytes=staged,
    )
    assert (plan.evict, plan.discard) == (("r",), ("p",))


def test_refusal_names_the_shortfall() -> None:
    policy = CapacityPolicy(budget_bytes=1000, reserve_bytes=0, high_watermark_frac=1.0)
    recs = [ArtifactRecord("a", "a", "u", 700, ArtifactState.READY, pinned=True)]
    with pytest.raises(InsufficientCapacityError, match="short by 200 bytes") as info:
        plan_admission(
            recs, key="b", name="big", size_bytes=500, disk_free_bytes=10**9, policy=policy
        )
    assert info.value.available_bytes == 300


def test_update_needs_room_for_old_and_new() -> None:
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


def test_watermark_hysteresis_frees_down_to_low() -> None:
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


def test_index_refuses_protected_eviction() -> None:
    idx = CacheIndex([ArtifactRecord("a", "a", "u", 1, ArtifactState.READY, pinned=True)])
    with pytest.raises(EvictionRefusedError):
        idx.check_evictions(EvictionPlan(("a",), 1, 0))
