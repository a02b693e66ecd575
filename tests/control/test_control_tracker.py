"""The peer tracker (``control.tracker``): k origin copies, peers after, failures re-planned."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.control.tracker import (
    Assignment,
    PlanRequest,
    Tracker,
    TrackerOptions,
    VersionTracker,
)
from warmfleet.core.clock import ManualClock
from warmfleet.core.errors import BadRequestError


def _digest(piece: int) -> str:
    return f"h{piece}"


def _fill(
    nodes: int,
    pieces: int,
    *,
    k: int = 1,
    bad: frozenset[str] = frozenset(),
    seed: int = 0,
    max_rounds: int = 10_000,
) -> tuple[VersionTracker, dict[str, list[Assignment]]]:
    """Every node asks for 2 pieces at a time; an assignment finishes at its node's next call
    (origin: hash reported; a peer in ``bad``: the piece is rejected and the peer reported)."""
    clock = ManualClock()
    vt = VersionTracker(pieces, clock, random.Random(seed), TrackerOptions(origin_fetches=k))
    names = [f"n{i}" for i in range(nodes)]
    for b in sorted(bad):  # bad peers claim everything from the start
        vt.plan(PlanRequest(b, f"http://{b}", b, have=tuple(range(pieces))))
    pending: dict[str, list[Assignment]] = {n: [] for n in names}
    seen: dict[str, list[Assignment]] = {n: [] for n in names}
    done: set[str] = set()
    for _ in range(max_rounds):
        if len(done) == nodes:
            break
        for name in names:
            have, hashes, failed, released = [], [], [], []
            for a in pending[name]:
                if a.peer in bad:
                    failed.append(a.peer)
                    released.append(a.piece)
                    continue
                have.append(a.piece)
                if a.from_origin:
                    hashes.append((a.piece, _digest(a.piece)))
            plan = vt.plan(PlanRequest(name, f"http://{name}", "s", tuple(have), tuple(hashes),
                                       tuple(failed), tuple(released), want=2))  # fmt: skip
            for a in plan.assignments:
                if not a.from_origin:
                    assert plan.hashes[a.piece] == _digest(a.piece)  # checked before written
            pending[name] = list(plan.assignments)
            seen[name] += plan.assignments
            if plan.complete:
                done.add(name)
        clock.advance(0.1)
    assert len(done) == nodes, "every node completes"
    return vt, seen


def test_k1_origin_once_per_piece_then_peers() -> None:
    vt, seen = _fill(6, 40)
    stats = vt.stats()
    assert stats.origin_assignments == 40
    assert stats.origin_fallbacks == 0
    assert stats.peer_assignments == 5 * 40
    origin = [a.piece for s in seen.values() for a in s if a.from_origin]
    assert sorted(origin) == list(range(40))


def test_k2_two_origin_copies() -> None:
    vt, _ = _fill(4, 10, k=2)
    assert vt.stats().origin_assignments == 20


def test_bad_peer_dropped_once_per_node_and_pieces_replanned() -> None:
    vt, seen = _fill(4, 12, bad=frozenset({"evil"}))
    for name, assignments in seen.items():
        evil = [a for a in assignments if a.peer == "evil"]
        assert len(evil) <= 2, f"{name} asked evil again after dropping it"  # one batch at most
    assert vt.stats().origin_assignments == 12


@settings(max_examples=30, deadline=None)
@given(
    nodes=st.integers(1, 6),
    pieces=st.integers(0, 30),
    k=st.integers(1, 3),
    bad=st.sets(st.sampled_from(["x", "y"]), max_size=2),
    seed=st.integers(0, 1000),
)
def test_every_node_completes_and_origin_bounded(
    nodes: int, pieces: int, k: int, bad: set[str], seed: int
) -> None:
    vt, seen = _fill(nodes, pieces, k=k, bad=frozenset(bad), seed=seed)
    per_piece: dict[int, int] = {}
    for assignments in seen.values():
        for a in assignments:
            if a.from_origin:
                per_piece[a.piece] = per_piece.get(a.piece, 0) + 1
    # without faults of real holders, the origin serves each piece at most k times
    assert all(count <= k for count in per_piece.values())
    assert vt.stats().origin_fallbacks == 0


def test_fallback_to_origin_when_only_dropped_peers_hold_a_piece() -> None:
    clock = ManualClock()
    vt = VersionTracker(1, clock, random.Random(0), TrackerOptions())
    plan = vt.plan(PlanRequest("a", "http://a", "s", want=1))
    assert plan.assignments == (Assignment(0),)
    vt.plan(PlanRequest("a", "http://a", "s", have=(0,), hashes=((0, "h"),)))
    plan = vt.plan(PlanRequest("b", "http://b", "s", want=1))
    assert plan.assignments == (Assignment(0, "a", "http://a"),)
    plan = vt.plan(PlanRequest("b", "http://b", "s", failed_peers=("a",), released=(0,), want=1))
    assert plan.assignments == (Assignment(0),)  # origin last
    assert vt.stats().origin_fallbacks == 1


def test_stalled_assignment_released_and_new_session_forgets() -> None:
    clock = ManualClock()
    vt = VersionTracker(2, clock, random.Random(0), TrackerOptions(stall_s=5.0))
    first = vt.plan(PlanRequest("a", "http://a", "s1", want=2))
    assert len(first.assignments) == 2
    assert not vt.plan(PlanRequest("b", "http://b", "s1", want=2)).assignments  # wait (k=1)
    clock.advance(6.0)
    again = vt.plan(PlanRequest("b", "http://b", "s1", want=2))
    assert {a.piece for a in again.assignments} == {0, 1}  # a died: released, re-planned
    vt.plan(PlanRequest("b", "http://b", "s1", have=(0, 1), hashes=((0, "h"), (1, "h"))))
    assert vt.holders(0) == ["b"]
    vt.plan(PlanRequest("b", "http://b", "s2"))  # b restarted: what it held is gone
    assert vt.holders(0) == []


def test_origin_streams_bound_the_origin_fetches_under_way() -> None:
    vt = VersionTracker(20, ManualClock(), random.Random(0), TrackerOptions(origin_streams=3))
    total = sum(len(vt.plan(PlanRequest(n, n, "s", want=4)).assignments) for n in "abcd")
    assert total == 3


def test_piece_count_mismatch_is_a_bad_request() -> None:
    tracker = Tracker(ManualClock(), random.Random(0), TrackerOptions())
    tracker.plan("v", 3, PlanRequest("a", "u", "s"))
    with pytest.raises(BadRequestError):
        tracker.plan("v", 4, PlanRequest("a", "u", "s"))
    tracker.retain([])
    assert tracker.versions == {}


def test_options_validated() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        TrackerOptions(origin_fetches=0)
