"""The kernel's fleet extension points: instances a controller starts join at their ready time,
requests wait when nothing is ready, ticks stop at ``until_s``, and a ``SlotServer`` serves with
fixed slots and service time (what the scale-out what-if runs on)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from warmfleet.core.types import RoutingKey
from warmfleet.engine.presets import get_preset
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.sim.fleet import FleetView, Join
from warmfleet.sim.servers import ReplicaModel, SlotServer
from warmfleet.sim.simulator import SimConfig, Simulator
from warmfleet.sim.workloads.base import Segment, WorkloadRequest

SPEC = get_preset("tiny-cpu")


@dataclass
class Scripted:
    """Controller double: at tick ``n`` starts ``plan[n]`` (ready delays); records its views."""

    plan: dict[int, tuple[float, ...]]
    period_s: float = 1.0
    until_s: float = 100.0
    views: list[FleetView] = field(default_factory=list)

    def tick(self, fleet: FleetView) -> list[Join]:
        delays = self.plan.get(len(self.views), ())
        self.views.append(fleet)
        return [Join(d, f"r{len(self.views)}-{n}") for n, d in enumerate(delays)]


def _requests(times: Sequence[float]) -> tuple[list[WorkloadRequest], list[RoutingKey]]:
    requests = [WorkloadRequest(i, t, (Segment(i, 64),), 8) for i, t in enumerate(times)]
    keys = [RoutingKey((), SPEC.block_tokens, 64, 64, i, 8) for i in range(len(times))]
    return requests, keys


def _slots(slots: int, service_s: float, ttft_s: float) -> SlotServer:
    return SlotServer(ReplicaModel(slots, slots / service_s, (ttft_s,)), random.Random(0))


def test_started_instance_takes_traffic_only_from_its_ready_time() -> None:
    controller = Scripted({0: (0.0, 10.0)}, until_s=5.0)
    requests, keys = _requests([0.5 + 0.5 * i for i in range(40)])
    sim = Simulator(
        SimConfig(instances=0, engine=SPEC, router_overhead_s=0.0),
        build_strategy(strategy_config("round_robin"), random.Random(0)),
        requests,
        keys,
        controller=controller,
    )
    result = sim.run()
    late = {j.instance_id: j for j in result.joins}["i1"]
    assert (late.started_s, late.ready_s) == (0.0, 10.0)
    routed = [(r.arrival_s, r.instance_id) for r in result.records]
    assert all(i == "i0" for t, i in routed if t < 10.0)
    assert {i for t, i in routed if t >= 10.0} == {"i0", "i1"}  # round robin over both
    assert [(s.at_s, s.after_ids) for s in result.scale_records] == [
        (0.0, ("i0",)),
        (10.0, ("i0", "i1")),
    ]
    assert [v.now_s for v in controller.views] == [0.0, 1.0, 2.0, 3.0, 4.0]  # stop at until_s
    assert controller.views[1].replicas == 2
    assert controller.views[1].ready == 1
    assert all(r.done for r in result.records)


def test_requests_wait_in_order_while_no_instance_is_ready() -> None:
    controller = Scripted({0: (5.0,)}, until_s=3.0)
    requests, keys = _requests([1.5, 2.5, 2.7])
    result = Simulator(
        SimConfig(instances=0, engine=SPEC, router_overhead_s=0.0),
        build_strategy(strategy_config("least_outstanding_requests"), random.Random(0)),
        requests,
        keys,
        servers=lambda: _slots(1, 4.0, 0.5),
        controller=controller,
    ).run()
    # the views count the waiting requests as in flight
    assert [v.in_flight_requests for v in controller.views] == [0, 0, 1]
    records = result.records
    assert [r.arrival_s for r in records] == [1.5, 2.5, 2.7]  # the wait counts in the TTFT
    assert [r.first_token_s for r in records] == [5.5, 9.5, 13.5]  # FIFO, one slot
    assert [r.finish_s for r in records] == [9.0, 13.0, 17.0]
    assert {r.instance_id for r in records} == {"i0"}


def test_slot_server_serves_slots_at_once_and_queues_the_rest() -> None:
    requests, keys = _requests([0.0, 0.0, 0.0])
    result = Simulator(
        SimConfig(instances=1, engine=SPEC, router_overhead_s=0.0, check_invariants=True),
        build_strategy(strategy_config("least_outstanding_requests"), random.Random(0)),
        requests,
        keys,
        servers=lambda: _slots(2, 10.0, 0.5),
    ).run()
    assert [r.first_token_s for r in result.records] == [0.5, 0.5, 10.5]
    assert [r.finish_s for r in result.records] == [10.0, 10.0, 20.0]
    assert result.joins == []


def test_a_run_needs_an_instance_or_a_controller() -> None:
    requests, keys = _requests([0.0])
    with pytest.raises(ValueError, match="no instance"):
        Simulator(
            SimConfig(instances=0, engine=SPEC),
            build_strategy(strategy_config("random"), random.Random(0)),
            requests,
            keys,
        )
