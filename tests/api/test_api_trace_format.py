"""The trace format (api.trace_format): Mooncake lines load unchanged, a header carries the
block size and the fleet, errors name the line and the field, records round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.api.trace_format import (
    MOONCAKE_BLOCK_TOKENS,
    TraceFleet,
    TraceHeader,
    TraceRecord,
    header_line,
    parse_trace,
    record_line,
)
from warmfleet.core.errors import ConfigError

MOONCAKE = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def test_mooncake_lines_load_with_the_default_block_size() -> None:
    lines = [
        '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}',
        "",
        '{"timestamp": 27, "input_length": 700, "output_length": 5, "hash_ids": [0, 14]}',
    ]
    trace = parse_trace(lines, "m.jsonl")
    assert not trace.has_header
    assert trace.header.block_tokens == MOONCAKE_BLOCK_TOKENS
    assert [r.hash_ids for r in trace.records] == [(0, 1, 2), (0, 14)]
    assert trace.records[1].timestamp == 27
    assert trace.records[0].tenant is None


def test_the_shared_mooncake_trace_loads_unchanged() -> None:
    path = MOONCAKE / "mooncake_conversation_first30min.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    trace = parse_trace(path.read_text(encoding="utf-8").splitlines(), str(path))
    assert len(trace.records) > 1000


def test_a_header_carries_the_block_size_and_the_fleet() -> None:
    header = TraceHeader(
        block_tokens=16,
        fleet=TraceFleet(instances=4, kv_capacity_tokens=8192, strategy={"type": "random"}),
    )
    record = TraceRecord(
        timestamp=1.5, input_length=40, output_length=8, hash_ids=(7, 9), tenant="t-3f2a",
        session="s-91", priority=-1, deadline_ms=500, instance="emu-1", reason="prefix_hit",
        predicted_cached_tokens=16, engine_cached_tokens=16, ttft_ms=12.5, e2e_ms=30.0,
        status=200,
    )  # fmt: skip
    trace = parse_trace([header_line(header), record_line(record)])
    assert trace.has_header
    assert trace.header == header
    assert trace.records == (record,)


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        (['{"timestamp": 0, "input_length": 1, "output_length": 1, "prompt": "x"}'], "t:1: prompt"),
        (["", '{"timestamp": -1, "input_length": 1, "output_length": 1}'], "t:2: timestamp"),
        (['{"timestamp": 0, "input_length": 1}'], "t:1: output_length"),
        (["not json"], "t:1: not JSON"),
        (["[1, 2]"], "t:1: a record is a JSON object"),
        (
            ['{"timestamp": 0, "input_length": 1, "output_length": 1}', '{"warmfleet_trace": 1}'],
            "t:2: the header must be the first line",
        ),
        (['{"warmfleet_trace": 2}'], "t:1: warmfleet_trace"),
        (['{"warmfleet_trace": 1, "fleet": {"gpus": 8}}'], "t:1: fleet.gpus"),
        (['{"timestamp": Infinity, "input_length": 1, "output_length": 1}'], "t:1: timestamp"),
        (['{"timestamp": 0, "input_length": 1e20, "output_length": 1}'], "t:1: input_length"),
        (
            ['{"timestamp": 0, "input_length": 1, "output_length": 1, "deadline_ms": NaN}'],
            "t:1: deadline_ms",
        ),
        (['{"warmfleet_trace": 1, "fleet": {"instances": 100000000}}'], "t:1: fleet.instances"),
        (['{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"], "t:1: not a record: JSON nested"),
    ],
)
def test_errors_name_the_line_and_the_field(lines: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        parse_trace(lines, "t")


_records = st.builds(
    TraceRecord,
    timestamp=st.floats(min_value=0, max_value=1e9, allow_nan=False),
    input_length=st.integers(0, 1 << 20),
    output_length=st.integers(0, 1 << 16),
    hash_ids=st.lists(st.integers(0, (1 << 63) - 1), max_size=8).map(tuple),
    tenant=st.none() | st.text(max_size=20),
    priority=st.none() | st.integers(-10, 10),
    status=st.none() | st.integers(100, 599),
)


@settings(max_examples=50)
@given(st.lists(_records, max_size=5))
def test_records_round_trip(records: list[TraceRecord]) -> None:
    lines = [record_line(r) for r in records]
    assert all("\n" not in line for line in lines)
    assert parse_trace(lines).records == tuple(records)
