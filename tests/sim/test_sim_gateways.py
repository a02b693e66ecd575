"""N gateway replicas in the simulator: one replica is today's run, synced replicas keep its hit
rate, unsynced ones lose it, and nothing is lost on the way."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.engines import engine_spec
from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.sim.gateways import Gateways, GatewaySync
from warmfleet.sim.runner import (
    StrategyRun,
    prepare,
    prepare_comparison,
    routing_keys,
    run_strategy,
)
from warmfleet.sim.scenario import ScenarioSpec
from warmfleet.sim.simulator import ScaleEvent, SimConfig, SimResult, Simulator
from warmfleet.sim.workloads.base import Segment, WorkloadRequest
from warmfleet.sim.workloads.synthetic import MultiRoundQaConfig, multi_round_qa

SPEC = engine_spec(
    name="sim-test", kv_capacity_tokens=400 * 16, max_model_len=8192,
    prefill_s_per_token=0.0002, prefill_attn_s_per_token_pair=1e-8, decode_s_per_seq=0.001,
    kv_read_s_per_token=1e-7,
)  # fmt: skip

MRQ = MultiRoundQaConfig(
    users=16,
    rounds=5,
    qps=4.0,
    shared_system_prompt_tokens=256,
    user_history_prompt_tokens=1024,
    question_tokens=32,
    answer_tokens=32,
)


def keys_of(requests: list[WorkloadRequest]) -> list[RoutingKey]:
    return routing_keys(prepare(requests, SPEC.block_tokens), DEFAULT_PREFIX_LENGTH)


def _run(sync: GatewaySync | None, strategy: str = "prefix_affinity") -> StrategyRun:
    scenario = ScenarioSpec(name="mrq", workload=MRQ, instances=4, preset="tiny-cpu", seed=0)
    comparison, prepared = prepare_comparison(scenario)
    return run_strategy(
        strategy,
        comparison.scenario,
        comparison.engine,
        comparison.workload,
        prepared,
        gateways=sync,
    )


class Watching:
    """prefix_affinity, recording the in-flight load of every snapshot it chooses from."""

    name = "watching"
    reads_block_hashes = True

    def __init__(self) -> None:
        self.inner = build_strategy(strategy_config("prefix_affinity"), random.Random(0))
        self.seen: list[tuple[tuple[str, int, int], ...]] = []

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        self.seen.append(
            tuple(
                (i.instance_id, i.in_flight_requests, i.in_flight_tokens) for i in fleet.instances
            )
        )
        return self.inner.choose(key, fleet)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.inner.on_routed(key, decision)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.inner.on_instances_changed(instance_ids)


def _true_load(
    result: SimResult, keys: Sequence[RoutingKey], order: Sequence[int], k: int
) -> dict[str, tuple[int, int]]:
    """In-flight requests and tokens per instance when the ``k``-th routed request was
    decided: requests routed before it and not finished by then."""
    now_s = result.records[order[k]].arrival_s
    load: dict[str, tuple[int, int]] = {}
    for j in order[:k]:
        record = result.records[j]
        if record.finish_s > now_s:
            n, t = load.get(record.instance_id, (0, 0))
            tokens = keys[j].prompt_tokens + keys[j].output_tokens_hint
            load[record.instance_id] = (n + 1, t + tokens)
    return load


def test_one_replica_routes_as_a_plain_strategy_on_the_fleets_true_load() -> None:
    requests = list(multi_round_qa(MRQ, seed=0))
    keys = keys_of(requests)
    config = SimConfig(3, SPEC, scale_events=(ScaleEvent(5.0, "add"), ScaleEvent(12.0, "remove")))
    plain, replica = Watching(), Watching()
    plain_result = Simulator(config, plain, requests, keys).run()
    result = Simulator(config, Gateways([replica], sync_delay_s=0.01), requests, keys).run()
    assert result.records == plain_result.records
    assert result.scale_records == plain_result.scale_records
    assert replica.seen == plain.seen
    assert {r.reason for r in result.records} >= {"prefix_hit", "no_match"}
    # every snapshot carried the fleet's true in-flight load
    order = sorted(range(len(requests)), key=lambda i: result.records[i].arrival_s)
    for k, snapshot in enumerate(plain.seen):
        busy = {iid: (n, t) for iid, n, t in snapshot if n}
        assert busy == _true_load(result, keys, order, k)
    assert max(n for snap in plain.seen for _, n, _ in snap) >= 2


def test_synced_replicas_keep_one_replicas_hit_rate_and_unsynced_ones_lose_it() -> None:
    one = _run(None).metrics.hit_rate
    assert _run(GatewaySync(1, None)).metrics.hit_rate == one
    for delay_s in (0.0, 0.001, 0.01):
        synced = _run(GatewaySync(4, delay_s))
        assert synced.conserved
        assert abs(synced.metrics.hit_rate - one) <= 0.02, delay_s
    alone = _run(GatewaySync(4, None))
    assert alone.conserved
    assert alone.metrics.hit_rate < one - 0.10  # each replica starts every moved session cold


def test_turns_of_one_session_reach_several_replicas() -> None:
    requests = list(multi_round_qa(MRQ, seed=0))
    gateways = GatewaySync(4, 0.001).build(
        lambda r: build_strategy(strategy_config("prefix_affinity"), random.Random(r)),
        random.Random(0),
    )
    Simulator(SimConfig(4, SPEC), gateways, requests, keys_of(requests)).run()
    assert sorted(gateways.routed_by) == list(range(len(requests)))
    replicas_per_session: dict[int | None, set[int]] = {}
    for index, replica in gateways.routed_by.items():
        replicas_per_session.setdefault(requests[index].session_id, set()).add(replica)
    assert max(len(s) for s in replicas_per_session.values()) >= 3
    assert set(gateways.routed_by.values()) == {0, 1, 2, 3}


request_st = st.tuples(
    st.floats(0.0, 0.5),  # gap
    st.integers(0, 3),  # shared prefix group
    st.integers(1, 300),  # prefix tokens
    st.integers(1, 100),  # own tokens
    st.integers(1, 40),  # output tokens
    st.one_of(st.none(), st.integers(0, 3)),  # session
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(request_st, min_size=1, max_size=25),
    st.integers(1, 4),
    st.sampled_from([None, 0.0, 0.002, 0.5]),
    st.lists(st.tuples(st.floats(0.0, 5.0), st.sampled_from(["add", "remove"])), max_size=2),
    st.sampled_from(["prefix_affinity", "least_outstanding_requests", "round_robin"]),
)
def test_replicas_conserve_requests_and_end_with_nothing_in_flight(
    raw: list[tuple[float, int, int, int, int, int | None]],
    replicas: int,
    delay_s: float | None,
    scale: list[tuple[float, Literal["add", "remove"]]],
    strategy: str,
) -> None:
    requests: list[WorkloadRequest] = []
    now_s = 0.0
    for index, (gap, group, prefix, own, output, session) in enumerate(raw):
        now_s += gap
        segments = (Segment(1000 + group, prefix), Segment(5000 + index, own))
        requests.append(WorkloadRequest(index, now_s, segments, output, session_id=session))
    events = tuple(ScaleEvent(at, action) for at, action in scale)
    gateways = GatewaySync(replicas, delay_s).build(
        lambda r: build_strategy(strategy_config(strategy), random.Random(r)), random.Random(1)
    )
    config = SimConfig(2, SPEC, scale_events=events, check_invariants=True)
    result = Simulator(config, gateways, requests, keys_of(requests)).run()
    assert result.time_trace_ok
    assert all(r.done for r in result.records)
    assert len(gateways.routed_by) == len(requests)
    for view in gateways.views:  # every note was delivered, every end seen
        assert not any(view.in_flight_requests.values())
        assert not any(view.in_flight_tokens.values())


def test_sync_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="replicas"):
        GatewaySync(0)
    with pytest.raises(ValueError, match="sync_delay_s"):
        GatewaySync(2, -1.0)
    with pytest.raises(ValueError, match=r"random\.Random"):
        Gateways([build_strategy(strategy_config("random"), random.Random(0))] * 2)
