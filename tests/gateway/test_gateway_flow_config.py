"""``routing.flow`` in a gateway document: accepted (the gateway drives the flow gate), and an
unknown ``enginePreset`` or key rejected at load with the field named."""

from __future__ import annotations

import re
from pathlib import Path

import typer
import yaml
from gateway_support import gateway_doc
from typer.testing import CliRunner

from warmfleet.gateway import cli as gateway_cli
from warmfleet.gateway.cli import check_config
from warmfleet.gateway.config import load_gateway_config


def test_serve_check_accepts_routing_flow_and_names_a_bad_field(tmp_path: Path) -> None:
    app = typer.Typer()
    gateway_cli.register(app)
    doc = gateway_doc([], strategy={"type": "prefix_affinity"})
    variant = doc["spec"]["endpoints"][0]["variants"][0]
    variant["instances"] = [{"id": "a", "url": "http://127.0.0.1:9"}]
    path = tmp_path / "gateway.yaml"

    def check() -> tuple[int, str]:
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        result = CliRunner().invoke(app, ["--config", str(path), "--check"])
        return result.exit_code, result.output

    variant["routing"]["flow"] = {"maxInFlightPerInstance": 8, "enginePreset": "tiny-cpu"}
    assert check()[0] == 0

    variant["routing"]["flow"]["enginePreset"] = "gpt-9"
    code, output = check()
    assert code == 2
    assert "spec.endpoints.0.variants.0.routing.flow.enginePreset" in output
    assert "tiny-cpu" in output  # the choices are named

    variant["routing"]["flow"] = {"maxInFlightPerInstanse": 8}
    code, output = check()
    assert code == 2
    assert "maxInFlightPerInstanse" in output


def test_the_worked_example_of_docs_flow_control_loads(tmp_path: Path) -> None:
    """The live example in docs/flow-control.md is a gateway document ``serve --check`` takes,
    with the bands and tenants it describes."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "flow-control.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    (doc,) = [yaml.safe_load(b) for b in blocks if "kind: Gateway" in b]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    check_config(path)
    flow = load_gateway_config(path).spec.endpoints[0].variants[0].routing.flow
    assert flow is not None
    assert [b.name for b in flow.bands] == ["interactive", "sheddable"]
    assert flow.tenants["batch"].default_priority == -1
    assert flow.engine_preset == "llama-3.1-8b-h100"
