"""FlowGate invariants (issue 23): every request answered exactly once (dispatched or shed),
queues bounded, priority order, caps respected, VTC fairness, deadlines answered early."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.errors import BadRequestError
from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.engine.presets import get_preset
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import (
    Dispatch,
    FlowRequest,
    Shed,
    TtftPredictor,
    parse_deadline_ms,
    parse_priority,
    retry_after_s,
)
from warmfleet.routing.flow_config import BandConfig, FlowControlConfig, TenantLimits

SPEC = get_preset("llama-3.1-70b-p5")


def _key(prompt_tokens: int = 1024, output: int = 64, blocks: int = 0) -> RoutingKey:
    return RoutingKey(
        block_hashes=tuple(range(1, blocks + 1)),
        block_size=16,
        units=prompt_tokens,
        prompt_tokens=prompt_tokens,
        prefix_hash=7,
        output_tokens_hint=output,
    )


def _fleet(n: int, now_s: float) -> FleetSnapshot:
    return FleetSnapshot(tuple(InstanceState(f"i{k}") for k in range(n)), now_s)


def _first(key: RoutingKey, fleet: FleetSnapshot) -> Decision:
    """A strategy that always prefers the first instance; i0 holds the prompt's blocks."""
    iid = fleet.instances[0].instance_id
    return Decision(
        iid, Reason.PREFIX_HIT, predicted_cached_blocks=len(key.block_hashes) * (iid == "i0")
    )


def _gate(config: FlowControlConfig) -> FlowGate:
    return FlowGate(config, _first, TtftPredictor(SPEC))


def _config(**kw: object) -> FlowControlConfig:
    base: dict[str, object] = {
        "max_in_flight_per_instance": 2,
        "max_queued_requests": 6,
        "max_queued_per_flow": 4,
        "bands": (BandConfig(name="high", min_priority=1), BandConfig(name="low", min_priority=-5)),
    }
    base.update(kw)
    return FlowControlConfig.model_validate(base)


def _drain(gate: FlowGate, fleet: FleetSnapshot) -> list[Dispatch | Shed]:
    out: list[Dispatch | Shed] = []
    while (outcome := gate.next_outcome(fleet)) is not None:
        out.append(outcome)
    return out


