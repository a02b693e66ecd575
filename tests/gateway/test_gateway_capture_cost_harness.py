"""``make bench-capture``'s harness runs (a small run: its figures are not checked, only that
every figure is there and every offered request was written, which the harness checks itself)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.capture_cost import main


def test_the_capture_cost_harness_runs(tmp_path: Path) -> None:
    out = tmp_path / "capture-cost.json"
    argv = ["--out", str(out), "--requests", "200", "--rounds", "1", "--rate", "20000"]
    assert main([*argv, "--dir", str(tmp_path)]) == 0
    figures = json.loads(out.read_text())["capture_cost"]
    assert figures["requests"] == 200
    for name in ("request_path_us", "writer_us", "total_us"):
        assert len(figures[f"{name}_rounds"]) == 1
        assert isinstance(figures[name], float)
