"""Simulator: conservation, monotonic time, sessions, closed loop, scale events, determinism."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator, Sequence
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.bench.report import report_json_bytes
from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.engine.model import EngineModel
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.keys import key_from_blocks
from warmfleet.sim.metrics import compute_metrics, ideal_hit_tokens, lru_hit_tokens
from warmfleet.sim.runner import prepare, run_comparison
from warmfleet.sim.scenario import ScenarioSpec
from warmfleet.sim.simulator import RequestRecord, ScaleEvent, SimConfig, Simulator
from warmfleet.sim.workloads.arrivals import ClosedLoopArrival, PoissonArrival
from warmfleet.sim.workloads.base import Segment, WorkloadRequest
from warmfleet.sim.workloads.synthetic import GspConfig, MultiRoundQaConfig, multi_round_qa

BT = 16
SPEC = EngineSpec(
    name="sim-test",
    block_tokens=BT,
    kv_capacity_tokens=200 * BT,
    max_num_seqs=8,
    max_num_batched_tokens=256,
    max_model_len=8192,
    step_overhead_s=0.01,
    prefill_s_per_token=0.0002,
    prefill_attn_s_per_token_pair=1e-8,
    decode_s_per_seq=0.001,
    kv_read_s_per_token=1e-7,
)


class HashDouble:
    """Test double: first block's hash picks the instance; records what it was told."""

    name = "hash-double"
    reads_block_hashes = True

    def __init__(self, block: int = 0) -> None:
        self.block = block  # which block's hash picks the instance
        self.instance_sets: list[tuple[InstanceId, ...]] = []
        self.max_in_flight = 0
        self.routed_to: list[InstanceId] = []

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        ids = fleet.ids()
        assert ids
        self.max_in_flight = max(
            self.max_in_flight, sum(i.in_flight_requests for i in fleet.instances)
        )
        assert all(i.kv_capacity_blocks == SPEC.capacity_blocks for i in fleet.instances)
        slot = (key.block_hashes[self.block] if key.block_hashes else key.prefix_hash) % len(ids)
        return Decision(ids[slot], Reason.HASH)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.routed_to.append(decision.instance_id)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.instance_sets.append(tuple(instance_ids))


def _keys(requests: Sequence[WorkloadRequest]) -> list[RoutingKey]:
    prepared = prepare(requests, BT)
    return [
        key_from_blocks(
            hashes,
            block_size=BT,
            units=r.prompt_tokens,
            prompt_tokens=r.prompt_tokens,
            prefix_length=1024,
            seed=prepared.chain_seed,
            output_tokens_hint=r.output_tokens,
        )
        for r, hashes in zip(requests, prepared.block_hashes, strict=True)
    ]


request_st = st.tuples(
    st.floats(0.0, 1.0),  # gap
    st.integers(0, 3),  # shared prefix group
    st.integers(1, 300),  # prefix tokens
    st.integers(1, 100),  # own tokens
    st.integers(1, 40),  # output tokens
    st.one_of(st.none(), st.integers(0, 3)),  # session
)


def _workload(raw: list[tuple[float, int, int, int, int, int | None]]) -> list[WorkloadRequest]:
    out = []
    now_s = 0.0
    for index, (gap, group, prefix, own, output, session) in enumerate(raw):
        now_s += gap
        segments = (Segment(1000 + group, prefix), Segment(5000 + index, own))
        out.append(WorkloadRequest(index, now_s, segments, output, session_id=session))
    return out


