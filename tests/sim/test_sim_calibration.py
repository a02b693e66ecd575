"""doctor's calibration (sim.calibration): a capture replayed on a given fleet shape, the row of
``bench-results/doctor.json`` and the targets it is held to."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from warmfleet.api.trace_format import TraceFleet, TraceHeader, header_line, record_line
from warmfleet.core.errors import ConfigError
from warmfleet.engine.presets import get_preset
from warmfleet.sim.calibration import (
    TIME_FIELDS,
    LiveFigures,
    ReplayFigures,
    ReplayFleet,
    calibration_row,
    capture_ttft_p50_ms,
    engine_overrides,
    replay_capture,
    row_failures,
)
from warmfleet.sim.scenario import ScenarioSpec

ROW_FIELDS = {
    "live_hit_rate",
    "replay_hit_rate",
    "hit_rate_abs_error",
    "live_ttft_p50_ms",
    "replay_ttft_p50_ms",
    "ttft_p50_ratio",
    "capture_lines",
    "requests_answered",
    "capture_dropped",
}


def live(hit_rate: float = 0.5, ttft_ms: float = 100.0, lines: int = 10) -> LiveFigures:
    return LiveFigures(hit_rate, ttft_ms, requests_answered=10, capture_lines=lines,
                       capture_dropped=0)  # fmt: skip


def test_the_row_has_the_issues_fields_and_its_error_math() -> None:
    row = calibration_row(live(0.5, 100.0), ReplayFigures("random", 10, 0.47, 120.0))
    assert set(row) >= ROW_FIELDS
    assert row["replayed_as"] == "random"
    assert row["hit_rate_abs_error"] == pytest.approx(0.03)
    assert row["ttft_p50_ratio"] == pytest.approx(1.2)  # replay / live
    below = calibration_row(live(0.5, 100.0), ReplayFigures("random", 10, 0.55, 80.0))
    assert below["hit_rate_abs_error"] == pytest.approx(0.05)  # absolute, either way
    assert below["ttft_p50_ratio"] == pytest.approx(0.8)


def test_the_row_sets_the_placements_replay_beside_the_fresh_draw() -> None:
    replay = ReplayFigures("random", 10, 0.48, 100.0, "placements", 10, (0.30, 90.0))
    row = calibration_row(live(0.5, 100.0), replay)
    assert (row["replay"], row["replay_placed_requests"]) == ("placements", 10)
    assert row["hit_rate_abs_error"] == pytest.approx(0.02)  # the placements' (asserted)
    assert row["replay_hit_rate_fresh_draw"] == pytest.approx(0.30)
    assert row["hit_rate_abs_error_fresh_draw"] == pytest.approx(0.20)  # reported
    assert row["replay_ttft_p50_ms_fresh_draw"] == pytest.approx(90.0)


def test_row_failures_name_each_missed_target() -> None:
    good = calibration_row(live(0.5, 100.0), ReplayFigures("random", 10, 0.52, 110.0))
    assert row_failures("random", good) == []
    bad = calibration_row(live(0.5, 100.0, lines=9), ReplayFigures("random", 9, 0.6, 140.0))
    bad["capture_dropped"] = 1
    failures = row_failures("random", bad)
    assert len(failures) == 4
    assert [f.split(" ")[1] for f in failures] == [
        "hit_rate_abs_error",
        "ttft_p50_ratio",
        "capture_lines",
        "capture_dropped",
    ]
    assert row_failures("random", bad, 0.2, None)[0].startswith("random: capture_lines")


def test_engine_overrides_run_the_preset_speedup_times_faster() -> None:
    preset = get_preset("tiny-cpu")
    engine = engine_overrides(ReplayFleet(4, "tiny-cpu", 4096, speedup=2.0))
    assert engine.kv_capacity_tokens == 4096
    assert engine.block_tokens is None  # the capture header's
    for name in TIME_FIELDS:
        assert getattr(engine, name) == pytest.approx(getattr(preset, name) / 2.0), name
    with pytest.raises(ConfigError, match="speedup"):
        engine_overrides(ReplayFleet(4, "tiny-cpu", 4096, speedup=0.0))


def capture_text(ids_of: Sequence[tuple[int, ...]], strategy: str | None = "random") -> str:
    """A capture: 16-token blocks, one record a second (no overlap), 72 prompt tokens each."""
    fleet = TraceFleet(instances=1, strategy=None if strategy is None else {"type": strategy})
    lines = [header_line(TraceHeader(block_tokens=16, fleet=fleet))]
    for i, ids in enumerate(ids_of):
        record = {"timestamp": i * 1000.0, "input_length": 72, "output_length": 2,
                  "hash_ids": list(ids), "instance": "emu-0"}  # fmt: skip
        lines.append(record_line(record))
    return "\n".join(lines) + "\n"


FLEET = ReplayFleet(instances=1, preset="tiny-cpu", kv_capacity_tokens=65_536, block_tokens=16)


def test_a_shared_prefix_replays_as_hits_and_unique_prompts_as_none() -> None:
    shared = replay_capture(capture_text([(1, 2, 3, 4)] * 20), "shared.jsonl", FLEET)
    assert shared.strategy == "random"
    assert shared.requests == 20
    # the first request misses; each later one finds the 4 shared blocks (64 of 72 tokens)
    assert shared.hit_rate == pytest.approx(19 * 64 / (20 * 72))
    assert shared.ttft_p50_ms > 0
    unique = [(4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4) for i in range(20)]
    assert replay_capture(capture_text(unique), "unique.jsonl", FLEET).hit_rate == 0.0


def test_a_faster_fleet_replays_a_lower_ttft() -> None:
    text = capture_text([(1, 2, 3, 4)] * 5)
    slow = replay_capture(text, "c.jsonl", FLEET)
    fast = replay_capture(text, "c.jsonl", ReplayFleet(1, "tiny-cpu", 65_536, 16, speedup=4.0))
    # the engine's times run 4x faster; the router's overhead (wall clock, like the gateway's)
    # does not scale with the emulator's speed-up
    router_ms = float(ScenarioSpec.model_fields["router_overhead_ms"].default)
    expected_ms = (slow.ttft_p50_ms - router_ms) / 4.0 + router_ms
    assert fast.ttft_p50_ms == pytest.approx(expected_ms, rel=0.05)
    assert fast.ttft_p50_ms < slow.ttft_p50_ms / 2.0


def test_the_live_ttft_is_the_captures_own_over_answered_requests() -> None:
    fleet = TraceFleet(instances=1, strategy={"type": "random"})
    lines = [header_line(TraceHeader(block_tokens=16, fleet=fleet))]
    answered = [(10.0, 200), (30.0, 200), (20.0, 200), (500.0, 503), (None, 200)]
    for i, (ttft_ms, status) in enumerate(answered):
        record = {"timestamp": i * 1000.0, "input_length": 16, "output_length": 1,
                  "hash_ids": [i], "ttft_ms": ttft_ms, "status": status}  # fmt: skip
        lines.append(record_line(record))
    assert capture_ttft_p50_ms("\n".join(lines), "c.jsonl") == pytest.approx(20.0)
    with pytest.raises(ConfigError, match="ttft_ms"):
        capture_ttft_p50_ms("\n".join(lines[:1] + lines[4:]), "c.jsonl")


def test_a_capture_without_a_strategy_or_records_is_refused() -> None:
    with pytest.raises(ConfigError, match="no strategy"):
        replay_capture(capture_text([(1,)] * 3, strategy=None), "c.jsonl", FLEET)
    with pytest.raises(ConfigError, match="no records"):
        replay_capture(capture_text([]), "c.jsonl", FLEET)
