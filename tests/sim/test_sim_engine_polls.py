"""The engines' queue and KV usage as a strategy that polls their metrics sees them in the
simulator (``sim.fleet.EnginePolls``): as of the latest poll, never fresher."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_simulator import SPEC, _keys

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.engine.events import EngineStats
from warmfleet.sim.fleet import EnginePolls, Server
from warmfleet.sim.simulator import SimConfig, Simulator
from warmfleet.sim.workloads.base import Segment, WorkloadRequest


class _Fixed:
    """A server whose stats a test sets."""

    def __init__(self) -> None:
        self.waiting = 0
        self.usage = 0.0

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, self.waiting, self.usage, 0, 0)


def test_polls_read_the_engines_once_a_poll_time_passes() -> None:
    a, b = _Fixed(), _Fixed()
    servers: dict[InstanceId, Server] = {"a": a, "b": b}  # type: ignore[dict-item]
    polls = EnginePolls(1.0)
    assert polls.polled == {}  # nothing read yet: unknown
    polls.advance(0.0, servers)  # the poll at 0 s
    assert polls.polled == {"a": (0, 0.0), "b": (0, 0.0)}
    a.waiting, b.usage = 5, 0.5
    polls.advance(0.4, servers)
    polls.advance(0.999, servers)
    assert polls.polled["a"] == (0, 0.0)  # no poll since
    polls.advance(1.7, servers)  # the poll at 1 s: the state since the last event
    assert polls.polled == {"a": (5, 0.0), "b": (0, 0.5)}
    a.waiting = 9
    polls.advance(1.9, servers)
    assert polls.polled["a"] == (5, 0.0)
    polls.advance(7.2, servers)  # several polls passed: the state they all saw
    assert polls.polled["a"] == (9, 0.0)


class _Recorder:
    """Routes by turns and records the engine figures each snapshot carried."""

    name = "recorder"
    reads_block_hashes = False

    def __init__(self, interval_s: float | None) -> None:
        if interval_s is not None:
            self.engine_stats_interval_s = interval_s
        self.seen: list[tuple[float, tuple[int, ...]]] = []
        self._turn = 0

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        self.seen.append((fleet.now_s, tuple(s.waiting_requests for s in fleet.instances)))
        self._turn += 1
        return Decision(fleet.ids()[self._turn % len(fleet.ids())], Reason.ROUND_ROBIN)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        pass

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        pass


def _burst() -> list[WorkloadRequest]:
    """40 requests in 2 s on 2 small engines: queues build up and drain."""
    return [
        WorkloadRequest(i, i * 0.05, (Segment(100 + i, 400),), 60, session_id=None)
        for i in range(40)
    ]


def _seen(interval_s: float | None) -> list[tuple[float, tuple[int, ...]]]:
    requests = _burst()
    recorder = _Recorder(interval_s)
    Simulator(SimConfig(2, SPEC), recorder, requests, _keys(requests)).run()
    return recorder.seen


def test_a_polling_strategy_sees_queues_only_as_of_its_polls() -> None:
    live = _seen(None)
    assert max(max(w) for _, w in live) > 0  # the engines do queue
    by_poll: dict[int, set[tuple[int, ...]]] = {}
    for now_s, waiting in _seen(0.5):
        by_poll.setdefault(math.floor(now_s / 0.5), set()).add(waiting)
    assert all(len(figures) == 1 for figures in by_poll.values())  # constant between polls
    assert len({f for figures in by_poll.values() for f in figures}) > 1  # and they move
    # decisions between two polls saw one figure; live, the figures move within a half second
    live_by_poll: dict[int, set[tuple[int, ...]]] = {}
    for now_s, waiting in live:
        live_by_poll.setdefault(math.floor(now_s / 0.5), set()).add(waiting)
    assert any(len(figures) > 1 for figures in live_by_poll.values())


def test_a_poll_longer_than_the_run_sees_only_the_idle_fleet() -> None:
    assert {waiting for _, waiting in _seen(60.0)} == {(0, 0)}


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.01, 2.0),
    st.lists(st.tuples(st.floats(0.0, 1.5), st.integers(0, 9)), min_size=1, max_size=40),
)
def test_polls_always_hold_the_state_of_the_latest_poll_time(
    interval_s: float, changes: list[tuple[float, int]]
) -> None:
    """Whatever the event times: what the polls hold is the engine's state as it was at the
    latest multiple of the interval (events change it only after ``advance`` saw their time)."""
    server = _Fixed()
    polls = EnginePolls(interval_s)
    timeline = [(-1.0, 0)]  # (time of the change, waiting from then on): before any poll
    now_s = 0.0
    for gap_s, waiting in changes:
        now_s += gap_s
        polls.advance(now_s, {"a": server})  # type: ignore[dict-item]
        poll = math.floor(now_s / interval_s)  # the latest poll: at poll * interval_s
        # the state then: the last change made before that time (the events at exactly that
        # time change it after the poll), in poll numbers as ``EnginePolls`` counts them
        expected = [w for at_s, w in timeline if math.floor(at_s / interval_s) < poll][-1]
        assert polls.polled["a"] == (expected, 0.0)
        server.waiting = waiting
        timeline.append((now_s, waiting))
