"""bench/doctor_speed: the capture tiled to N records, and the real `warmfleet doctor` timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.doctor_captures import capture_lines, write_capture
from warmfleet.api.trace_format import parse_trace
from warmfleet.bench import doctor_speed


def test_a_tiled_capture_has_n_records_in_time_order_and_one_header() -> None:
    text = "\n".join(capture_lines(7)) + "\n"
    tiled = doctor_speed.tile_capture(text, 30)
    parsed = parse_trace(tiled.splitlines())
    assert len(parsed.records) == 30
    times = [r.timestamp for r in parsed.records]
    assert times == sorted(times)
    assert len(set(times)) == 30  # each copy starts after the previous one ends
    first = [r.hash_ids for r in parsed.records[:7]]
    assert [r.hash_ids for r in parsed.records[7:14]] == first  # the same prompts again
    assert sum(1 for line in tiled.splitlines() if "warmfleet_trace" in line) == 1
    with pytest.raises(ValueError, match="no records"):
        doctor_speed.tile_capture(text.splitlines()[0], 5)


@pytest.mark.slow
def test_doctor_speed_times_the_real_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = tmp_path / "capture.jsonl"
    write_capture(capture, capture_lines(20))
    monkeypatch.setattr(doctor_speed, "RECORDS", 60)
    monkeypatch.setattr(doctor_speed, "resolve_traces_dir", lambda: tmp_path / "absent")
    out = doctor_speed.doctor_speed(capture, tmp_path)
    assert out["capture_records"] == 60
    assert 0.0 < out["capture_10k_s"] < doctor_speed.TIMEOUT_S
    assert out["mooncake_s"] is None
    assert out["failures"] == []
    monkeypatch.setattr(doctor_speed, "LIMIT_S", 0.0)
    slow = doctor_speed.doctor_speed(capture, tmp_path)
    assert slow["failures"] == [f"doctor_speed: capture_10k_s {slow['capture_10k_s']:.1f} s > 0 s"]
    json.dumps(out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(RuntimeError, match="exit 2"):
        doctor_speed.time_doctor(bad)