scale_st = st.lists(st.tuples(st.floats(0.0, 5.0), st.sampled_from(["add", "remove"])), max_size=3)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(request_st, min_size=1, max_size=25),
    st.integers(1, 4),
    scale_st,
    st.one_of(st.none(), st.integers(1, 4)),
)
def test_requests_are_conserved_and_time_is_monotonic(
    raw: list[tuple[float, int, int, int, int, int | None]],
    instances: int,
    scale: list[tuple[float, Literal["add", "remove"]]],
    concurrency: int | None,
) -> None:
    requests = _workload(raw)
    events = tuple(ScaleEvent(at, action) for at, action in scale)
    config = SimConfig(
        instances, SPEC, concurrency=concurrency, scale_events=events, check_invariants=True
    )
    double = HashDouble()
    result = Simulator(config, double, requests, _keys(requests)).run()
    assert result.time_trace_ok
    assert all(r.done for r in result.records)  # completed at the end, none lost
    assert len(double.routed_to) == len(requests)  # each routed exactly once
    for record in result.records:
        assert record.arrival_s <= record.first_token_s <= record.finish_s
        assert 0 <= record.cached_tokens < record.prompt_tokens
        assert record.captured_tokens <= record.available_tokens
        assert record.instance_id in result.instance_ids
    if concurrency is not None:
        assert double.max_in_flight < concurrency
    # turns of one session never overlap
    by_session: dict[int, list[RequestRecord]] = {}
    for req, record in zip(requests, result.records, strict=True):
        if req.session_id is not None:
            by_session.setdefault(req.session_id, []).append(record)
    for records in by_session.values():
        records.sort(key=lambda r: r.arrival_s)
        for before, after in itertools.pairwise(records):
            assert after.arrival_s >= before.finish_s
    metrics = compute_metrics(result, _keys(requests), BT, SPEC.capacity_blocks * instances)
    assert metrics.completed + metrics.rejected == len(requests)


def test_removed_instance_drains_and_gets_no_new_requests() -> None:
    requests = [
        WorkloadRequest(i, i * 0.05, (Segment(i % 4, 64), Segment(100 + i, 16)), 30)
        for i in range(80)
    ]
    keys = _keys(requests)
    events = (ScaleEvent(1.0, "remove", "i1"), ScaleEvent(2.0, "add"))
    double = HashDouble(block=-1)
    result = Simulator(SimConfig(3, SPEC, scale_events=events), double, requests, keys).run()
    assert double.instance_sets == [("i0", "i1", "i2"), ("i0", "i2"), ("i0", "i2", "i3")]
    assert all(r.done for r in result.records)
    for record in result.records:
        if record.instance_id == "i1":
            assert record.arrival_s <= 1.0
        if record.instance_id == "i3":
            assert record.arrival_s >= 2.0
    assert any(r.instance_id == "i3" for r in result.records)
    assert [(s.before_ids, s.after_ids) for s in result.scale_records] == [
        (("i0", "i1", "i2"), ("i0", "i2")),
        (("i0", "i2"), ("i0", "i2", "i3")),
    ]


def test_prefix_routing_beats_no_affinity_in_delivered_hits() -> None:
    requests = [
        WorkloadRequest(i, i * 0.02, (Segment(i % 5, 400), Segment(100 + i, 16)), 8)
        for i in range(200)
    ]
    keys = _keys(requests)
    result = Simulator(SimConfig(4, SPEC), HashDouble(), requests, keys).run()
    metrics = compute_metrics(result, keys, BT, SPEC.capacity_blocks * 4)
    assert metrics.hit_rate > 0.8
    assert metrics.reuse["ideal"] >= metrics.hit_rate
    assert metrics.reuse["captured"] <= metrics.reuse["available"]


def test_ideal_and_lru_ceiling() -> None:
    keys = [
        RoutingKey((1, 2, 3), BT, 48, 48, 0),
        RoutingKey((1, 2, 4), BT, 48, 48, 0),
        RoutingKey((5, 6), BT, 32, 32, 0),
        RoutingKey((1, 2, 3), BT, 48, 48, 0),
    ]
    order = [0, 1, 2, 3]
    assert ideal_hit_tokens(keys, order, BT) == (2 + 3) * BT
    # a 4-block LRU: after key 2 (5, 6) the chain 1, 2, 3 lost its deepest blocks first
    assert lru_hit_tokens(keys, order, BT, 4) == 2 * BT + 2 * BT
    assert lru_hit_tokens(keys, order, BT, 100) == (2 + 3) * BT


