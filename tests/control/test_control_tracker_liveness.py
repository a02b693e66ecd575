"""How long the tracker offers a node that has gone silent: a node that has not reported for
the stall bound (it died mid-fill, before its file checks could withdraw anything, or after its
fill) is no longer a source, until it reports again; a node that serves a version after its
fill keeps reporting, so it stays offered; a node that leaves is forgotten at once."""

from __future__ import annotations

import random

from warmfleet.control.tracker import Assignment, PlanRequest, TrackerOptions, VersionTracker
from warmfleet.core.clock import ManualClock

STALL_S = 30.0


def _tracker(pieces: int) -> tuple[VersionTracker, ManualClock]:
    clock = ManualClock()
    options = TrackerOptions(stall_s=STALL_S)
    return VersionTracker(pieces, clock, random.Random(0), options), clock


def _req(node: str, **fields: object) -> PlanRequest:
    return PlanRequest(node, f"http://{node}", "s", **fields)  # type: ignore[arg-type]


def _dies_mid_fill(vt: VersionTracker) -> None:
    """a takes both pieces from the origin, reports piece 0 (and its hash), then says nothing."""
    assert vt.plan(_req("a", want=2)).assignments == (Assignment(0), Assignment(1))
    vt.plan(_req("a", have=(0,), hashes=((0, "h0"),), fetching=(1,)))


def test_a_node_silent_past_the_stall_bound_mid_fill_is_no_longer_offered() -> None:
    vt, clock = _tracker(2)
    _dies_mid_fill(vt)
    clock.advance(STALL_S)
    assert vt.holders(0) == ["a"]  # up to the bound, a may just be slow to report
    clock.advance(0.1)
    assert vt.holders(0) == []
    plan = vt.plan(_req("c", want=2))
    # piece 1: a's assignment released by the stall bound; piece 0: no live holder, the origin
    assert plan.assignments == (Assignment(1), Assignment(0))
    assert plan.hashes == {}
    assert vt.stats().origin_fallbacks == 1


def test_a_silent_node_that_reports_again_is_offered_again() -> None:
    vt, clock = _tracker(2)
    _dies_mid_fill(vt)
    clock.advance(STALL_S + 1)
    assert vt.holders(0) == []
    vt.plan(_req("a"))  # it was cut off from the tracker, not dead: same session, same pieces
    assert vt.holders(0) == ["a"]
    assert vt.plan(_req("c", want=1)).assignments == (Assignment(1),)  # origin first
    assert vt.plan(_req("d", want=2)).assignments[-1:] == (Assignment(0, "a", "http://a"),)


def _finished(vt: VersionTracker) -> None:
    """a takes both pieces from the origin and reports them: its fill is over."""
    vt.plan(_req("a", want=2))
    assert vt.plan(_req("a", have=(0, 1), hashes=((0, "h0"), (1, "h1")))).complete


def test_a_finished_node_silent_past_the_bound_is_no_longer_offered() -> None:
    """a finished its fill, then died (or left the fleet without a word): after the bound it
    is not handed to every later fill (each ask of it would fail and cost a stall)."""
    vt, clock = _tracker(2)
    _finished(vt)
    clock.advance(STALL_S)
    assert vt.holders(0) == vt.holders(1) == ["a"]
    clock.advance(0.1)
    assert vt.holders(0) == vt.holders(1) == []
    plan = vt.plan(_req("c", want=2))
    assert {a.peer for a in plan.assignments} == {""}  # the origin, past k
    assert vt.stats().origin_fallbacks == 2


def test_a_finished_node_that_keeps_reporting_stays_offered() -> None:
    """A node that serves a version after its fill renews it every renewS with a report that
    holds nothing (same session, want 0): it stays offered however long it serves."""
    vt, clock = _tracker(2)
    _finished(vt)
    for _ in range(10):
        clock.advance(STALL_S / 2)
        assert vt.plan(_req("a")).complete  # the renewal: it still holds every piece
    assert vt.holders(0) == vt.holders(1) == ["a"]
    plan = vt.plan(_req("c", want=2))
    assert {a.peer for a in plan.assignments} == {"a"}
    assert plan.hashes == {0: "h0", 1: "h1"}


def test_a_node_that_leaves_is_forgotten_at_once() -> None:
    """A leave (a report in a new session holding nothing: a stopped agent, an evicted
    version) takes the node off the list without waiting for the bound."""
    vt, _ = _tracker(2)
    _finished(vt)
    vt.plan(PlanRequest("a", "http://a", "leave"))
    assert vt.holders(0) == vt.holders(1) == []
