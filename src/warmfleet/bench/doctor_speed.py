"""How long ``warmfleet doctor`` takes (issue 26: under 60 s for 10,000 requests), measured in
``make bench-doctor`` rather than in a timed unit test (timings on a shared machine are noise).

Two runs of the real command, each a child process timed from start to exit (interpreter start
included, as a user sees it), with ``--target hit_rate=0.99`` so the fleet-sizing search runs too:
a live capture tiled to 10,000 records (each copy shifted past the previous one in time: the same
prompts again, as a day repeats), and the shared Mooncake trace when ``../shared`` is beside the
checkout. ``doctor_speed`` in ``bench-results/doctor.json``: ``capture_records``,
``capture_10k_s``, ``mooncake_s`` (None when the trace is absent) and the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from warmfleet.edge import read_text_file, resolve_traces_dir
from warmfleet.sim.workloads.traces import DEFAULT_TRACES

LIMIT_S = 60.0
RECORDS = 10_000
TIMEOUT_S = 600.0
HEADER_KEY = "warmfleet_trace"


def tile_capture(text: str, records: int) -> str:
    """The capture ``text`` repeated until it has ``records`` records, each copy's timestamps
    shifted past the previous copy's last one (plus the mean gap); the header kept once."""
    header: list[str] = []
    rows: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        document = json.loads(line)
        if HEADER_KEY in document:
            header.append(line)
        else:
            rows.append(document)
    if not rows:
        raise ValueError("the capture has no records to tile")
    times_ms = [float(r["timestamp"]) for r in rows]
    gap_ms = (max(times_ms) - min(times_ms)) / max(1, len(rows) - 1)
    span_ms = max(times_ms) - min(times_ms) + gap_ms
    out = list(header)
    for i in range(records):
        row = dict(rows[i % len(rows)])
        row["timestamp"] = float(row["timestamp"]) + (i // len(rows)) * span_ms
        out.append(json.dumps(row, separators=(",", ":")))
    return "\n".join(out) + "\n"


def time_doctor(trace: Path) -> float:
    """Seconds for ``warmfleet doctor TRACE --target hit_rate=0.99`` as a child process."""
    command = [sys.executable, "-c", "from warmfleet.cli import main; main()", "doctor", str(trace),
               "--target", "hit_rate=0.99", "--format", "json"]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    elapsed_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"doctor {trace}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return elapsed_s


def doctor_speed(capture: Path, work_dir: Path) -> dict[str, Any]:
    """The ``doctor_speed`` section and its failures (key ``failures``)."""
    tiled = work_dir / "capture-10k.jsonl"
    tiled.write_text(tile_capture(read_text_file(capture), RECORDS), encoding="utf-8")
    out: dict[str, Any] = {"limit_s": LIMIT_S, "capture_records": RECORDS}
    out["capture_10k_s"] = time_doctor(tiled)
    mooncake = resolve_traces_dir() / DEFAULT_TRACES["mooncake"]
    out["mooncake_s"] = time_doctor(mooncake) if mooncake.is_file() else None
    failures = [
        f"doctor_speed: {name} {seconds:.1f} s > {LIMIT_S:.0f} s"
        for name in ("capture_10k_s", "mooncake_s")
        if (seconds := out[name]) is not None and seconds > LIMIT_S
    ]
    return {**out, "failures": failures}
