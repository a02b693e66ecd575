from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from warmfleet.cli import app


def test_render_and_bad_whatif_params(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["fleet", "render", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "crds/inferenceendpoints.warmfleet.dev.yaml").exists()
    assert (tmp_path / "helm/warmfleet/templates/operator.yaml").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("bogus: 1\n")
    result = runner.invoke(
        app, ["fleet", "whatif", "--params", str(bad), "--out", str(tmp_path / "f.json")]
    )
    assert result.exit_code == 2
    assert not (tmp_path / "f.json").exists()


def test_whatif_merges_into_existing_report(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    out.write_text(json.dumps({"other": 1}))
    params = tmp_path / "p.yaml"
    params.write_text(
        "enginePreset: tiny-cpu\npromptTokens: 256\noutputTokens: 32\n"
        "burstDurationS: 120\ncalibrationRequests: 30\n"
    )
    result = CliRunner().invoke(
        app, ["fleet", "whatif", "--params", str(params), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["other"] == 1
    assert set(report["whatif"]["scenarios"]) == {"cold", "weights", "weights+image"}
