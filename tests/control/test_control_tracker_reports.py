"""The tracker's report fields beyond ``have``: ``withdrawn`` (a node takes back the piece
hashes it reported, its file having failed the manifest's digests) and ``fetching`` (a node
renews the assignments it is still fetching, so the stall bound does not hand them out again).
Reports without them (older agents) keep their meaning."""

from __future__ import annotations

import random
from typing import Any

import pytest

from warmfleet.control.tracker import (
    MAX_LISTED,
    Assignment,
    PlanRequest,
    Tracker,
    TrackerOptions,
    VersionTracker,
    listed_hashes,
    listed_pieces,
)
from warmfleet.core.clock import ManualClock
from warmfleet.core.errors import BadRequestError
from warmfleet.local.tracker_host import parse_request


def _tracker(pieces: int = 1, **options: Any) -> tuple[VersionTracker, ManualClock]:
    clock = ManualClock()
    return VersionTracker(pieces, clock, random.Random(0), TrackerOptions(**options)), clock


def _req(node: str, session: str = "s", /, **fields: Any) -> PlanRequest:
    return PlanRequest(node, f"http://{node}", session, **fields)


def test_a_withdrawn_hash_is_dropped_and_the_next_reported_one_taken() -> None:
    """a's origin copy was corrupt: it leaves (new session) withdrawing its hash. b, which copied
    the piece from a, still holds it but cannot be offered without a hash: the piece goes to the
    origin again (not waiting for a hash nobody will report), and the hash of that copy, not
    a's, is what peers are checked against from then on."""
    vt, _ = _tracker()
    assert vt.plan(_req("a", want=1)).assignments == (Assignment(0),)
    vt.plan(_req("a", have=(0,), hashes=((0, "bad"),)))
    assert vt.plan(_req("b", want=1)).hashes == {0: "bad"}  # b fetches it from a
    vt.plan(_req("b", have=(0,)))
    vt.plan(_req("a", "s2", withdrawn=(0,)))  # a's leave
    assert vt.table == {}
    assert vt.stats().withdrawn == 1
    assert vt.holders(0) == ["b"]
    assert vt.plan(_req("c", want=1)).assignments == (Assignment(0),)  # origin again, k=1
    assert vt.stats().origin_fallbacks == 0
    vt.plan(_req("c", have=(0,), hashes=((0, "good"),)))
    assert vt.table == {0: "good"}
    plan = vt.plan(_req("d", want=1))
    assert [a.peer for a in plan.assignments] in (["b"], ["c"])
    assert plan.hashes == {0: "good"}


def test_a_node_cannot_withdraw_a_hash_another_node_reported() -> None:
    vt, _ = _tracker(2, origin_fetches=2)
    vt.plan(_req("a", want=2))
    vt.plan(_req("b", want=2))
    vt.plan(_req("a", have=(0, 1), hashes=((0, "a0"), (1, "a1"))))
    vt.plan(_req("b", have=(0, 1), hashes=((0, "b0"), (1, "b1"))))  # second: not kept
    vt.plan(_req("b", withdrawn=(0, 1)))
    vt.plan(_req("c", withdrawn=(0,)))  # never reported anything
    assert vt.table == {0: "a0", 1: "a1"}
    assert vt.stats().withdrawn == 0
    assert vt.holders(0) == ["a"]  # b's copies are not offered any more


def test_a_withdrawal_drops_an_entry_only_if_it_is_the_hash_withdrawn() -> None:
    """a reported piece 0's hash in its first fill (h1, checked since: that fill failed on
    another file); its retry took the piece from the origin again and got other bytes (h2,
    not kept: h1 came first), and its file failed. The leave withdraws what the retry
    reported: piece 1's entry is that hash and goes, piece 0's is not (h1) and stays."""
    vt, _ = _tracker(2, origin_fetches=2)
    vt.plan(_req("a", "s1", want=2))
    vt.plan(_req("a", "s1", have=(0, 1), hashes=((0, "h1"), (1, "g"))))
    vt.plan(_req("a", "s2", want=2))  # the retry (a new session: it holds nothing)
    vt.plan(_req("a", "s2", have=(0, 1), hashes=((0, "h2"), (1, "g"))))
    body = {"node": "a", "url": "http://a", "session": "s3", "pieces": 2,
            "withdrawn": [0, 1], "withdrawnHashes": {"0": "h2", "1": "g"}}  # fmt: skip
    _, req = parse_request(body)  # the wire form, as the tracker host reads it
    vt.plan(req)
    assert vt.table == {0: "h1"}
    assert vt.reporter == {0: "a"}
    assert vt.stats().withdrawn == 1
    vt.plan(_req("a", "s4", withdrawn_hashes=((0, "h1"),)))  # without ``withdrawn``: the same
    assert vt.table == {}


def test_withdrawing_and_reporting_anew_in_one_report_keeps_the_new_hash() -> None:
    vt, _ = _tracker()
    vt.plan(_req("a", want=1))
    vt.plan(_req("a", have=(0,), hashes=((0, "old"),)))
    vt.plan(_req("a", have=(0,), hashes=((0, "new"),), withdrawn=(0,)))
    assert vt.table == {0: "new"}
    assert vt.holders(0) == ["a"]


