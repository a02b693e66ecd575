"""The zero-ready hold (``routing.hold``): pure, on an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.routing.hold import HoldOutcome, Waiter, ZeroReadyHold


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_release_serves_the_waiters_in_arrival_order() -> None:
    clock = Clock()
    hold = ZeroReadyHold(3, 10.0, clock)
    first, second = hold.admit("v"), hold.admit("v")
    other = hold.admit("w")
    assert (hold.held("v"), hold.held("w")) == (2, 1)
    clock.now_s = 5.0
    assert hold.release("v") == [first, second]
    assert hold.held("v") == 0
    assert hold.held("w") == 1
    assert hold.outcomes[("v", HoldOutcome.SERVED)] == 2
    assert other is not None
    assert other.deadline_s == 10.0


def test_bounded_in_count() -> None:
    hold = ZeroReadyHold(1, 10.0, Clock())
    assert hold.admit("v") is not None
    assert hold.admit("v") is None
    assert hold.outcomes[("v", HoldOutcome.FULL)] == 1
    assert hold.admit("w") is not None  # per variant


def test_bounded_in_time() -> None:
    clock = Clock()
    hold = ZeroReadyHold(4, 2.0, clock)
    early = hold.admit("v")
    clock.now_s = 1.5
    late = hold.admit("v")
    clock.now_s = 2.5
    assert hold.next_deadline_s() == 2.0
    assert hold.expire() == [early]
    assert hold.release("v") == [late]
    assert hold.outcomes[("v", HoldOutcome.TIMEOUT)] == 1


def test_release_after_the_deadline_is_a_timeout() -> None:
    clock = Clock()
    hold = ZeroReadyHold(4, 1.0, clock)
    hold.admit("v")
    clock.now_s = 1.5
    assert hold.release("v") == []
    assert hold.outcomes == {("v", HoldOutcome.TIMEOUT): 1}


def test_leave_counts_once() -> None:
    hold = ZeroReadyHold(4, 1.0, Clock())
    waiter = hold.admit("v")
    assert waiter is not None
    assert hold.leave(waiter, HoldOutcome.CANCELLED) is True
    assert hold.leave(waiter, HoldOutcome.TIMEOUT) is False
    assert hold.outcomes == {("v", HoldOutcome.CANCELLED): 1}


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_held"):
        ZeroReadyHold(0, 1.0, Clock())
    with pytest.raises(ValueError, match="timeout_s"):
        ZeroReadyHold(1, 0.0, Clock())


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "release", "expire", "leave", "tick"]),
        st.sampled_from(["a", "b"]),
        st.floats(0.0, 3.0),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), _OPS)
def test_every_admitted_request_ends_exactly_once_within_bounds(
    max_held: int, ops: list[tuple[str, str, float]]
) -> None:
    """Never more than ``max_held`` per variant; a waiter is served only within its deadline;
    every admitted waiter ends in exactly one outcome (counted), and the counts add up."""
    clock = Clock()
    hold = ZeroReadyHold(max_held, 2.0, clock)
    live: list[Waiter] = []
    ended: set[int] = set()
    admitted = refused = 0
    for op, key, value in ops:
        if op == "admit":
            waiter = hold.admit(key)
            if waiter is None:
                refused += 1
                assert hold.held(key) == max_held
            else:
                admitted += 1
                live.append(waiter)
        elif op == "release":
            for waiter in hold.release(key):
                assert waiter.deadline_s >= clock.now_s
                assert waiter.seq not in ended
                ended.add(waiter.seq)
        elif op == "expire":
            for waiter in hold.expire():
                assert waiter.deadline_s < clock.now_s
                assert waiter.seq not in ended
                ended.add(waiter.seq)
        elif op == "leave" and live:
            waiter = live[int(value * 10) % len(live)]
            if hold.leave(waiter, HoldOutcome.CANCELLED):
                assert waiter.seq not in ended
                ended.add(waiter.seq)
        else:
            clock.now_s += value
        assert all(hold.held(k) <= max_held for k in ("a", "b"))
    waiting = hold.held("a") + hold.held("b")
    counted = sum(n for (_, outcome), n in hold.outcomes.items() if outcome != HoldOutcome.FULL)
    full = sum(n for (_, outcome), n in hold.outcomes.items() if outcome == HoldOutcome.FULL)
    assert full == refused
    assert counted + waiting == admitted
