"""A capture's placements replayed (sim.placements, the simulator's ``placements``): captured
names to simulator instances, every request where it went live, the strategy choosing the
rest, and the doctor's and the calibration's captured replay by placements."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.api.trace_format import (
    TraceFile,
    TraceFleet,
    TraceHeader,
    TraceRecord,
    header_line,
    parse_trace,
    record_line,
)
from warmfleet.core.types import Reason
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.strategies.simple import RandomStrategy
from warmfleet.sim.calibration import ReplayFleet, replay_capture
from warmfleet.sim.placements import captured_placements, instance_names
from warmfleet.sim.runner import prepare, routing_keys
from warmfleet.sim.simulator import SimConfig, Simulator
from warmfleet.sim.workloads.traces import trace_file_requests

BT = 16
SPEC = EngineSpec(
    name="placements-test",
    block_tokens=BT,
    kv_capacity_tokens=64 * BT,
    max_num_seqs=4,
    max_num_batched_tokens=256,
    max_model_len=8192,
    step_overhead_s=0.01,
    prefill_s_per_token=0.0002,
    prefill_attn_s_per_token_pair=1e-8,
    decode_s_per_seq=0.001,
    kv_read_s_per_token=1e-7,
)


def record(at_ms: float, instance: str | None, ids: Sequence[int] = (1, 2)) -> TraceRecord:
    return TraceRecord(timestamp=at_ms, input_length=len(ids) * BT + 3, output_length=2,
                       hash_ids=tuple(ids), instance=instance)  # fmt: skip


def test_names_map_by_first_appearance_then_joins_in_order() -> None:
    records = [record(5, "b"), record(1, "a"), record(9, "c"), record(70_000, "late"),
               record(90_000, "later"), record(2, None)]  # fmt: skip
    joins = {"later": 90.0, "late": 70.0}
    names = instance_names(records, 2, joins)
    # a (1 ms) and b (5 ms) were there first; c is beyond a 2-instance replay; joins follow
    assert names == {"a": "i0", "b": "i1", "late": "i2", "later": "i3"}
    assert instance_names(records, 4, {})["c"] == "i2"
    assert instance_names([record(0, None)], 2, {}) == {}


def test_placements_follow_the_requests_order_and_none_without_instances() -> None:
    records = (record(20, "x"), record(10, "y"), record(30, None))
    parsed = TraceFile(TraceHeader(block_tokens=BT), records, True)
    requests = trace_file_requests(parsed, seed=0)  # sorted by arrival: y, x, none
    assert [r.request_id for r in requests] == [1, 0, 2]
    assert captured_placements(records, requests, 2, {}) == {0: "i0", 1: "i1"}
    bare = tuple(record(t, None) for t in (0, 1))
    assert captured_placements(bare, trace_file_requests(
        TraceFile(TraceHeader(block_tokens=BT), bare, True), 0), 2, {}) is None  # fmt: skip


def simulate(parsed: TraceFile, instances: int, seed: int) -> tuple[list[str], list[str]]:
    """The records' instances and reasons after a replay of ``parsed``'s placements behind a
    random strategy (in the order of the trace's records)."""
    requests = trace_file_requests(parsed, seed=0)
    prepared = prepare(requests, BT)
    keys = routing_keys(prepared, 64)
    placements = captured_placements(parsed.records, requests, instances, {})
    config = SimConfig(instances=instances, engine=SPEC)
    strategy = RandomStrategy(random.Random(seed))
    result = Simulator(config, strategy, requests, keys, placements=placements).run()
    by_record: dict[int, tuple[str, str]] = {}
    for req, rec in zip(requests, result.records, strict=True):
        by_record[req.request_id] = (str(rec.instance_id), str(rec.reason))
    ordered = [by_record[i] for i in range(len(requests))]
    return [i for i, _ in ordered], [r for _, r in ordered]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 20_000),  # arrival ms
            st.integers(0, 3),  # captured instance (of 4 names)
            st.integers(0, 5),  # prefix group
            st.integers(1, 6),  # blocks
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 2**16),
)
def test_a_replay_on_the_captured_fleet_sends_every_request_where_it_went(
    rows: list[tuple[int, int, int, int]], seed: int
) -> None:
    names = ["vllm-a", "vllm-b", "10.0.0.7:8000", "emu-3"]
    records = tuple(
        record(at_ms, names[inst], [group * 100 + b for b in range(blocks)])
        for at_ms, inst, group, blocks in rows
    )
    parsed = TraceFile(TraceHeader(block_tokens=BT), records, True)
    used = {r.instance for r in records}
    mapping = instance_names(records, len(used), {})
    back = {sim: name for name, sim in mapping.items()}
    instances, reasons = simulate(parsed, len(used), seed)
    assert [back[i] for i in instances] == [r.instance for r in records]
    assert set(reasons) == {str(Reason.REPLAYED)}


def test_requests_without_a_placement_are_the_strategys() -> None:
    records = tuple(record(i * 100.0, "a" if i % 2 else None) for i in range(20))
    parsed = TraceFile(TraceHeader(block_tokens=BT), records, True)
    instances, reasons = simulate(parsed, 3, seed=1)
    for rec, inst, reason in zip(records, instances, reasons, strict=True):
        if rec.instance == "a":
            assert (inst, reason) == ("i0", str(Reason.REPLAYED))
        else:
            assert reason == str(Reason.RANDOM)
    assert len(set(instances)) > 1  # the strategy's own choices spread


def random_capture(seed: int, requests: int = 60) -> str:
    """A ``random`` capture on 2 instances: 6 prefix groups, each request placed at random."""
    rng = random.Random(seed)
    fleet = TraceFleet(instances=2, strategy={"type": "random"})
    lines = [header_line(TraceHeader(block_tokens=BT, fleet=fleet))]
    for i in range(requests):
        group = rng.randrange(6)
        ids = [group * 100 + b for b in range(4)] + [10_000 + i]
        lines.append(record_line(record(i * 400.0, rng.choice(["g0", "g1"]), ids)))
    return "\n".join(lines) + "\n"


def expected_hit_rate(text: str) -> float:
    """What the engines hold when every request goes where the capture says (KV never full):
    a request finds the leading blocks its instance has seen."""
    parsed = parse_trace(text.splitlines())
    seen: dict[str, set[int]] = {}
    hit = prompt = 0
    for rec in parsed.records:
        held = seen.setdefault(rec.instance or "", set())
        for block in rec.hash_ids[:-1]:  # the request's own tail block never repeats
            if block not in held:
                break
            hit += BT
        held.update(rec.hash_ids)
        prompt += rec.input_length
    return hit / prompt


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_calibration_replays_a_random_capture_by_its_placements(seed: int) -> None:
    text = random_capture(seed)
    fleet = ReplayFleet(instances=2, preset="tiny-cpu", kv_capacity_tokens=1 << 16,
                        block_tokens=BT)  # fmt: skip
    replay = replay_capture(text, "capture-random.jsonl", fleet)
    assert replay.replay == "placements"
    assert replay.placed_requests == 60
    assert replay.hit_rate == pytest.approx(expected_hit_rate(text), abs=1e-9)
    assert replay.fresh_draw is not None  # the fresh draw, beside it