def test_fetching_renews_an_assignment_past_the_stall_bound() -> None:
    """a's origin fetch is slow but a reports it as under way: b gets nothing (k=1) until a
    falls silent for the whole bound."""
    vt, clock = _tracker(stall_s=30.0)
    assert vt.plan(_req("a", want=1)).assignments == (Assignment(0),)
    for _ in range(4):
        clock.advance(20.0)
        vt.plan(_req("a", fetching=(0,)))
        assert not vt.plan(_req("b", want=1)).assignments
    assert vt.stats().released == 0
    clock.advance(31.0)  # a is gone
    assert vt.plan(_req("b", want=1)).assignments == (Assignment(0),)
    assert vt.stats().released == 1


def test_fetching_does_not_bring_back_a_released_assignment() -> None:
    vt, clock = _tracker(stall_s=30.0)
    vt.plan(_req("a", want=1))
    clock.advance(31.0)
    assert vt.plan(_req("b", want=1)).assignments == (Assignment(0),)
    vt.plan(_req("a", fetching=(0,)))  # too late: b has it now
    assert vt.uploads("") == 1  # one origin fetch under way, b's
    assert not vt.nodes["a"].in_flight


def test_a_peer_assignment_renewed_keeps_its_upload_counted() -> None:
    vt, clock = _tracker(stall_s=30.0)
    vt.plan(_req("a", want=1))
    vt.plan(_req("a", have=(0,), hashes=((0, "h"),)))
    vt.plan(_req("b", want=1))
    clock.advance(25.0)
    vt.plan(_req("b", fetching=(0,)))
    clock.advance(25.0)
    vt.plan(_req("c"))
    assert vt.uploads("a") == 1


@pytest.mark.parametrize("name", ["withdrawn", "fetching"])
def test_listed_pieces_out_of_range_or_too_many_are_refused_before_anything_is_learnt(
    name: str,
) -> None:
    vt, _ = _tracker(3)
    for listed in ((3,), (-1,), (0,) * (MAX_LISTED + 1)):
        with pytest.raises(BadRequestError, match=name):
            vt.plan(_req("a", have=(0,), hashes=((0, "h"),), want=1, **{name: listed}))
    assert vt.nodes == {}
    assert vt.table == {}
    tracker = Tracker(ManualClock(), random.Random(0), TrackerOptions())
    with pytest.raises(BadRequestError):
        tracker.plan("v", 2, _req("a", **{name: (2,)}))


@pytest.mark.parametrize("name", ["withdrawn", "fetching"])
def test_the_wire_form_of_a_listed_field_is_checked(name: str) -> None:
    assert listed_pieces({}, name) == ()
    assert listed_pieces({name: None}, name) == ()
    assert listed_pieces({name: [0, 5, 2]}, name) == (0, 5, 2)
    assert len(listed_pieces({name: [1] * MAX_LISTED}, name)) == MAX_LISTED
    for bad in ([1] * (MAX_LISTED + 1), "0,1", {"0": 1}, 3, ["1"], [1.0], [True], [None]):
        with pytest.raises(BadRequestError, match=name):
            listed_pieces({name: bad}, name)


def test_the_wire_form_of_withdrawn_hashes_is_checked() -> None:
    name = "withdrawnHashes"
    assert listed_hashes({}, name) == ()
    assert listed_hashes({name: None}, name) == ()
    assert listed_hashes({name: {"0": "a", "12": "b"}}, name) == ((0, "a"), (12, "b"))
    many = {str(i): "h" for i in range(MAX_LISTED + 1)}
    for bad in (many, [0], "0", {"x": "h"}, {"-1": "h"}, {"1.0": "h"}, {"٣": "h"},
                {"0": 1}, {"0": ""}, {"0": "h" * 129}, {"0": None}):  # fmt: skip
        with pytest.raises(BadRequestError, match=name):
            listed_hashes({name: bad}, name)
    with pytest.raises(BadRequestError, match=name):
        parse_request({"node": "a", "url": "u", "session": "s", "pieces": 1, name: {"0": 5}})


def test_withdrawn_hashes_out_of_range_are_refused_before_anything_is_learnt() -> None:
    vt, _ = _tracker(3)
    with pytest.raises(BadRequestError, match="withdrawnHashes"):
        vt.plan(_req("a", have=(0,), hashes=((0, "h"),), withdrawn_hashes=((3, "h"),)))
    assert (vt.nodes, vt.table) == ({}, {})


def test_an_old_report_still_plans() -> None:
    """An agent that predates ``withdrawn``/``fetching``: its report parses and plans as
    before (the fields default to none)."""
    body = {"node": "a", "url": "http://a", "session": "s", "pieces": 2, "want": 2,
            "have": [], "hashes": {}, "failedPeers": [], "released": []}  # fmt: skip
    pieces, req = parse_request(body)
    assert (req.withdrawn, req.fetching) == ((), ())
    tracker = Tracker(ManualClock(), random.Random(0), TrackerOptions())
    assert len(tracker.plan("v", pieces, req).assignments) == 2


def test_the_trackers_http_host_reads_both_fields() -> None:
    body = {"node": "a", "url": "http://a", "session": "s", "pieces": 4,
            "withdrawn": [1, 2], "fetching": [3]}  # fmt: skip
    _, req = parse_request(body)
    assert (req.withdrawn, req.fetching) == ((1, 2), (3,))
    with pytest.raises(BadRequestError, match="withdrawn"):
        parse_request({**body, "withdrawn": "1,2"})
