"""How long the tracker offers a node that has gone silent: a node that has not reported for
the stall bound while its fill is not complete (it died, before its file checks could withdraw
anything) is no longer a source, until it reports again; a node holding every piece has
finished and reports no more, so it stays offered."""

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


def test_a_node_holding_every_piece_stays_offered_past_the_bound() -> None:
    vt, clock = _tracker(2)
    vt.plan(_req("a", want=2))
    assert vt.plan(_req("a", have=(0, 1), hashes=((0, "h0"), (1, "h1")))).complete
    clock.advance(100 * STALL_S)  # a finished: it reports no more
    assert vt.holders(0) == vt.holders(1) == ["a"]
    plan = vt.plan(_req("c", want=2))
    assert {a.peer for a in plan.assignments} == {"a"}
    assert plan.hashes == {0: "h0", 1: "h1"}