def _gsp_scenario(seed: int) -> ScenarioSpec:
    return ScenarioSpec(
        name="gsp-small",
        workload=GspConfig(groups=6, prompts_per_group=5, system_prompt_tokens=300),
        arrival=PoissonArrival(rate_rps=5.0),
        instances=3,
        preset="tiny-cpu",
        seed=seed,
        scale_events=({"at_s": 2.0, "action": "add"},),
    )


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10_000))
def test_same_seed_gives_identical_report_bytes(seed: int) -> None:
    names = ["random", "prefix_affinity"]
    first = report_json_bytes(run_comparison(_gsp_scenario(seed), names).report())
    second = report_json_bytes(run_comparison(_gsp_scenario(seed), names).report())
    other = report_json_bytes(run_comparison(_gsp_scenario(seed + 1), names).report())
    assert first == second
    assert first != other


def test_report_has_the_documented_fields() -> None:
    comparison = run_comparison(_gsp_scenario(0), ["prefix_hash"], check_invariants=True)
    report = comparison.report()
    for key in ("scenario", "preset", "seed", "instances", "working_set_ratio"):
        assert key in report
    run = report["strategies"]["prefix_hash"]  # type: ignore[index]
    assert set(run["ttft_ms"]) == {"p50", "p90", "p95", "p99"}
    assert set(run["e2e_ms"]) == {"p50", "p90", "p95", "p99"}
    assert set(run["reuse"]) == {"available", "captured", "delivered", "ideal", "fleet_ceiling"}
    assert {"min", "max"} <= set(run["share"])
    for key in (
        "throughput_rps",
        "output_tokens_per_s",
        "hit_rate",
        "spills",
        "decisions_by_reason",
    ):
        assert key in run
    assert len(run["moved_fraction"]) == 1
    assert 0.0 <= run["moved_fraction"][0] <= 1.0
    assert comparison.runs[0].conserved
    assert comparison.runs[0].time_monotonic


def test_closed_loop_saturation_mode_runs_every_request() -> None:
    scenario = _gsp_scenario(1).model_copy(
        update={"arrival": ClosedLoopArrival(concurrency=16), "scale_events": ()}
    )
    comparison = run_comparison(scenario, ["least_outstanding_requests"])
    run = comparison.runs[0]
    assert run.conserved
    assert run.metrics.completed == 30
    assert run.metrics.throughput_rps > 0


def test_next_turn_reuses_the_previous_answer() -> None:
    config = MultiRoundQaConfig(
        users=1,
        rounds=2,
        shared_system_prompt_tokens=32,
        user_history_prompt_tokens=32,
        question_tokens=16,
        answer_tokens=32,
    )
    requests = list(multi_round_qa(config, seed=0))
    keys = _keys(requests)
    result = Simulator(SimConfig(1, SPEC), HashDouble(), requests, keys).run()
    # turn 2 = turn 1 (80 tokens) + answer (32) + question (16): 7 of its 8 blocks were cached
    assert result.output_block_hashes[0] == keys[1].block_hashes[5:7]
    assert result.records[1].cached_tokens == 7 * BT
    metrics = compute_metrics(result, keys, BT, SPEC.capacity_blocks)
    assert metrics.reuse["ideal"] == (7 * BT) / (80 + 128)


@pytest.fixture
def no_cycle_collection() -> Iterator[None]:
    """The cyclic collector off: what is freed is freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_cycle_collection")
def test_a_finished_run_leaves_no_engine_behind() -> None:
    """A run's engines (their KV block pools) go as soon as the run's objects do: a reference
    cycle through the simulator kept every run's engines until the cyclic collector ran, and
    ``warmfleet doctor``'s 8-17 runs piled up."""
    requests = [WorkloadRequest(i, i * 0.02, (Segment(i % 3, 64),), 4) for i in range(20)]
    result = Simulator(SimConfig(3, SPEC), HashDouble(), requests, _keys(requests)).run()
    assert all(r.done for r in result.records)
    assert not [o for o in gc.get_objects() if isinstance(o, EngineModel)]
