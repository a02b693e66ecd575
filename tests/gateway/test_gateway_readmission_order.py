"""An instance back in a variant's healthy set (health probes, or a passive ejection ending) is
known to the router before flow control's queue drains to it: the variant tells the router of
the new set, then lets the queue go (``VariantRuntime._refresh_healthy``). Regression: the
queue drained first, so the strategy chose and learnt the queued requests against a fleet it had
not been told of (``prefix_affinity`` then kept the cold-start count of those requests for the
instance instead of a newcomer's, and sent every new prefix group there for a while)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from gateway_support import FakeRouter, FakeRouterFactory

from warmfleet.core.types import Decision, FleetSnapshot, RoutingKey
from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.flow import FlowIdentity, GatewayFlow, Ticket
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.outlier import FailureCause
from warmfleet.gateway.variant import RouterFactory, VariantRuntime
from warmfleet.gateway.world import GatewayState
from warmfleet.routing.config import RoutingConfig

FLOW = {
    "maxInFlightPerInstance": 1,
    "maxWaitMs": 60_000,
    "enginePreset": "tiny-cpu",
    "bands": [{"name": "default", "minPriority": -1000}],
}
WHO = FlowIdentity("t", None, None, None)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _gateway(
    ids: str, strategy: str, factory: RouterFactory
) -> tuple[VariantRuntime, GatewayFlow, Clock]:
    instances = [{"id": i, "url": f"http://127.0.0.1:{k + 1}"} for k, i in enumerate(ids)]
    routing = {"strategy": {"type": strategy}, "flow": FLOW}
    variant = {"name": "v", "instances": instances, "routing": routing}
    spec = {
        "health": {"outlier": {"consecutive_failures": 1, "base_ejection_time_s": 10}},
        "endpoints": [{"name": "e", "variants": [variant]}],
    }
    doc = {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}
    clock, metrics = Clock(), GatewayMetrics()
    state = GatewayState(parse_gateway_config(doc), factory, metrics, clock=clock)
    flows = GatewayFlow(state, metrics, clock, lambda _variant: None)
    return state.default_endpoint().variant("v"), flows, clock


def _key(n: int) -> RoutingKey:
    return RoutingKey((n * 1000 + 1, n * 1000 + 2), 16, 32, 32, n * 7919 + 3)


async def _queue(flows: GatewayFlow, variant: VariantRuntime, n: int) -> asyncio.Task[Any]:
    """Request ``n`` waiting in the variant's flow queue."""
    task = asyncio.ensure_future(flows.admit(variant, variant.router, _key(n), WHO))
    await asyncio.sleep(0)
    assert flows.flows[variant].gate.demand() == 1
    return task


def _finish(ticket: object) -> None:
    """What the proxy does when a dispatched request ends."""
    assert isinstance(ticket, Ticket)
    ticket.inst.add_load(-1, -ticket.cost)
    ticket.done()


class _Watcher(FakeRouter):
    """Records, at each decision, the fleet and the instances it was last told of."""

    def __init__(self, config: RoutingConfig, rng: random.Random) -> None:
        super().__init__(config, rng)
        self.told_at_choose: list[tuple[tuple[str, ...], list[str]]] = []

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        told = self.instance_sets[-1] if self.instance_sets else []
        self.told_at_choose.append((fleet.ids(), list(told)))
        return super().choose(key, fleet)


class _Watchers(FakeRouterFactory):
    def __call__(self, config: RoutingConfig, rng: random.Random) -> _Watcher:
        router = _Watcher(config, rng)
        self.routers.append(router)
        return router


def _eject_by_probes(variant: VariantRuntime, _clock: Clock) -> Callable[[], object]:
    inst = variant.instances["a"]
    variant.record_failure(inst, 1, "active")
    return lambda: variant.record_success(inst, 1)  # a good probe readmits it


def _eject_passively(variant: VariantRuntime, clock: Clock) -> Callable[[], object]:
    variant.passive_failure(variant.instances["a"], FailureCause.CONNECT)

    def health_round_after_the_ejection() -> None:
        clock.now_s += 10
        variant.expire_ejections()  # a health round moves it to probation

    return health_round_after_the_ejection


@pytest.mark.parametrize("eject", [_eject_by_probes, _eject_passively])
async def test_the_router_knows_a_readmitted_instance_before_its_queue_drains_to_it(
    eject: Callable[[VariantRuntime, Clock], Callable[[], object]],
) -> None:
    factory = _Watchers()
    variant, flows, clock = _gateway("a", "round_robin", factory)
    readmit = eject(variant, clock)
    router = factory.routers[-1]
    assert isinstance(router, _Watcher)
    assert router.instance_sets[-1] == []
    waiting = await _queue(flows, variant, 1)
    readmit()
    ticket = await asyncio.wait_for(waiting, 1.0)
    assert isinstance(ticket, Ticket)
    assert ticket.decision.instance_id == "a"
    assert router.told_at_choose == [(("a",), ["a"])]  # told of it before choosing it


async def test_prefix_affinity_gives_a_readmitted_instance_a_newcomers_cold_start_count() -> None:
    """``b`` placed 20 new prefix groups while ``a`` was out; ``a`` comes back and takes a
    queued request. The next new groups alternate (``a`` starts a newcomer's deficit behind),
    rather than all going to ``a`` until it has caught up with ``b``'s 20."""
    variant, flows, _ = _gateway("ab", "prefix_affinity", default_router_factory)
    a, b = variant.instances["a"], variant.instances["b"]
    variant.record_failure(a, 1, "active")
    for n in range(20):
        _finish(await flows.admit(variant, variant.router, _key(n), WHO))
    busy = await flows.admit(variant, variant.router, _key(50), WHO)  # b at its cap
    assert isinstance(busy, Ticket)
    assert busy.inst is b
    waiting = await _queue(flows, variant, 51)
    variant.record_success(a, 1)
    drained = await asyncio.wait_for(waiting, 1.0)
    assert isinstance(drained, Ticket)
    assert drained.inst is a
    _finish(drained)
    _finish(busy)
    placed = []
    for n in range(100, 104):
        ticket = await flows.admit(variant, variant.router, _key(n), WHO)
        assert isinstance(ticket, Ticket)
        placed.append(ticket.inst.instance_id)
        _finish(ticket)
    assert sorted(placed) == ["a", "a", "b", "b"], placed
