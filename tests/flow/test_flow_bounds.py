"""Flow control's memory and limits under hostile or merely many-named traffic: tenant states
and VTC counters stay bounded (a tenant name per conversation), a tenant's bucket goes into
debt by a minute's worth at most, and withdrawn requests do not pile up in the deadline heap."""

from __future__ import annotations

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.engine.presets import get_preset
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import Dispatch, FlowRequest, TtftPredictor
from warmfleet.flow.queue import MAX_COUNTERS
from warmfleet.flow.tenants import MAX_TENANTS
from warmfleet.routing.flow_config import FlowControlConfig, TenantLimits

ONE = FleetSnapshot((InstanceState("a"),), 0.0)


def _choose(key: RoutingKey, fleet: FleetSnapshot) -> Decision:
    return Decision(fleet.instances[0].instance_id, Reason.LOAD_BALANCE)


def _gate(**config: object) -> FlowGate:
    predictor = TtftPredictor(get_preset("llama-3.1-8b-h100"))
    return FlowGate(FlowControlConfig.model_validate(config), _choose, predictor)


def _key(prompt: int = 100, output: int = 0) -> RoutingKey:
    return RoutingKey((), 16, 0, prompt, 1, output)


def _at(now_s: float, fleet: FleetSnapshot = ONE) -> FleetSnapshot:
    return FleetSnapshot(fleet.instances, now_s)


def test_tenant_states_of_finished_tenants_are_forgotten() -> None:
    gate = _gate(default_tenant=TenantLimits(max_concurrent_requests=4))
    for n in range(3 * MAX_TENANTS):
        now_s = n * 1e-3
        assert isinstance(
            gate.submit(FlowRequest(n, _key(), f"t{n}", 0, now_s), _at(now_s)), Dispatch
        )
        gate.on_finished(n, now_s)
    assert len(gate._tenants) <= MAX_TENANTS
    assert len(gate.queues.counters) <= MAX_COUNTERS + 1


def test_a_huge_output_hint_costs_a_tenant_a_minute_at_most() -> None:
    tpm = 2_000_000
    gate = _gate(tenants={"chat": TenantLimits(tokens_per_minute=tpm)})
    first = gate.submit(FlowRequest(0, _key(100, 1 << 32), "chat", 0, 0.0), _at(0.0))
    assert isinstance(first, Dispatch)
    gate.on_finished(0, 0.1)  # refused at once by the engine: nothing comes back
    state = gate._tenants.get("chat")
    assert state is not None
    assert state.bucket_tokens == -tpm
    assert gate.submit(FlowRequest(1, _key(), "chat", 0, 60.0), _at(60.0)) is None  # still owed
    gate.cancel(1)
    later = gate.submit(FlowRequest(2, _key(), "chat", 0, 121.0), _at(121.0))
    assert isinstance(later, Dispatch)


def _saturated(gate: FlowGate) -> None:
    n = 0
    while isinstance(gate.submit(FlowRequest(n, _key(), "x", 0, 0.0), ONE), Dispatch):
        n += 1
    gate.cancel(n)


def test_withdrawn_requests_do_not_pile_up_in_the_deadline_heap() -> None:
    gate = _gate(max_queued_requests=10, max_queued_per_flow=10, max_wait_ms=30_000)
    _saturated(gate)
    for n in range(1000, 21_000):
        now_s = 1.0 + n * 1e-5
        assert gate.submit(FlowRequest(n, _key(), "y", 0, now_s), _at(now_s)) is None
        assert gate.cancel(n)
    assert gate.demand() == 0
    assert len(gate.queues._deadlines) <= 64 + 1


def test_counters_stay_bounded_while_nothing_dispatches() -> None:
    """A fleet at its caps or scaled to zero: requests of new tenants queue and leave."""
    gate = _gate(max_queued_requests=10, max_queued_per_flow=10)
    _saturated(gate)
    empty = FleetSnapshot((), 1.0)
    for n in range(1000, 1000 + 3 * MAX_COUNTERS):
        assert gate.submit(FlowRequest(n, _key(), f"h{n}", 0, 1.0), empty) is None
        gate.cancel(n)
    assert len(gate.queues.counters) <= MAX_COUNTERS + 1
