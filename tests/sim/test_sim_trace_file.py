"""`warmfleet sim --trace FILE` alone: warmfleet's trace format replayed on its own fleet (the
header's, flags winning), per-tenant figures, one-line errors; Mooncake files unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from warmfleet.bench import sim_cli
from warmfleet.sim.trace_fleet import trace_header, trace_scenario
from warmfleet.sim.workloads.traces import (
    Trace,
    mooncake,
    parse_trace_text,
    trace_file_requests,
)

app = typer.Typer()
sim_cli.register(app)

HEADER = (
    '{"warmfleet_trace": 1, "block_tokens": 16, "fleet": {"instances": 2, '
    '"preset": "tiny-cpu", "kv_capacity_tokens": 4096}}'
)
RECORDS = [
    '{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3], '
    '"tenant": "a", "session": "s1", "priority": 1}',
    '{"timestamp": 100, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 4], '
    '"tenant": "b", "session": "s1"}',
    '{"timestamp": 200, "input_length": 60, "output_length": 5, "hash_ids": [1, 2, 3, 5], '
    '"tenant": "a", "session": "s1", "priority": 1}',
]
MOONCAKE = [
    '{"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]}',
    '{"timestamp": 3000, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 3]}',
    '{"timestamp": 3000, "input_length": 600, "output_length": 10, "hash_ids": [0, 4]}',
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _sim(args: list[str]) -> tuple[int, str, dict[str, Any]]:
    result = CliRunner().invoke(app, ["sim", *args, "--format", "json"])
    doc = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, result.output, doc


def test_trace_with_header_runs_on_its_fleet_and_reports_tenants(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.jsonl", [HEADER, *RECORDS])
    code, output, doc = _sim(["--trace", str(trace), "--strategies", "random"])
    assert code == 0, output
    assert (doc["instances"], doc["preset"], doc["block_tokens"]) == (2, "tiny-cpu", 16)
    assert doc["instance_kv_capacity_tokens"] == 4096
    code, output, doc = _sim(["--trace", str(trace), "--strategies", "random", "--instances", "1"])
    assert code == 0, output
    assert doc["instances"] == 1  # the flag wins over the header
    tenants = doc["strategies"]["random"]["tenants"]
    assert set(tenants) == {"a", "b"}
    assert (tenants["a"]["requests"], tenants["b"]["requests"]) == (2, 1)
    # one instance: a's second turn finds its first turn's 2 full blocks (32 of 100 tokens);
    # b shares ids 1, 2 with a, but another tenant's blocks are never reused
    assert tenants["a"]["hit_rate"] == 32 / 100
    assert tenants["b"]["hit_rate"] == 0.0
    assert set(tenants["a"]["ttft_ms"]) == {"p50", "p95", "p99"}
    assert tenants["a"]["ttft_ms"]["p50"] > 0


def test_trace_records_carry_tenant_session_priority() -> None:
    parsed = parse_trace_text(Trace("\n".join([HEADER, *RECORDS]), "t"))
    requests = trace_file_requests(parsed, 0)
    assert [r.tenant for r in requests] == ["a", "b", "a"]
    assert [r.priority for r in requests] == [1, None, 1]
    assert requests[0].session_id == requests[2].session_id != requests[1].session_id
    assert [r.arrival_s for r in requests] == [0.0, 0.1, 0.2]
    assert [s.tokens for s in requests[2].segments] == [16, 16, 16, 12]


def test_headerless_trace_is_mooncake_blocks_through_the_same_conversion(tmp_path: Path) -> None:
    trace = Trace("\n".join(MOONCAKE), "m")
    header = trace_header(trace)
    assert header.block_tokens == 512
    via_format = trace_file_requests(parse_trace_text(trace), 3)
    via_mooncake = mooncake(trace, 3, spread_buckets=False)
    assert via_format == via_mooncake
    spec = trace_scenario(trace, header, instances=3)
    assert (spec.instances, spec.preset) == (3, "llama-3.1-70b-p5")
    path = _write(tmp_path / "m.jsonl", MOONCAKE)
    code, output, doc = _sim(["--trace", str(path), "--strategies", "prefix_hash"])
    assert code == 0, output
    assert (doc["block_tokens"], doc["instances"], doc["requests"]) == (512, 8, 3)
    assert "tenants" not in doc["strategies"]["prefix_hash"]


def test_scenario_mooncake_with_trace_still_runs(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", MOONCAKE)
    args = ["--scenario", "mooncake", "--trace", str(path), "--strategies", "random"]
    code, output, doc = _sim(args)
    assert code == 0, output
    assert doc["workload"] == f"trace {path}"
    assert doc["block_tokens"] == 512


def test_unknown_field_is_one_line_naming_the_line(tmp_path: Path) -> None:
    bad = RECORDS[1].replace('"tenant"', '"tennant"')
    path = _write(tmp_path / "bad.jsonl", [HEADER, RECORDS[0], bad])
    result = CliRunner().invoke(app, ["sim", "--trace", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert f"{path}:3: tennant" in lines[0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("timestamp", "true"), ("input_length", '"12"'), ("hash_ids", "[true]"), ("ttft_ms", '"5"')],
)
def test_a_record_number_is_a_json_number(tmp_path: Path, field: str, value: str) -> None:
    """Lax validation took ``true`` as 1 and ``"12"`` as 12."""
    record = json.loads(RECORDS[0])
    record[field] = json.loads(value)
    path = _write(tmp_path / "t.jsonl", [HEADER, json.dumps(record)])
    result = CliRunner().invoke(app, ["sim", "--trace", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}:2: {field}" in result.output


def test_neither_scenario_nor_trace_is_an_error() -> None:
    result = CliRunner().invoke(app, ["sim", "--strategies", "random"])
    assert result.exit_code == 2
    assert "--scenario" in result.output


@pytest.mark.parametrize(
    ("row", "named"),
    [
        ('{"timestamp": Infinity, "input_length": 1, "output_length": 1, "hash_ids": [0]}', ""),
        ('{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": [0]}', "timestamp"),
        ('{"timestamp": 0, "input_length": 1e20, "output_length": 1, "hash_ids": [0]}',
         "input_length"),
        ("[" * 100_000 + "]" * 100_000, ""),
        ('{"timestamp": true, "input_length": 1, "output_length": 1, "hash_ids": [0]}',
         "timestamp"),
        ('{"timestamp": 0, "input_length": "12", "output_length": 1, "hash_ids": [0]}',
         "input_length"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 12.7, "hash_ids": [0]}',
         "output_length"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["0"]}',
         "hash_ids"),
    ],
)  # fmt: skip
def test_a_mooncake_row_out_of_range_is_one_line_naming_the_line(
    tmp_path: Path, row: str, named: str
) -> None:
    """A negative time ran silently; Infinity, 1e20 tokens and deep nesting were a traceback
    or a hang."""
    path = _write(tmp_path / "m.jsonl", [MOONCAKE[0], row])
    args = ["sim", "--scenario", "mooncake", "--trace", str(path), "--strategies", "random"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert f"{path}:2: " in lines[0]
    assert named in lines[0]


def test_requests_the_engine_rejects_are_said_not_left_out_silently(tmp_path: Path) -> None:
    long = '{"timestamp": 10, "input_length": 40000, "output_length": 5, "hash_ids": [9]}'
    path = _write(tmp_path / "long.jsonl", [*MOONCAKE, long])
    args = ["sim", "--scenario", "mooncake", "--trace", str(path), "--strategies", "random"]
    result = CliRunner().invoke(app, [*args, "--preset", "tiny-cpu"])
    assert result.exit_code == 0, result.output
    assert "random: 1 of 4 requests rejected" in " ".join(result.output.split())
