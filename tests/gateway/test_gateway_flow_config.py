"""Flow control (issue 23) runs in the simulator so far: a gateway document that asks for it is
rejected at load with the field named, never accepted and silently ignored."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from gateway_support import gateway_doc
from typer.testing import CliRunner

from warmfleet.gateway import cli as gateway_cli


def test_serve_check_rejects_routing_flow_naming_the_field(tmp_path: Path) -> None:
    app = typer.Typer()
    gateway_cli.register(app)
    doc = gateway_doc([], strategy={"type": "prefix_affinity"})
    variant = doc["spec"]["endpoints"][0]["variants"][0]
    variant["instances"] = [{"id": "a", "url": "http://127.0.0.1:9"}]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert CliRunner().invoke(app, ["--config", str(path), "--check"]).exit_code == 0

    variant["routing"]["flow"] = {"maxInFlightPerInstance": 8}
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    result = CliRunner().invoke(app, ["--config", str(path), "--check"])
    assert result.exit_code == 2
    assert "endpoints.0.variants.0.routing" in result.output
    assert "flow" in result.output
    assert "warmfleet sim --flow" in result.output