events = st.lists(
    st.tuples(
        st.sampled_from(["submit", "finish", "tick", "cancel"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(min_value=-3, max_value=3),
        st.one_of(st.none(), st.floats(min_value=0.01, max_value=20.0)),
    ),
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(events, st.integers(min_value=0, max_value=3), st.sampled_from(["cost", "never"]))
def test_every_request_is_answered_exactly_once_and_queues_stay_bounded(
    script: list[tuple[str, str, int, float | None]], instances: int, spill: str
) -> None:
    config = _config(spill=spill)
    gate = _gate(config)
    now_s = 0.0
    answered: dict[int, int] = {}
    running: list[int] = []
    cancelled: set[int] = set()
    submitted = 0

    def record(outcome: Dispatch | Shed | None) -> None:
        if outcome is None:
            return
        rid = outcome.request.request_id
        answered[rid] = answered.get(rid, 0) + 1
        if isinstance(outcome, Dispatch):
            running.append(rid)
            assert gate.in_flight(outcome.decision.instance_id) <= config.max_in_flight_per_instance
        else:
            assert outcome.status in (429, 503)
            assert outcome.retry_after_s >= 1

    for action, tenant, priority, deadline_ms in script:
        now_s += 0.5
        fleet = _fleet(instances, now_s)
        if action == "submit":
            deadline_s = None if deadline_ms is None else now_s + deadline_ms
            request = FlowRequest(submitted, _key(), tenant, priority, now_s, deadline_s)
            submitted += 1
            record(gate.submit(request, fleet))
        elif action == "finish" and running:
            rid = running.pop(0)
            gate.on_first_token(rid, now_s)
            gate.on_finished(rid, now_s)
        elif action == "cancel" and gate.queues.entries:  # a queued request's client left
            rid = min(gate.queues.entries)
            assert gate.cancel(rid)
            assert not gate.cancel(rid)
            cancelled.add(rid)
        for outcome in _drain(gate, fleet):
            record(outcome)
        assert gate.demand() <= config.max_queued_requests
        assert all(n <= config.max_queued_per_flow for n in gate.queues.flow_depths().values())
    # the run ends: replicas come and every request finishes; the rest must come out
    for step in range(10_000):
        now_s += 1.0
        fleet = _fleet(max(instances, 1), now_s)
        while running:
            rid = running.pop()
            gate.on_finished(rid, now_s)
        for outcome in _drain(gate, fleet):
            record(outcome)
        if gate.demand() == 0:
            break
        assert step < 9_999
    assert sorted([*answered, *cancelled]) == list(range(submitted))
    assert set(answered.values()) <= {1}
    assert gate.cancelled == len(cancelled)


def test_cancel_takes_a_queued_request_out_and_nothing_else() -> None:
    gate = _gate(_config(max_in_flight_per_instance=1))
    fleet = _fleet(1, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    assert gate.submit(FlowRequest(1, _key(), "a", 0, 0.0, deadline_s=50.0), fleet) is None
    assert gate.submit(FlowRequest(2, _key(), "b", 0, 0.0), fleet) is None
    assert not gate.cancel(0)  # dispatched: its end comes through on_finished
    assert gate.cancel(1)
    assert gate.demand() == 1
    assert gate.queue_depths() == {("low", "other"): 1}
    assert not gate.cancel(1)
    gate.on_finished(0, 1.0)
    out = gate.next_outcome(_fleet(1, 1.0))
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 2
    assert gate.next_outcome(_fleet(1, 60.0)) is None  # 1's deadline is gone with it
    assert gate.next_deadline_s() is None
    assert gate.cancelled == 1


def test_high_band_is_dispatched_before_low_band() -> None:
    gate = _gate(_config(max_queued_requests=10))
    fleet = _fleet(1, 0.0)
    first = [gate.submit(FlowRequest(i, _key(), "a", 0, 0.0), fleet) for i in range(2)]
    assert all(isinstance(o, Dispatch) for o in first)
    assert gate.submit(FlowRequest(2, _key(), "a", -1, 0.0), fleet) is None
    assert gate.submit(FlowRequest(3, _key(), "b", 2, 0.1), fleet) is None
    gate.on_finished(0, 1.0)
    out = gate.next_outcome(_fleet(1, 1.0))
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 3
    assert out.decision.reason is Reason.QUEUED


def test_full_queue_sheds_the_lowest_band_first() -> None:
    gate = _gate(_config(max_queued_requests=2))
    fleet = _fleet(1, 0.0)
    for i in range(2):
        assert isinstance(gate.submit(FlowRequest(i, _key(), "a", 0, 0.0), fleet), Dispatch)
    assert gate.submit(FlowRequest(2, _key(), "a", -2, 0.0), fleet) is None
    assert gate.submit(FlowRequest(3, _key(), "a", -2, 0.0), fleet) is None
    shed = gate.submit(FlowRequest(4, _key(), "b", 2, 0.0), fleet)
    assert isinstance(shed, Shed)
    assert shed.request.request_id == 3
    assert shed.reason is Reason.SHED
    assert shed.status == 429
    low = gate.submit(FlowRequest(5, _key(), "c", -2, 0.0), fleet)
    assert isinstance(low, Shed)
    assert low.request.request_id == 5


def test_backlogged_tenants_share_by_tokens_not_by_arrival() -> None:
    """Tenant a floods the queue first; b's requests still get every other slot (VTC)."""
    gate = _gate(
        _config(max_in_flight_per_instance=1, max_queued_requests=100, max_queued_per_flow=100)
    )
    fleet = _fleet(1, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    for i in range(1, 21):
        gate.submit(FlowRequest(i, _key(), "a", 0, 0.0), fleet)
    for i in range(21, 31):
        gate.submit(FlowRequest(i, _key(), "b", 0, 0.0), fleet)
    order: list[str] = []
    rid = 0
    for step in range(20):
        gate.on_finished(rid, float(step + 1))
        out = gate.next_outcome(_fleet(1, float(step + 1)))
        assert isinstance(out, Dispatch)
        order.append(out.request.tenant)
        rid = out.request.request_id
    assert order.count("b") == 10  # b got half the slots while backlogged
    assert "b" in order[:2]


def test_unmeetable_deadline_is_answered_at_once_with_429() -> None:
    gate = _gate(_config(max_in_flight_per_instance=1))
    fleet = _fleet(1, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    gate.service_s = 10.0
    out = gate.submit(FlowRequest(1, _key(32_000), "a", 0, 0.0, deadline_s=0.05), fleet)
    assert isinstance(out, Shed)
    assert out.reason is Reason.DEADLINE
    assert out.status == 429
    assert out.waited_s == 0.0


def test_queued_request_is_shed_before_its_deadline_passes() -> None:
    gate = _gate(_config(max_in_flight_per_instance=1))
    fleet = _fleet(1, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    gate.service_s = 0.01
    assert gate.submit(FlowRequest(1, _key(4096), "a", 0, 0.0, deadline_s=2.0), fleet) is None
    due_s = gate.next_deadline_s()
    assert due_s is not None
    assert due_s < 2.0
    out = gate.next_outcome(_fleet(1, due_s))
    assert isinstance(out, Shed)
    assert out.reason is Reason.DEADLINE


def test_zero_ready_replicas_hold_then_dispatch_or_503() -> None:
    gate = _gate(_config(max_wait_ms=5_000))
    assert gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), _fleet(0, 0.0)) is None
    assert gate.submit(FlowRequest(1, _key(), "a", 0, 0.0), _fleet(0, 0.0)) is None
    assert gate.demand() == 2
    out = gate.next_outcome(_fleet(1, 1.0))
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 0
    gate2 = _gate(_config(max_wait_ms=5_000))
    assert gate2.submit(FlowRequest(0, _key(), "a", 0, 0.0), _fleet(0, 0.0)) is None
    assert gate2.next_outcome(_fleet(0, 4.9)) is None
    shed = gate2.next_outcome(_fleet(0, 5.0))
    assert isinstance(shed, Shed)
    assert shed.status == 503


def test_tenant_concurrency_limit_holds_its_requests() -> None:
    config = _config(
        max_in_flight_per_instance=8, tenants={"a": TenantLimits(max_concurrent_requests=1)}
    )
    gate = _gate(config)
    fleet = _fleet(1, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    assert gate.submit(FlowRequest(1, _key(), "a", 0, 0.0), fleet) is None
    assert gate.submit(FlowRequest(2, _key(), "b", 0, 0.0), fleet) is None
    out = gate.next_outcome(fleet)  # b starts at once, past a's held request
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 2
    assert out.decision.reason is Reason.PREFIX_HIT  # it did not wait
    assert gate.next_outcome(fleet) is None
    gate.on_finished(0, 1.0)
    out = gate.next_outcome(_fleet(1, 1.0))
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 1


def test_spill_is_chosen_when_waiting_costs_more() -> None:
    gate = _gate(_config(max_in_flight_per_instance=1))
    fleet = _fleet(2, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    gate.service_s = 100.0  # waiting for i0 is hopeless: spill to i1
    out = gate.submit(FlowRequest(1, _key(2048, blocks=100), "a", 0, 0.0), fleet)
    assert isinstance(out, Dispatch)
    assert out.decision.instance_id == "i1"
    assert out.decision.spilled
    gate.service_s = 1e-4  # waiting is nearly free: wait for the warm instance
    assert gate.submit(FlowRequest(2, _key(2048, blocks=100), "a", 0, 0.0), _fleet(3, 0.0)) is None


def test_predictor_calibrates_towards_observed() -> None:
    predictor = TtftPredictor(SPEC)
    raw = predictor.predict_s(0.1, 0.0, 0)
    for _ in range(200):
        predictor.observe(predictor.predict_s(0.1, 0.0, 0), 2 * raw)
    assert predictor.predict_s(0.1, 0.0, 0) == pytest.approx(2 * raw, rel=0.05)


@pytest.mark.parametrize(("wait_s", "expected"), [(0.0, 1), (2.2, 3), (1e9, 60)])
def test_retry_after_bounds(wait_s: float, expected: int) -> None:
    assert retry_after_s(wait_s) == expected


def test_config_rejects_duplicate_bands_and_unknown_keys() -> None:
    with pytest.raises(ValueError, match="distinct"):
        FlowControlConfig.model_validate(
            {"bands": [{"name": "a", "minPriority": 0}, {"name": "a", "minPriority": 1}]}
        )
    with pytest.raises(ValueError, match="maxQueue"):
        FlowControlConfig.model_validate({"maxQueue": 3})
    cfg = FlowControlConfig.model_validate(
        {"maxInFlightPerInstance": 3, "tenants": {"t": {"weight": 2}}}
    )
    assert cfg.max_in_flight_per_instance == 3
    assert cfg.tenants["t"].weight == 2


def test_pending_prefill_budget_holds_a_second_long_prompt_but_not_a_short_one() -> None:
    gate = _gate(_config(max_in_flight_per_instance=8, max_pending_prefill_ms=150, spill="never"))
    fleet = _fleet(1, 0.0)
    long_key = _key(3000)  # ~0.13 s of prefill on this engine
    assert isinstance(gate.submit(FlowRequest(0, long_key, "a", 0, 0.0), fleet), Dispatch)
    assert gate.submit(FlowRequest(1, long_key, "a", 0, 0.0), fleet) is None  # would pass 150 ms
    short = gate.submit(FlowRequest(2, _key(64), "b", 0, 0.0), fleet)
    assert short is None
    out = gate.next_outcome(fleet)  # the short one fits beside the pending long prefill
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 2
    gate.on_first_token(0, 0.2)
    gate.on_first_token(2, 0.2)
    out = gate.next_outcome(_fleet(1, 0.2))
    assert isinstance(out, Dispatch)
    assert out.request.request_id == 1


def test_spill_always_goes_elsewhere_at_once_when_the_choice_is_full() -> None:
    gate = _gate(_config(max_in_flight_per_instance=1, spill="always"))
    fleet = _fleet(2, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    gate.service_s = 1e-6  # waiting would be cheap; "always" spills anyway
    out = gate.submit(FlowRequest(1, _key(2048, blocks=100), "a", 0, 0.0), fleet)
    assert isinstance(out, Dispatch)
    assert out.decision.instance_id == "i1"
    assert out.decision.spilled


def test_expected_wait_counts_requests_already_waiting_for_the_instance() -> None:
    """Requests that chose to wait for i0 (by cost) make the next one's expected wait longer."""
    gate = _gate(_config(max_in_flight_per_instance=1, max_queued_requests=10))
    fleet = _fleet(2, 0.0)
    assert isinstance(gate.submit(FlowRequest(0, _key(), "a", 0, 0.0), fleet), Dispatch)
    gate.service_s = 10.0
    alone_s = gate.expected_wait_s("i0", 0.0)  # one service time / cap
    gate.service_s = 1e-3  # waiting for the warm i0 is cheaper than a cold prefill on i1
    for rid, tenant in ((1, "a"), (2, "b"), (3, "c")):  # three flows: three heads
        request = FlowRequest(rid, _key(2048, blocks=100), tenant, 0, 0.0)
        assert gate.submit(request, fleet) is None
        assert gate.next_outcome(fleet) is None
    assert gate.queues.waiting_for == {"i0": 3}
    gate.service_s = 10.0
    assert gate.expected_wait_s("i0", 0.0) == pytest.approx(4 * alone_s)
    gate.service_s = 1e-3
    gate.on_finished(0, 1.0)
    assert isinstance(gate.next_outcome(_fleet(2, 1.0)), Dispatch)
    assert gate.queues.waiting_for == {"i0": 2}


@pytest.mark.parametrize(("raw", "expected"), [("3", 3), (" -2 ", -2), (7, 7), ("-1000", -1000)])
def test_priority_parses_integers_in_range(raw: str | int, expected: int) -> None:
    assert parse_priority(raw) == expected


@pytest.mark.parametrize(
    "raw", ["high", "1.5", "", "1001", True, 5000, "+5", "1_0", "0x10", "- 1", "--1", "\u0665"]
)
def test_priority_rejects_anything_else_naming_the_param(raw: str | int) -> None:
    with pytest.raises(BadRequestError, match="x-warmfleet-priority") as info:
        parse_priority(raw)
    assert info.value.param == "x-warmfleet-priority"


def test_deadline_header_parses_and_rejects() -> None:
    assert parse_deadline_ms(" 250 ") == 250.0
    assert parse_deadline_ms("12.5") == 12.5
    for raw in ("0", "-5", "nan", "inf", "soon", "3600001", "+5", "1_000", "1e3", ".5", "5."):
        with pytest.raises(BadRequestError, match="x-warmfleet-deadline-ms"):
            parse_deadline_ms(raw)
