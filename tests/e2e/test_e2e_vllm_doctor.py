"""The real-vLLM e2e's doctor calibration (vllm_harness.doctor) on a small synthetic capture: the
replay on the e2e's fleet shape, the ``doctor`` rows and their check. The real run is
``make e2e-vllm`` (test_e2e_vllm.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_harness.doctor import (
    CAPTURED,
    MAX_HIT_RATE_ABS_ERROR,
    calibrate,
    calibrate_run,
    capture_path,
    doctor_failures,
    replay_fleet,
)
from vllm_harness.engines import KV_CACHE_BLOCKS, EngineSpec
from vllm_harness.gateways import BLOCK_SIZE, gateway_document
from vllm_harness.workloads import shared_document

from warmfleet.api.trace_format import TraceFleet, TraceHeader, header_line, record_line


def write_capture(path: Path, documents: int, questions: int) -> int:
    """A capture as the e2e's gateway writes it: ``documents`` prompts of 5 blocks, each sent
    ``questions`` times in a row (each time with a 3-block question of its own), 2 instances,
    ``prefix_affinity``. Returns the records written."""
    strategy = {"type": "prefix_affinity", "useExactIndex": False}
    fleet = TraceFleet(instances=2, strategy=strategy)
    lines = [header_line(TraceHeader(block_tokens=BLOCK_SIZE, fleet=fleet))]
    for n in range(documents * questions):
        document = n // questions
        ids = [1000 * document + b for b in range(5)] + [10**6 + 10 * n + q for q in range(3)]
        record = {"timestamp": n * 500.0, "input_length": 8 * BLOCK_SIZE + 7,
                  "output_length": 2, "hash_ids": ids}  # fmt: skip
        lines.append(record_line(record))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return documents * questions


def test_only_the_single_gateway_random_and_approximate_runs_capture(tmp_path: Path) -> None:
    assert capture_path(tmp_path, "random", "default") == tmp_path / "capture-random.jsonl"
    assert capture_path(tmp_path, "prefix_affinity", "approximate") is not None
    assert capture_path(tmp_path, "prefix_affinity", "exact") is None
    assert sorted(CAPTURED.values()) == ["prefix_affinity", "random"]
    fleet = replay_fleet(2)
    assert (fleet.kv_capacity_tokens, fleet.block_tokens) == (KV_CACHE_BLOCKS * 128, 128)


def test_the_gateway_document_turns_capture_on(tmp_path: Path) -> None:
    engines = [EngineSpec("vllm-0", 1, 0)]
    path = str(tmp_path / "c.jsonl")
    on = gateway_document({"type": "random"}, engines, 0, tokenizer_path="t",
                          kv_events_endpoint=None, capture_path=path)  # fmt: skip
    off = gateway_document({"type": "random"}, engines, 0, tokenizer_path="t",
                           kv_events_endpoint=None)  # fmt: skip
    assert on["spec"]["capture"] == {"path": path}
    assert "capture" not in off["spec"]


def test_the_replay_of_a_capture_gives_its_reuse(tmp_path: Path) -> None:
    capture = tmp_path / "capture-prefix_affinity.jsonl"
    sent = write_capture(capture, documents=6, questions=4)
    # each document's later questions find its 5 blocks on the instance it stuck to
    expected = (6 * 3 * 5 * BLOCK_SIZE) / (sent * (8 * BLOCK_SIZE + 7))
    row = calibrate(capture, expected, instances=2, sent=sent)
    assert row["replayed_as"] == "prefix_affinity (captured)"  # useExactIndex off: its own run
    assert row["replay_hit_rate"] == pytest.approx(expected, abs=1e-4)
    assert row["hit_rate_abs_error"] <= 1e-4
    assert row["capture_lines"] == row["requests_sent"] == 24
    assert doctor_failures({"prefix_affinity": row, "random": row}) == []


def test_calibrate_run_records_only_captured_runs(tmp_path: Path) -> None:
    capture = tmp_path / "capture-prefix_affinity.jsonl"
    write_capture(capture, documents=2, questions=2)
    doctor: dict[str, Any] = {}
    workloads = [shared_document(0, documents=1, questions=4)]
    calibrate_run(doctor, "prefix_affinity", None, {"hit_rate": 0.5}, [1, 2], workloads)
    assert doctor == {}
    calibrate_run(doctor, "prefix_affinity", capture, {"hit_rate": 0.5}, [1, 2], workloads)
    assert doctor["prefix_affinity"]["requests_sent"] == 4
    assert doctor["prefix_affinity"]["capture_lines"] == 4


def test_doctor_failures_name_a_large_error_a_short_capture_and_a_missing_run() -> None:
    good = {"live_hit_rate": 0.5, "replay_hit_rate": 0.52, "hit_rate_abs_error": 0.02,
            "capture_lines": 10, "requests_sent": 10}  # fmt: skip
    assert doctor_failures({"random": good, "prefix_affinity": good}) == []
    far = {**good, "hit_rate_abs_error": MAX_HIT_RATE_ABS_ERROR + 0.01, "capture_lines": 9}
    failures = doctor_failures({"prefix_affinity": far})
    assert len(failures) == 3
    assert failures[0] == "doctor.random: no calibration recorded"
    assert failures[1].startswith("doctor.prefix_affinity: replay hit rate")
    assert "error" in failures[1]
    assert "9 capture lines for 10 requests" in failures[2]
    # random's error is asserted too: its replay sends each request where it went live
    failures = doctor_failures({"random": far, "prefix_affinity": good})
    assert [f.split(":")[0] for f in failures] == ["doctor.random", "doctor.random"]
    assert "replay hit rate" in failures[0]
